// Charts as PNG files (cairo): line charts in panels stacked one above the other, and horizontal
// bar charts. Each has a title, axes with round-number ticks, a grid, units in the axis labels and
// a legend, so a plot reads at a glance. Plots of a run (train/plots.h) are made of these.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace titan::train {

struct ChartSeries {
  std::string label;
  std::vector<double> x, y;  // equal lengths; a non-finite y breaks the line there
  int color = -1;            // palette index; -1: the series' position in its panel
  bool dashed = false;
};

struct ChartPanel {
  std::string title, x_label, y_label;
  std::vector<ChartSeries> series;
};

// One PNG: `title` over the panels, each a line chart (its own y range, a shared style).
void draw_line_charts(const std::filesystem::path& png, const std::string& title, const std::vector<ChartPanel>& panels);

struct BarChart {
  std::string title, value_label;  // value_label: the axis under the bars, with its unit
  std::vector<std::string> labels;
  std::vector<double> values;      // one per label, >= 0
  std::vector<int> group;          // optional, one per label: bars of another group get another colour
};

// One PNG of horizontal bars, the largest first as given, each labelled and with its value.
void draw_bar_chart(const std::filesystem::path& png, const BarChart& chart);

// Round-number ticks covering [lo, hi] (about `target` of them): the axis runs from the first to
// the last.
std::vector<double> nice_ticks(double lo, double hi, int target = 5);

}  // namespace titan::train
