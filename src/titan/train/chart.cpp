#include "titan/train/chart.h"

#include <cairo.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numbers>

#include "titan/core/error.h"

namespace titan::train {

namespace fs = std::filesystem;

namespace {

constexpr int kWidth = 1100;
constexpr double kPalette[][3] = {{0.12, 0.47, 0.71}, {1.00, 0.50, 0.05}, {0.17, 0.63, 0.17}, {0.84, 0.15, 0.16},
                                  {0.58, 0.40, 0.74}, {0.55, 0.34, 0.29}, {0.89, 0.47, 0.76}, {0.50, 0.50, 0.50},
                                  {0.74, 0.74, 0.13}, {0.09, 0.75, 0.81}};
constexpr int kColors = sizeof kPalette / sizeof kPalette[0];

// A cairo image surface and its context, written out as PNG once drawn.
class Canvas {
 public:
  Canvas(int width, int height)
      : surface_(cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height), cairo_surface_destroy),
        cr_(cairo_create(surface_.get()), cairo_destroy) {
    cairo_set_source_rgb(cr(), 1, 1, 1);
    cairo_paint(cr());
    cairo_select_font_face(cr(), "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  }
  cairo_t* cr() const { return cr_.get(); }

  void save(const fs::path& png) const {
    std::error_code ec;
    if (png.has_parent_path()) fs::create_directories(png.parent_path(), ec);
    cairo_surface_flush(surface_.get());
    const cairo_status_t status = cairo_surface_write_to_png(surface_.get(), png.c_str());
    TITAN_CHECK(status == CAIRO_STATUS_SUCCESS,
                "cannot write the plot " + png.string() + ": " + cairo_status_to_string(status),
                "check that the run folder is writable and has space");
  }

  enum class Align { left, center, right };
  // Text with its baseline at y, aligned on x; `vertical` turns it to read upwards.
  void text(const std::string& s, double x, double y, double size, Align align = Align::left, bool bold = false,
            bool vertical = false) const {
    cairo_save(cr());
    cairo_select_font_face(cr(), "sans-serif", CAIRO_FONT_SLANT_NORMAL,
                           bold ? CAIRO_FONT_WEIGHT_BOLD : CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_font_size(cr(), size);
    cairo_text_extents_t e;
    cairo_text_extents(cr(), s.c_str(), &e);
    const double shift = align == Align::left ? 0 : align == Align::center ? e.x_advance / 2 : e.x_advance;
    cairo_translate(cr(), x, y);
    if (vertical) cairo_rotate(cr(), -std::numbers::pi / 2);
    cairo_move_to(cr(), -shift, 0);
    cairo_show_text(cr(), s.c_str());
    cairo_restore(cr());
  }

  void line(double x0, double y0, double x1, double y1, double gray, double width) const {
    cairo_set_source_rgb(cr(), gray, gray, gray);
    cairo_set_line_width(cr(), width);
    cairo_move_to(cr(), x0, y0);
    cairo_line_to(cr(), x1, y1);
    cairo_stroke(cr());
  }

  void color(int i) const {
    const double* c = kPalette[i % kColors];
    cairo_set_source_rgb(cr(), c[0], c[1], c[2]);
  }

 private:
  std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)> surface_;
  std::unique_ptr<cairo_t, decltype(&cairo_destroy)> cr_;
};

// Tick labels in the precision the tick step needs, large values with k / M / G.
std::string tick_label(double v, double step, double largest) {
  double scale = 1;
  const char* suffix = "";
  if (largest >= 1e9) scale = 1e9, suffix = "G";
  else if (largest >= 1e6) scale = 1e6, suffix = "M";
  else if (largest >= 1e4) scale = 1e3, suffix = "k";
  else if (largest > 0 && largest < 1e-2) scale = std::pow(10.0, std::floor(std::log10(largest)));
  std::string exponent;
  if (scale < 1) exponent = "e" + std::to_string(int(std::lround(std::log10(scale))));
  const int decimals = std::clamp(int(-std::floor(std::log10(step / scale) + 1e-9)), 0, 8);
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f%s", decimals, std::fabs(v) < step * 1e-9 ? 0.0 : v / scale, suffix);
  return std::fabs(v) < step * 1e-9 ? std::string("0") : buf + exponent;
}

std::string shorten(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n - 1) + "~"; }

struct Range {
  double lo = INFINITY, hi = -INFINITY;
  void add(double v) {
    if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  bool empty() const { return lo > hi; }
};

struct Axis {
  std::vector<double> ticks;
  double lo = 0, hi = 1, step = 1, largest = 1;
  explicit Axis(Range r) {
    if (r.empty()) r = {0, 1};
    if (r.lo == r.hi) {
      const double pad = r.lo == 0 ? 1 : std::fabs(r.lo) * 0.05;
      r.lo -= pad, r.hi += pad;
    }
    ticks = nice_ticks(r.lo, r.hi);
    lo = ticks.front(), hi = ticks.back();
    step = ticks.size() > 1 ? ticks[1] - ticks[0] : 1;
    largest = std::max(std::fabs(lo), std::fabs(hi));
  }
  double at(double v, double p0, double p1) const { return p0 + (v - lo) / (hi - lo) * (p1 - p0); }
};

void dash(cairo_t* cr, bool on) {
  const double pattern[] = {6, 4};
  cairo_set_dash(cr, pattern, on ? 2 : 0, 0);
}

void draw_panel(const Canvas& c, const ChartPanel& p, double top, double height) {
  const double left = 105, right = kWidth - 250, y0 = top + 34, y1 = top + height - 52;
  c.text(p.title, (left + right) / 2, top + 22, 16, Canvas::Align::center, true);
  Range xr, yr;
  for (const ChartSeries& s : p.series)
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i)
      if (std::isfinite(s.y[i])) xr.add(s.x[i]), yr.add(s.y[i]);
  const Axis ax(xr), ay(yr);
  cairo_t* cr = c.cr();
  for (double t : ax.ticks) {
    const double x = ax.at(t, left, right);
    c.line(x, y0, x, y1, 0.9, 1);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    c.text(tick_label(t, ax.step, ax.largest), x, y1 + 18, 12, Canvas::Align::center);
  }
  for (double t : ay.ticks) {
    const double y = ay.at(t, y1, y0);
    c.line(left, y, right, y, 0.9, 1);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    c.text(tick_label(t, ay.step, ay.largest), left - 8, y + 4, 12, Canvas::Align::right);
  }
  cairo_set_source_rgb(cr, 0.3, 0.3, 0.3);
  cairo_set_line_width(cr, 1.2);
  cairo_rectangle(cr, left, y0, right - left, y1 - y0);
  cairo_stroke(cr);
  cairo_set_source_rgb(cr, 0, 0, 0);
  c.text(p.x_label, (left + right) / 2, y1 + 40, 13, Canvas::Align::center);
  c.text(p.y_label, 30, (y0 + y1) / 2, 13, Canvas::Align::center, false, true);
  if (yr.empty()) {
    cairo_set_source_rgb(cr, 0.5, 0.5, 0.5);
    c.text("no data", (left + right) / 2, (y0 + y1) / 2, 14, Canvas::Align::center);
    return;
  }
  cairo_save(cr);
  cairo_rectangle(cr, left, y0, right - left, y1 - y0);
  cairo_clip(cr);
  for (size_t k = 0; k < p.series.size(); ++k) {
    const ChartSeries& s = p.series[k];
    const size_t n = std::min(s.x.size(), s.y.size());
    c.color(s.color >= 0 ? s.color : int(k));
    cairo_set_line_width(cr, 2);
    dash(cr, s.dashed);
    bool drawing = false;
    for (size_t i = 0; i < n; ++i) {
      if (!std::isfinite(s.y[i]) || !std::isfinite(s.x[i])) {
        drawing = false;
        continue;
      }
      const double x = ax.at(s.x[i], left, right), y = ay.at(s.y[i], y1, y0);
      if (drawing) cairo_line_to(cr, x, y);
      else cairo_move_to(cr, x, y);
      drawing = true;
    }
    cairo_stroke(cr);
    dash(cr, false);
    // Markers: on every point of a short series, and on a point no line reaches (its neighbours
    // missing), so that a value logged only now and then still shows.
    const auto finite = [&](size_t i) { return std::isfinite(s.y[i]) && std::isfinite(s.x[i]); };
    for (size_t i = 0; i < n; ++i)
      if (finite(i) && (n <= 60 || ((i == 0 || !finite(i - 1)) && (i + 1 == n || !finite(i + 1))))) {
        cairo_arc(cr, ax.at(s.x[i], left, right), ay.at(s.y[i], y1, y0), 3, 0, 2 * std::numbers::pi);
        cairo_fill(cr);
      }
  }
  cairo_restore(cr);
  // The legend, beside the plot.
  for (size_t k = 0; k < p.series.size(); ++k) {
    const double y = y0 + 10 + 20 * double(k);
    if (y > y1) break;
    c.color(p.series[k].color >= 0 ? p.series[k].color : int(k));
    cairo_set_line_width(cr, 3);
    dash(cr, p.series[k].dashed);
    cairo_move_to(cr, right + 16, y - 4);
    cairo_line_to(cr, right + 40, y - 4);
    cairo_stroke(cr);
    dash(cr, false);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    c.text(shorten(p.series[k].label, 26), right + 46, y, 12);
  }
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  TITAN_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi && target >= 2,
              "nice_ticks: range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]", "pass a finite lo < hi");
  const double raw = (hi - lo) / double(target);
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag * 10;
  for (double m : {1.0, 2.0, 5.0})
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  const double first = std::floor(lo / step + 1e-9) * step, last = std::ceil(hi / step - 1e-9) * step;
  std::vector<double> ticks;
  for (int i = 0; first + double(i) * step <= last + step * 1e-6; ++i) ticks.push_back(first + double(i) * step);
  if (ticks.size() < 2) ticks.push_back(first + step);
  return ticks;
}

void draw_line_charts(const fs::path& png, const std::string& title, const std::vector<ChartPanel>& panels) {
  constexpr double kTitle = 44, kPanel = 330;
  const Canvas c(kWidth, int(kTitle + kPanel * double(std::max<size_t>(panels.size(), 1))));
  cairo_set_source_rgb(c.cr(), 0, 0, 0);
  c.text(title, kWidth / 2.0, 30, 20, Canvas::Align::center, true);
  for (size_t i = 0; i < panels.size(); ++i) {
    ChartPanel shown = panels[i];  // a series without a single finite point stays out of the legend too
    std::erase_if(shown.series, [](const ChartSeries& s) { return std::none_of(s.y.begin(), s.y.end(), [](double v) {
                    return std::isfinite(v);
                  }); });
    draw_panel(c, shown, kTitle + kPanel * double(i), kPanel);
  }
  c.save(png);
}

void draw_bar_chart(const fs::path& png, const BarChart& chart) {
  TITAN_CHECK(chart.labels.size() == chart.values.size(),
              "draw_bar_chart: " + std::to_string(chart.labels.size()) + " labels for " +
                  std::to_string(chart.values.size()) + " values", "give one label per value");
  const size_t n = chart.values.size();
  constexpr double kRow = 26, kTop = 60, kBottom = 60, left = 330, right = kWidth - 130;
  const Canvas c(kWidth, int(kTop + kBottom + kRow * double(std::max<size_t>(n, 1))));
  cairo_t* cr = c.cr();
  cairo_set_source_rgb(cr, 0, 0, 0);
  c.text(chart.title, kWidth / 2.0, 32, 18, Canvas::Align::center, true);
  Range r;
  r.add(0);
  for (double v : chart.values) r.add(v);
  const Axis ax(r);
  const double y1 = kTop + kRow * double(std::max<size_t>(n, 1));
  for (double t : ax.ticks) {
    const double x = ax.at(t, left, right);
    c.line(x, kTop - 6, x, y1, 0.9, 1);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    c.text(tick_label(t, ax.step, ax.largest), x, y1 + 18, 12, Canvas::Align::center);
  }
  cairo_set_source_rgb(cr, 0, 0, 0);
  c.text(chart.value_label, (left + right) / 2, y1 + 42, 13, Canvas::Align::center);
  for (size_t i = 0; i < n; ++i) {
    const double y = kTop + kRow * double(i);
    const double w = std::isfinite(chart.values[i]) ? ax.at(chart.values[i], left, right) - left : 0;
    c.color(i < chart.group.size() ? chart.group[i] : 0);
    cairo_rectangle(cr, left, y + 3, std::max(w, 1.0), kRow - 6);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    c.text(shorten(chart.labels[i], 44), left - 8, y + kRow / 2 + 4, 12, Canvas::Align::right);
    char value[32];
    std::snprintf(value, sizeof value, "%.4g", chart.values[i]);
    c.text(value, left + std::max(w, 1.0) + 6, y + kRow / 2 + 4, 12);
  }
  c.line(left, kTop - 6, left, y1, 0.3, 1.2);
  c.save(png);
}

}  // namespace titan::train
