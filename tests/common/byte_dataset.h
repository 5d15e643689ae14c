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

// A small corpus of sentences over ten words (120 documents of 40 words each, one byte per
// token) written to <dir>/corpus.txt and prepared as above with nothing held out: a training set
// whose loss falls within a few steps.
inline std::filesystem::path prepare_words_dataset(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  {
    std::ofstream text(dir / "corpus.txt");
    const char* words[] = {"in", "the", "beginning", "was", "light", "and", "darkness", "upon", "deep", "waters"};
    for (int d = 0; d < 120; ++d) {
      for (int w = 0; w < 40; ++w) text << words[(d * 7 + w * 3) % 10] << (w % 9 == 8 ? ".\n" : " ");
      text << ".\n\n";
    }
  }
  return prepare_byte_dataset(dir / "corpus.txt", dir, 0);
}

}  // namespace titan::test
