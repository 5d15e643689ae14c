// Fuzzes tokenizer.json loading (data::Tokenizer::load), then uses what loaded: encodes a fixed
// text (special tokens, digits, non-ASCII) and decodes ids, so tables the loader accepted but
// built wrong show up as a crash here rather than in a training run.
#include <algorithm>
#include <vector>

#include "fuzz_support.h"
#include "titan/data/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto path = titan::fuzz::scratch_folder() / "tokenizer.json";
  titan::fuzz::write_file(path, titan::fuzz::as_text(data, size));
  return titan::fuzz::expect_clear_errors([&] {
    const titan::data::Tokenizer tok = titan::data::Tokenizer::load(path.string());
    const std::vector<int32_t> ids = tok.encode("Hello world 12345 <|bos|>héllo\n\t<|eos|> ünïcode 日本語", false);
    (void)tok.decode(ids);
    (void)tok.decode(ids, /*skip_special=*/true);
    // The first 4096 of the ids it claims (0 .. vocab_size - 1), each looked up and decoded.
    std::vector<int32_t> all(size_t(std::min(tok.vocab_size(), 4096)));
    for (size_t i = 0; i < all.size(); ++i) {
      all[i] = int32_t(i);
      (void)tok.id_to_token(all[i]);
      (void)tok.is_special(all[i]);
    }
    (void)tok.decode(all);
    if (tok.bos_id()) (void)tok.encode("a", /*add_bos=*/true);
  });
}
