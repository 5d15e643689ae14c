// A tokenizer-free training set for trainer tests: token shards of a text file with one token per
// byte (vocabulary 257; 256 ends a document), written by the real `titan data prepare` path.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "titan/data/prepare.h"

namespace titan::test {

// Prepares `corpus` into <dir>/prepared (a val_fraction share held out) and returns that folder.
inline std::filesystem::path prepare_byte_dataset(const std::filesystem::path& corpus, const std::filesystem::path& dir,
                                                  double val_fraction) {
  data::PrepareOptions o;
  o.inputs = {corpus.string()};
  o.output_dir = (dir / "prepared").string();
  o.val_fraction = val_fraction;
  data::Encoder bytes;
  bytes.encode = [](std::string_view t) { return std::vector<int32_t>(t.begin(), t.end()); };
  bytes.vocab_size = 257;
  bytes.eos_id = 256;
  data::prepare_dataset(o, bytes);
  return dir / "prepared";
}

}  // namespace titan::test
