#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "titan/core/error.h"
#include "titan/data/pre_tokenizer.h"
#include "titan/data/tokenizer.h"

using namespace titan;
using namespace titan::data;
using Json = nlohmann::json;

namespace {

// Written by reference/tokenizer_fixture.py with Hugging Face `tokenizers`.
const std::string kFixtures = "tests/fixtures/tokenizer/";

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing fixture " << path << " (tests run from the repository root)";
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// A fresh directory per test process for files the tests write, removed at exit.
struct ScratchDir {
  std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("titan_tokenizer_test_" + std::to_string(::getpid()));
  ScratchDir() { std::filesystem::create_directories(path); }
  ~ScratchDir() { std::filesystem::remove_all(path); }
};

std::filesystem::path scratch_dir() {
  static const ScratchDir dir;
  return dir.path;
}

std::string write_scratch(const std::string& name, const std::string& content) {
  const std::string path = (scratch_dir() / name).string();
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

// corpus.txt split into lines exactly as the fixture script fed them to the HF trainer.
std::vector<std::string> corpus_lines() {
  const std::string text = read_file(kFixtures + "corpus.txt");
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    lines.push_back(text.substr(start, nl - start));
  lines.push_back(text.substr(start));
  return lines;
}

// Merges in either tokenizer.json form, as pairs.
std::vector<std::pair<std::string, std::string>> merge_pairs(const Json& merges) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const Json& m : merges) {
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      out.emplace_back(s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1));
    } else {
      out.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    }
  }
  return out;
}

std::map<std::string, int> vocab_map(const Json& vocab) {
  std::map<std::string, int> out;
  for (const auto& [token, id] : vocab.items()) out[token] = id.get<int>();
  return out;
}

}  // namespace

TEST(Tokenizer, MatchesHuggingFaceIdsOnFixtures) {
  const Json fixture = Json::parse(read_file(kFixtures + "cases.json"));
  ASSERT_EQ(fixture.size(), 3u);
  for (const auto& [name, entry] : fixture.items()) {
    SCOPED_TRACE(name);
    const Tokenizer tok = Tokenizer::load(kFixtures + name);
    EXPECT_EQ(tok.vocab_size(), entry["vocab_size"].get<int>());
    for (const Json& c : entry["cases"]) {
      const std::string text = c["text"].get<std::string>();
      SCOPED_TRACE("text: " + Json(text).dump());
      const auto expected = c["ids"].get<std::vector<int32_t>>();
      const std::vector<int32_t> ids = tok.encode(text);
      ASSERT_EQ(ids, expected);
      EXPECT_EQ(tok.decode(ids), c["decoded"].get<std::string>());
      // The Llama-3-style fixture has a post-processor that prepends BOS, as add_bos does.
      const auto with_special = c["ids_with_special"].get<std::vector<int32_t>>();
      if (with_special != expected) {
        EXPECT_EQ(tok.encode(text, /*add_bos=*/true), with_special);
      }
    }
  }
}

TEST(Tokenizer, SecondEncodeHitsTheWordCacheWithSameIds) {
  // The GPT-2-style fixture has no added tokens that swallow whitespace, so decode restores the text.
  const Tokenizer tok = Tokenizer::load(kFixtures + "gpt2_bpe.json");
  const std::string text = read_file(kFixtures + "corpus.txt");
  const auto first = tok.encode(text);
  EXPECT_EQ(tok.encode(text), first);
  EXPECT_EQ(tok.decode(first), text);
  // Copies share the model and cache; concurrent encodes agree.
  std::vector<int32_t> other;
  std::thread worker([&, copy = tok] { other = copy.encode(text); });
  const auto mine = tok.encode(text);
  worker.join();
  EXPECT_EQ(other, first);
  EXPECT_EQ(mine, first);
}

