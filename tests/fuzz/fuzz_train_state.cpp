// Fuzzes a checkpoint's train_state.json as a resume reads it: checkpoint::load_train_state parses
// it, the data position in it (data::DataLoaderState's from_json) restores a real loader over
// small shards (fixtures.h), and the loader takes one batch from there.
#include "fixtures.h"
#include "fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path step = [] {
    const auto folder = titan::fuzz::scratch_folder() / "step-1";
    std::filesystem::create_directories(folder);
    return folder;
  }();
  static titan::data::DataLoader loader(titan::fuzz::write_fixture_shards(titan::fuzz::scratch_folder() / "data"));
  titan::fuzz::write_file(step / "train_state.json", titan::fuzz::as_text(data, size));
  return titan::fuzz::expect_clear_errors([&] {
    const nlohmann::json state = titan::checkpoint::load_train_state(step);
    if (!state.contains("data")) return;
    loader.restore(state.at("data").get<titan::data::DataLoaderState>());
    int32_t inputs[2 * titan::fuzz::kFixtureSeqLen], targets[2 * titan::fuzz::kFixtureSeqLen];
    (void)loader.next_batch(inputs, targets, 2, titan::fuzz::kFixtureSeqLen);
  });
}
