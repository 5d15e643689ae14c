// Encode throughput of the byte-level BPE tokenizer, cold (empty word cache) and warm.
//   build/bench/tokenizer_bench [tokenizer.json] [text file] [repeats]
// Defaults: the Llama-3-style parity fixture and its training corpus, run from the repo root.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "titan/data/tokenizer.h"

int main(int argc, char** argv) {
  const std::string tokenizer_path = argc > 1 ? argv[1] : "tests/fixtures/tokenizer/llama3_bpe.json";
  const std::string text_path = argc > 2 ? argv[2] : "tests/fixtures/tokenizer/corpus.txt";
  const int repeats = argc > 3 ? std::stoi(argv[3]) : 20;

  std::ifstream in(text_path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  // Repeat the text so one pass is long enough to time; the cold pass sees each word once
  // before the cache holds it, like a large corpus's first pass over its vocabulary.
  std::string text;
  for (int i = 0; i < repeats; ++i) text += buffer.str();

  const auto tokenizer = titan::data::Tokenizer::load(tokenizer_path);
  for (const char* pass : {"cold", "warm"}) {
    const auto start = std::chrono::steady_clock::now();
    const size_t n = tokenizer.encode(text).size();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%s: %zu bytes -> %zu tokens in %.3f s: %.1f MB/s, %.2f M tokens/s\n", pass, text.size(), n, seconds,
                static_cast<double>(text.size()) / seconds / 1e6, static_cast<double>(n) / seconds / 1e6);
  }
  return 0;
}