TEST(Tokenizer, SpecialTokensAndLookups) {
  const Tokenizer llama = Tokenizer::load(kFixtures + "llama3_bpe.json");
  EXPECT_EQ(llama.bos_id(), 0);
  EXPECT_EQ(llama.eos_id(), 1);
  EXPECT_EQ(llama.token_to_id("<|eot_id|>"), 1500);
  EXPECT_EQ(llama.id_to_token(1500), "<|eot_id|>");
  EXPECT_TRUE(llama.is_special(1500));
  EXPECT_FALSE(llama.is_special(1501));  // <tool>: added, not special
  EXPECT_FALSE(llama.token_to_id("no such token").has_value());
  const std::vector<int32_t> ids = llama.encode("<|begin_of_text|>Hi<|eot_id|>");
  EXPECT_EQ(llama.decode(ids, /*skip_special=*/true), "Hi");

  const Tokenizer gpt2 = Tokenizer::load(kFixtures + "gpt2_bpe.json");
  EXPECT_EQ(gpt2.bos_id(), gpt2.token_to_id("<|bos|>"));
  EXPECT_EQ(gpt2.eos_id(), gpt2.token_to_id("<|eos|>"));
  // Names chosen explicitly override the well-known ones.
  const Tokenizer swapped = Tokenizer::load(kFixtures + "gpt2_bpe.json", {.bos = "<|eos|>", .eos = "<|bos|>"});
  EXPECT_EQ(swapped.bos_id(), gpt2.eos_id());
  EXPECT_THROW(Tokenizer::load(kFixtures + "gpt2_bpe.json", {.bos = "<|nope|>"}), Error);
}

TEST(Tokenizer, TrainerMatchesHuggingFaceVocabAndMerges) {
  const std::vector<std::string> lines = corpus_lines();
  struct Setup {
    const char* fixture;
    PreTokenizerStyle style;
    int vocab_size;
    std::vector<std::string> specials;
  };
  const Setup setups[] = {
      {"gpt2_bpe.json", PreTokenizerStyle::gpt2, 1000, {"<|bos|>", "<|eos|>"}},
      {"llama3_bpe.json", PreTokenizerStyle::llama3, 1500, {"<|begin_of_text|>", "<|end_of_text|>"}},
      {"deepseek_v3_bpe.json", PreTokenizerStyle::deepseek_v3, 700, {"<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"}},
  };
  for (const Setup& s : setups) {
    SCOPED_TRACE(s.fixture);
    const Tokenizer ours = Tokenizer::train(lines, {.vocab_size = s.vocab_size, .special_tokens = s.specials,
                                                    .pre_tokenizer = s.style});
    const std::string path = (scratch_dir() / (std::string("trained_") + s.fixture)).string();
    ours.save(path);
    const Json saved = Json::parse(read_file(path));
    const Json hf = Json::parse(read_file(kFixtures + s.fixture));
    EXPECT_EQ(vocab_map(saved["model"]["vocab"]), vocab_map(hf["model"]["vocab"]));
    EXPECT_EQ(merge_pairs(saved["model"]["merges"]), merge_pairs(hf["model"]["merges"]));
    EXPECT_EQ(saved["pre_tokenizer"], hf["pre_tokenizer"]);
  }
}

TEST(Tokenizer, TrainSaveLoadEncodesTheSame) {
  std::vector<std::string> texts = corpus_lines();
  texts.resize(200);
  const Tokenizer trained = Tokenizer::train(texts, {.vocab_size = 400, .special_tokens = {"<|bos|>", "<|eos|>", "<|pad|>"}});
  EXPECT_EQ(trained.vocab_size(), 400);
  EXPECT_EQ(trained.bos_id(), 0);
  EXPECT_EQ(trained.eos_id(), 1);
  const std::string path = (scratch_dir() / "roundtrip.json").string();
  trained.save(path);
  const Tokenizer loaded = Tokenizer::load(path);
  EXPECT_EQ(loaded.vocab_size(), trained.vocab_size());
  for (const std::string text : {"In the beginning God created the heaven and the earth.", "<|bos|>x<|pad|>",
                                 "naïve 日本 👍 12345", ""}) {
    const auto ids = trained.encode(text, /*add_bos=*/true);
    EXPECT_EQ(loaded.encode(text, /*add_bos=*/true), ids);
    EXPECT_EQ(ids.front(), 0);
    EXPECT_EQ(loaded.decode(ids), "<|bos|>" + std::string(text));
  }
  // Saving a loaded tokenizer writes it back unchanged.
  const std::string again = (scratch_dir() / "roundtrip_again.json").string();
  loaded.save(again);
  EXPECT_EQ(read_file(again), read_file(path));
}

