// The layering rule of ARCHITECTURE.md, checked on the sources: a folder of src/titan includes
// only folders of a lower layer (and itself). Folders on one layer do not include each other.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// Lower layers first. A new folder must be added here, at the layer it belongs to.
const std::map<std::string, int> kLayer = {
    {"core", 0},     {"kernels", 1},    {"autograd", 2}, {"nn", 3},     {"data", 3},
    {"distributed", 4}, {"checkpoint", 5}, {"optim", 5}, {"models", 6}, {"train", 7},
    {"cli", 8},
};

TEST(Layering, EveryFolderIncludesOnlyLowerLayers) {
  const fs::path root = fs::path("src") / "titan";
  ASSERT_TRUE(fs::is_directory(root)) << "run from the repository root (ctest sets the working directory)";
  const std::regex include(R"(^\s*#\s*include\s*"titan/([a-z_0-9]+)/)");
  std::vector<std::string> violations;
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(root)) {
    const std::string ext = entry.path().extension().string();
    if (!entry.is_regular_file() || (ext != ".h" && ext != ".cpp" && ext != ".cu")) continue;
    const std::string folder = fs::relative(entry.path(), root).begin()->string();
    const auto own = kLayer.find(folder);
    if (own == kLayer.end()) {
      violations.push_back(entry.path().string() + ": folder '" + folder + "' has no layer in kLayer");
      continue;
    }
    ++files;
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      std::smatch m;
      if (!std::regex_search(line, m, include)) continue;
      const std::string target = m[1];
      if (target == folder) continue;
      const auto other = kLayer.find(target);
      if (other == kLayer.end() || other->second >= own->second)
        violations.push_back(entry.path().string() + ":" + std::to_string(n) + ": " + folder + " (layer " +
                             std::to_string(own->second) + ") includes " + target + " (layer " +
                             (other == kLayer.end() ? std::string("?") : std::to_string(other->second)) + ")");
    }
  }
  EXPECT_GT(files, 100);
  for (const std::string& v : violations) ADD_FAILURE() << v;
}

}  // namespace
