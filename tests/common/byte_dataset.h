// A tokenizer-free training set for trainer tests: token shards of a text file with one token per
// byte (vocabulary 257 unless asked for more; 256 ends a document), written by the real `titan
// data prepare` path.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "titan/data/prepare.h"

namespace titan::test {

// Prepares `corpus` into <dir>/prepared (a val_fraction share held out) and returns that folder.
inline std::filesystem::path prepare_byte_dataset(const std::filesystem::path& corpus, const std::filesystem::path& dir,
                                                  double val_fraction, int32_t vocab_size = 257) {
  data::PrepareOptions o;
  o.inputs = {corpus.string()};
  o.output_dir = (dir / "prepared").string();
  o.val_fraction = val_fraction;
  data::Encoder bytes;
  bytes.encode = [](std::string_view t) { return std::vector<int32_t>(t.begin(), t.end()); };
  bytes.vocab_size = vocab_size;
  bytes.eos_id = 256;
  data::prepare_dataset(o, bytes);
  return dir / "prepared";
}

// A small, learnable corpus: 300 "documents" of templated sentences, as byte tokens prepared
// into <dir>/prepared (5% held out) with a vocabulary of vocab_size (>= 257; e.g. 260 for one that
// 2 and 4 tensor-parallel ranks split). Returns that folder.
inline std::filesystem::path prepare_templated_dataset(const std::filesystem::path& dir, int32_t vocab_size = 257) {
  std::filesystem::create_directories(dir);
  {
    std::ofstream text(dir / "corpus.txt");
    const char* names[] = {"Adam", "Noah", "Moses", "Ruth", "David", "Esther"};
    const char* verbs[] = {"walked to", "spoke with", "looked upon", "went unto"};
    const char* places[] = {"the river", "the city", "the mountain", "the field", "the temple"};
    for (int d = 0; d < 300; ++d) {
      for (int s = 0; s < 6; ++s)
        text << names[(d + s) % 6] << ' ' << verbs[(d * 3 + s) % 4] << ' ' << places[(d + 2 * s) % 5] << ".\n";
      text << "\n";
    }
  }
  return prepare_byte_dataset(dir / "corpus.txt", dir, 0.05, vocab_size);
}

}  // namespace titan::test