TEST(Tokenizer, TrainingFromAStreamStopsAtVocabSizeAndValidatesOptions) {
  int remaining = 50;
  const Tokenizer tok = Tokenizer::train(
      [&](std::string& text) {
        text = "low lower lowest newer wider " + std::to_string(remaining);
        return remaining-- > 0;
      },
      {.vocab_size = 300, .special_tokens = {}, .pre_tokenizer = PreTokenizerStyle::gpt2});
  EXPECT_EQ(tok.vocab_size(), 300);
  EXPECT_FALSE(tok.bos_id().has_value());
  EXPECT_THROW(tok.encode("x", /*add_bos=*/true), Error);
  EXPECT_EQ(tok.encode(" lowest").size(), 1u);
  EXPECT_THROW(Tokenizer::train(std::vector<std::string>{"a"}, {.vocab_size = 100}), Error);
  EXPECT_THROW(Tokenizer::train(std::vector<std::string>{"a"}, {.vocab_size = 300, .special_tokens = {"<a>", "<a>"}}),
               Error);
  EXPECT_THROW(Tokenizer::train(std::vector<std::string>{"bad \xff utf8"}, {.vocab_size = 300}), Error);
}

namespace {

std::vector<std::string_view> pre_tokenize(const Json& config, std::string_view text, std::deque<std::string>& arena) {
  const PreTokenizer pre = PreTokenizer::from_json(config, "test");
  std::vector<std::string_view> out;
  pre.split(text, out, arena);
  return out;
}

}  // namespace

