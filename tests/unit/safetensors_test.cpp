#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "titan/checkpoint/safetensors.h"

using namespace titan;
using namespace titan::checkpoint;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir() {
  fs::path d = fs::temp_directory_path() / ("titan_st_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

void write_raw(const fs::path& p, const std::string& header, size_t data_bytes) {
  std::ofstream f(p, std::ios::binary);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header;
  f << std::string(data_bytes, '\0');
}

std::string error_of(const fs::path& p) {
  try {
    SafetensorsFile::open(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Safetensors, RoundTripsDtypesShapesViewsAndMetadata) {
  const fs::path dir = temp_dir();
  Tensor a = Tensor::empty({3, 4}, DType::f32);
  for (int i = 0; i < 12; ++i) a.data<float>()[i] = float(i) * 0.5f;
  Tensor b = a.transpose(0, 1).to(DType::bf16);  // non-contiguous source after transpose
  Tensor c = Tensor::full({5}, 7, DType::i64);
  Tensor empty = Tensor::empty({0, 3}, DType::f32);
  save_safetensors(dir / "x.safetensors", {{"a", a}, {"b.t", a.transpose(0, 1)}, {"c", c}, {"bf", b}, {"e", empty}},
                   {{"format", "pt"}});
  EXPECT_FALSE(fs::exists(dir / "x.safetensors.tmp"));
  SafetensorsFile f = SafetensorsFile::open(dir / "x.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.get("a").at({2, 3}), 5.5);
  EXPECT_EQ(f.get("b.t").shape(), Shape({4, 3}));
  EXPECT_EQ(f.get("b.t").at({3, 2}), 5.5);
  EXPECT_EQ(f.get("bf").dtype(), DType::bf16);
  EXPECT_EQ(f.get("c").at({4}), 7);
  EXPECT_EQ(f.get("e").numel(), 0);
  EXPECT_THROW(f.get("missing"), Error);
  fs::remove_all(dir);
}

TEST(Safetensors, BadFilesNameTheFileAndTheProblem) {
  const fs::path dir = temp_dir();
  const fs::path p = dir / "bad.safetensors";
  EXPECT_NE(error_of(dir / "nope.safetensors").find("cannot open"), std::string::npos);
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  std::string e = error_of(p);
  EXPECT_NE(e.find("bad.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}})", 16);
  EXPECT_NE(error_of(p).find("needs 16 bytes"), std::string::npos);
  write_raw(p, R"({"w": {"dtype": "Q4", "shape": [4], "data_offsets": [0, 16]}})", 16);
  EXPECT_NE(error_of(p).find("unsupported dtype"), std::string::npos);
  write_raw(p, R"({"w": {"dtype": "F32", "shape": [4], )", 16);
  EXPECT_NE(error_of(p).find("does not parse"), std::string::npos);
  write_raw(p, R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}})", 16);
  EXPECT_NE(error_of(p).find("overlap"), std::string::npos);
  fs::remove_all(dir);
}

// Header values of the wrong JSON type or out of range are a titan::Error naming the tensor, not
// nlohmann's exception, a fraction cast to size_t, or an element count that overflows int64.
// Found by running fuzz_safetensors's target on inputs written for it (fuzz/corpus/
// fuzz_safetensors/regression_*).
TEST(Safetensors, HeaderValuesOfTheWrongTypeOrRangeAreClearErrors) {
  const fs::path dir = temp_dir();
  const fs::path p = dir / "typed.safetensors";
  const std::pair<const char*, const char*> cases[] = {
      {R"({"w": {"dtype": 1, "shape": [1], "data_offsets": [0, 4]}})", "tensor 'w' has unsupported dtype 1"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 1e300]}})", "tensor 'w' has bad data_offsets [0,1e+300]"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, "4"]}})", "tensor 'w' has bad data_offsets [0,\"4\"]"},
      {R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", "tensor 'w' has bad data_offsets [-4,0]"},
      {R"({"w": {"dtype": "F32", "shape": [1099511627776, 1099511627776], "data_offsets": [0, 4]}})",
       "tensor 'w' has a bad shape [1099511627776,1099511627776]"},
      {R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 4]}})", "tensor 'w' has a bad shape [2.5]"},
      {R"({"w": {"dtype": "F32", "shape": 1, "data_offsets": [0, 4]}})", "tensor 'w' has a bad shape 1"},
      {R"({"w": {"dtype": "F32", "shape": [1,1,1,1,1,1,1,1,1], "data_offsets": [0, 4]}})", "tensor 'w' has a bad shape"},
  };
  for (const auto& [header, expected] : cases) {
    write_raw(p, header, 4);
    const std::string e = error_of(p);
    EXPECT_NE(e.find(expected), std::string::npos) << header << "\n" << e;
  }
  fs::remove_all(dir);
}