TEST(PreTokenizer, SplitBehaviorsMatchHuggingFace) {
  // Expected pieces from HF tokenizers 0.23.3: Split(Regex("-+|a"), behavior, invert).
  struct Case {
    const char* behavior;
    bool invert;
    std::vector<std::string_view> pieces;
  };
  const Case cases[] = {
      {"Removed", false, {"the", "fin", "l", "countdown"}},
      {"Isolated", false, {"the", "-", "fin", "a", "l", "--", "countdown", "-"}},
      {"MergedWithPrevious", false, {"the-", "fina", "l--", "countdown-"}},
      {"MergedWithNext", false, {"the", "-fin", "al", "--countdown", "-"}},
      {"Contiguous", false, {"the", "-", "fin", "a", "l", "--", "countdown", "-"}},
      {"Removed", true, {"-", "a", "--", "-"}},
      {"Isolated", true, {"the", "-", "fin", "a", "l", "--", "countdown", "-"}},
      {"MergedWithPrevious", true, {"the", "-fin", "al", "--countdown", "-"}},
      {"MergedWithNext", true, {"the-", "fina", "l--", "countdown-"}},
      {"Contiguous", true, {"the", "-", "fin", "a", "l", "--", "countdown", "-"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.behavior) + (c.invert ? " inverted" : ""));
    const Json config = {
        {"type", "Sequence"},
        {"pretokenizers",
         Json::array({{{"type", "Split"}, {"pattern", {{"Regex", "-+|a"}}}, {"behavior", c.behavior}, {"invert", c.invert}},
                      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
    std::deque<std::string> arena;
    EXPECT_EQ(pre_tokenize(config, "the-final--countdown-", arena), c.pieces);
  }
}

TEST(PreTokenizer, ByteLevelPrefixSpaceMatchesHuggingFace) {
  // HF: ByteLevel(add_prefix_space=True) gives ĠHello Ġworld Ġ Ġx, and ĠHi for " Hi".
  const Json config = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}};
  std::deque<std::string> arena;
  EXPECT_EQ(pre_tokenize(config, "Hello world  x", arena), (std::vector<std::string_view>{" Hello", " world", " ", " x"}));
  EXPECT_EQ(pre_tokenize(config, " Hi", arena), (std::vector<std::string_view>{" Hi"}));
}

TEST(Tokenizer, RejectsBadTextAndIds) {
  const Tokenizer tok = Tokenizer::load(kFixtures + "gpt2_bpe.json");
  try {
    tok.encode("ok \xc3\x28 bad");
    FAIL() << "invalid UTF-8 accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("byte 3"), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty());
  }
  const std::vector<int32_t> bad_ids = {5, tok.vocab_size()};
  EXPECT_THROW(tok.decode(bad_ids), Error);
  EXPECT_THROW(tok.id_to_token(-1), Error);
}

// ---- malformed tokenizer.json files ---------------------------------------------------------

namespace {

// A valid tiny byte-level tokenizer.json: the 256 byte tokens, "ab" from one merge, one special.
Json tiny_tokenizer() {
  const Json hf = Json::parse(read_file(kFixtures + "gpt2_bpe.json"));
  Json vocab = Json::object();
  int id = 0;
  for (const auto& [token, value] : hf["model"]["vocab"].items())
    if (value.get<int>() >= 2 && value.get<int>() < 258) vocab[token] = id++;
  vocab["ab"] = id++;
  return {{"version", "1.0"},
          {"added_tokens", Json::array({{{"id", id}, {"content", "<|eos|>"}, {"special", true}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", Json::array({"a b"})}}}};
}

// Loads `content` from a scratch file; the error must name the file and `field`, and give a hint.
void expect_load_error(const std::string& name, const std::string& content, const std::string& field) {
  SCOPED_TRACE(name);
  const std::string path = write_scratch(name, content);
  try {
    Tokenizer::load(path);
    FAIL() << "loaded a broken tokenizer.json";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(path), std::string::npos) << e.what();
    EXPECT_NE(e.message().find(field), std::string::npos) << e.what();
    EXPECT_FALSE(e.hint().empty()) << e.what();
  }
}

}  // namespace

TEST(TokenizerErrors, TinyTokenizerIsValid) {
  const std::string path = write_scratch("tiny.json", tiny_tokenizer().dump());
  const Tokenizer tok = Tokenizer::load(path);
  EXPECT_EQ(tok.vocab_size(), 258);
  EXPECT_EQ(tok.encode("ab<|eos|>"), (std::vector<int32_t>{256, 257}));
  EXPECT_EQ(tok.eos_id(), 257);
}

// Expected ids below are what HF tokenizers 0.23.3 gives for the same JSON.
TEST(TokenizerModelOptions, IgnoreMergesTakesWholeWordsFromTheVocab) {
  for (const bool ignore : {false, true}) {
    Json t = tiny_tokenizer();
    t["model"]["vocab"]["abc"] = 257;  // reachable only as a whole word: no merge makes it
    t["added_tokens"][0]["id"] = 258;
    t["model"]["ignore_merges"] = ignore;
    const Tokenizer tok = Tokenizer::load(write_scratch("ignore_merges.json", t.dump()));
    const std::vector<int32_t> whole = {257}, merged = {256, 66};
    EXPECT_EQ(tok.encode("abc"), ignore ? whole : merged);
    EXPECT_EQ(tok.encode("abcd"), (std::vector<int32_t>{256, 66, 67}));
  }
}

TEST(TokenizerModelOptions, BytesMissingFromTheVocabBecomeUnknownOrVanish) {
  struct Case {
    Json unk_token;
    bool fuse_unk;
    std::vector<int32_t> zzaz, zzab;
  };
  const Case cases[] = {
      {nullptr, false, {64}, {256}},
      {"<unk>", false, {89, 89, 64, 89}, {89, 89, 256}},
      {"<unk>", true, {89, 64, 89}, {89, 256}},
  };
  for (const Case& c : cases) {
    Json t = tiny_tokenizer();
    t["model"]["vocab"].erase("z");
    t["model"]["vocab"]["<unk>"] = 89;  // the id "z" had
    t["model"]["unk_token"] = c.unk_token;
    t["model"]["fuse_unk"] = c.fuse_unk;
    const Tokenizer tok = Tokenizer::load(write_scratch("unk.json", t.dump()));
    EXPECT_EQ(tok.encode("zzaz"), c.zzaz);
    EXPECT_EQ(tok.encode("zzab"), c.zzab);
  }
}

TEST(TokenizerErrors, MissingFile) {
  try {
    Tokenizer::load("/nonexistent/tokenizer.json");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("/nonexistent/tokenizer.json"), std::string::npos);
    EXPECT_FALSE(e.hint().empty());
  }
}

TEST(TokenizerErrors, MalformedJson) {
  expect_load_error("truncated.json", tiny_tokenizer().dump().substr(0, 300), "not valid JSON");
  expect_load_error("array.json", "[1, 2]", "not a JSON object");
  // A number beyond double is nlohmann's out_of_range, not parse_error: it escaped load() until
  // fuzz_tokenizer found it (an id mutated to "21e30053").
  std::string overflow = tiny_tokenizer().dump();
  overflow.insert(1, "\"extra\": 21e30053, ");
  expect_load_error("overflow.json", overflow, "not valid JSON");
}

TEST(TokenizerErrors, WrongShape) {
  Json t = tiny_tokenizer();
  t["model"]["type"] = "WordPiece";
  expect_load_error("wordpiece.json", t.dump(), "model.type");

  t = tiny_tokenizer();
  t.erase("model");
  expect_load_error("no_model.json", t.dump(), "model");

  t = tiny_tokenizer();
  t["model"].erase("vocab");
  expect_load_error("no_vocab.json", t.dump(), "model.vocab");

  t = tiny_tokenizer();
  t["model"]["vocab"] = Json::array();
  expect_load_error("vocab_list.json", t.dump(), "model.vocab");

  t = tiny_tokenizer();
  t["model"]["merges"] = Json::array({"a zz"});
  expect_load_error("unknown_merge.json", t.dump(), "model.merges[0]");

  t = tiny_tokenizer();
  t["model"]["merges"] = Json::array({"b a"});  // "ba" is not in the vocab
  expect_load_error("merge_result.json", t.dump(), "model.merges[0]");

  t = tiny_tokenizer();
  t["model"]["merges"] = Json::array({"ab"});
  expect_load_error("merge_form.json", t.dump(), "model.merges[0]");

  t = tiny_tokenizer();
  t["model"]["vocab"]["ab"] = 9999;
  expect_load_error("id_range.json", t.dump(), "model.vocab[\"ab\"]");

  t = tiny_tokenizer();
  t["model"]["vocab"]["ab"] = -1;
  expect_load_error("id_negative.json", t.dump(), "model.vocab[\"ab\"]");

  t = tiny_tokenizer();
  t["model"]["vocab"]["ab"] = 0;
  expect_load_error("id_reused.json", t.dump(), "model.vocab[\"ab\"]");

  t = tiny_tokenizer();
  t["added_tokens"][0]["id"] = 5;
  expect_load_error("added_id.json", t.dump(), "added_tokens[0].id");

  t = tiny_tokenizer();
  t["added_tokens"][0].erase("content");
  expect_load_error("added_content.json", t.dump(), "added_tokens[0].content");

  t = tiny_tokenizer();
  t["normalizer"] = {{"type", "NFC"}};
  expect_load_error("normalizer.json", t.dump(), "normalizer");

  t = tiny_tokenizer();
  t["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_load_error("whitespace.json", t.dump(), "pre_tokenizer");

  t = tiny_tokenizer();
  t["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", Json::array({{{"type", "Split"}, {"pattern", {{"Regex", "("}}},
                                                        {"behavior", "Isolated"}}})}};
  expect_load_error("bad_regex.json", t.dump(), "pre_tokenizer");

  t = tiny_tokenizer();
  t["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", Json::array({{{"type", "Split"}, {"pattern", {{"Regex", "a"}}},
                                                        {"behavior", "Isolated"}}})}};
  expect_load_error("no_byte_level.json", t.dump(), "pre_tokenizer");

  t = tiny_tokenizer();
  t["model"]["byte_fallback"] = true;
  expect_load_error("byte_fallback.json", t.dump(), "model.byte_fallback");
}
