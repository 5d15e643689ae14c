#include "titan/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <nlohmann/json.hpp>

namespace titan::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

std::string safetensors_dtype(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
    case DType::f8e4m3: return "F8_E4M3";
    case DType::f8e5m2: return "F8_E5M2";
    case DType::f4e2m1: return "F4_E2M1";
    case DType::e8m0: return "F8_E8M0";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
    case DType::u8: return "U8";
  }
  return "?";
}

namespace {

void write_all(std::FILE* f, const void* data, size_t n, const fs::path& path) {
  if (std::fwrite(data, 1, n, f) != n)
    throw IOError("write failed for " + path.string() + ": " + std::strerror(errno), "check free disk space and permissions",
                  __FILE__, __LINE__);
}

}  // namespace

std::string safetensors_header(const std::vector<HeaderEntry>& entries, const std::map<std::string, std::string>& metadata,
                               std::vector<size_t>* offsets) {
  json header = json::object();
  size_t offset = 0;
  if (offsets) offsets->clear();
  for (const HeaderEntry& e : entries) {
    TITAN_CHECK(!header.contains(e.name), "duplicate tensor name '" + e.name + "' in a safetensors file");
    TITAN_CHECK(e.name != "__metadata__", "'__metadata__' is reserved in safetensors");
    json shape = json::array();
    for (int64_t d : e.shape) shape.push_back(d);
    header[e.name] = {{"dtype", e.int8 ? std::string("I8") : safetensors_dtype(e.dtype)},
                      {"shape", shape},
                      {"data_offsets", {offset, offset + e.bytes}}};
    if (offsets) offsets->push_back(offset);
    offset += e.bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');  // pad so the data section is 8-byte aligned
  return text;
}

void save_safetensors(const fs::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata, const std::set<std::string>& int8_bytes) {
  std::vector<HeaderEntry> entries;
  std::vector<Tensor> contiguous;
  contiguous.reserve(tensors.size());
  for (const auto& [name, t] : tensors) {
    const bool int8 = int8_bytes.count(name) != 0;
    TITAN_CHECK(!int8 || t.dtype() == DType::u8, "'" + name + "' is " + t.str() + ": only u8 bytes are written as I8");
    contiguous.push_back(t.contiguous());
    entries.push_back({name, t.dtype(), t.shape(), t.nbytes(), int8});
  }
  const std::string text = safetensors_header(entries, metadata, nullptr);
  const fs::path tmp = path.string() + ".tmp";
  // Closed on every path out, an error's included.
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  if (!f) throw IOError("cannot create " + tmp.string() + ": " + std::strerror(errno),
                        "check the folder exists and is writable", __FILE__, __LINE__);
  const uint64_t len = text.size();
  write_all(f.get(), &len, 8, tmp);
  write_all(f.get(), text.data(), text.size(), tmp);
  for (const Tensor& t : contiguous)
    if (t.nbytes()) write_all(f.get(), t.data_ptr(), t.nbytes(), tmp);
  if (std::fflush(f.get()) != 0 || fsync(fileno(f.get())) != 0)
    throw IOError("cannot flush " + tmp.string() + ": " + std::strerror(errno), "check free disk space", __FILE__, __LINE__);
  if (std::fclose(f.release()) != 0)
    throw IOError("cannot close " + tmp.string() + ": " + std::strerror(errno), "check free disk space", __FILE__, __LINE__);
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) throw IOError("cannot rename " + tmp.string() + " to " + path.filename().string() + ": " + ec.message(),
                        "check the folder's permissions", __FILE__, __LINE__);
}

namespace {

// The safetensors reference implementation refuses longer headers (MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// A size or offset of the header: a JSON integer >= 0 that int64 holds, not a fraction, a string
// or a negative or huge number (nlohmann's get<size_t>() would throw or cast those).
std::optional<int64_t> non_negative(const json& j) {
  if (j.is_number_unsigned())
    return j.get<uint64_t>() <= uint64_t(INT64_MAX) ? std::optional<int64_t>(int64_t(j.get<uint64_t>())) : std::nullopt;
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return j.get<int64_t>();
  return std::nullopt;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const fs::path& path) {
  const std::string where = path.string();
  // What the operating system refuses is an IOError (a caller may retry it); what the file holds
  // that is not safetensors is an Error.
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    throw IOError("cannot open safetensors file " + where + ": " + std::strerror(errno),
                  "check the path (a checkpoint folder holds model.safetensors or *.safetensors shards)", __FILE__, __LINE__);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw IOError("cannot stat " + where + ": " + std::strerror(err), "check the file system", __FILE__, __LINE__);
  }
  const size_t size = size_t(st.st_size);
  if (size < 8) {
    ::close(fd);
    TITAN_FAIL(where + " is " + std::to_string(size) + " bytes: too short to be a safetensors file",
               "the file is truncated or not safetensors; re-export or re-download it");
  }
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);
  if (map == MAP_FAILED)
    throw IOError("cannot mmap " + where + ": " + std::strerror(map_errno), "check free memory and the file system",
                  __FILE__, __LINE__);
  SafetensorsFile file;
  file.path_ = path;
  file.mapping_ = std::shared_ptr<void>(map, [size](void* p) { ::munmap(p, size); });
  const auto* bytes = static_cast<const uint8_t*>(map);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);
  TITAN_CHECK(header_len <= kMaxHeaderBytes, where + ": header length " + std::to_string(header_len) +
                                                " exceeds the 100 MB that safetensors allows",
              "the file is corrupt or not safetensors");
  TITAN_CHECK(header_len <= size - 8, where + ": header length " + std::to_string(header_len) +
                                          " runs past the end of the " + std::to_string(size) + "-byte file",
              "the file is truncated or not safetensors");
  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const json::exception& e) {
    TITAN_FAIL(where + ": the JSON header does not parse: " + e.what(), "the file is corrupt; re-export it");
  }
  TITAN_CHECK(header.is_object(), where + ": the JSON header is not an object");
  file.data_ = bytes + 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  std::vector<std::pair<size_t, size_t>> ranges;
  for (const auto& [name, spec] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, v] : spec.items()) file.metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    const std::string what = where + ": tensor '" + name + "'";
    TITAN_CHECK(spec.is_object() && spec.contains("dtype") && spec.contains("shape") && spec.contains("data_offsets"),
                what + " lacks dtype, shape or data_offsets");
    Entry e;
    const json& dtype = spec.at("dtype");
    std::optional<DType> known;
    try {
      // I8 is read as its bytes: the int8 tensors we meet are DeepSeek-V4's FP4 pairs (checkpoint/hf.h).
      if (dtype.is_string()) known = dtype == "I8" ? DType::u8 : dtype_from_name(dtype.get<std::string>());
    } catch (const Error&) {  // an unknown name: the check below says which are known
    }
    TITAN_CHECK(known.has_value(), what + " has unsupported dtype " + dtype.dump(),
                "supported: F32, BF16, F16, F8_E4M3, F8_E5M2, F4_E2M1, F8_E8M0, I8, I32, I64, U8; convert the file");
    e.dtype = *known;
    const json& shape = spec.at("shape");
    TITAN_CHECK(shape.is_array() && shape.size() <= size_t(kMaxDims), what + " has a bad shape " + shape.dump());
    int64_t numel = 1;
    for (const auto& d : shape) {
      const std::optional<int64_t> n = non_negative(d);
      // numel times the bits per element (at most 64) below must not overflow either.
      TITAN_CHECK(n && !__builtin_mul_overflow(numel, *n, &numel) && numel <= INT64_MAX / 64,
                  what + " has a bad shape " + shape.dump());
      e.shape.push_back(*n);
    }
    const json& off = spec.at("data_offsets");
    const bool pair = off.is_array() && off.size() == 2;
    const std::optional<int64_t> begin = pair ? non_negative(off[0]) : std::nullopt;
    const std::optional<int64_t> end = pair ? non_negative(off[1]) : std::nullopt;
    TITAN_CHECK(begin && end, what + " has bad data_offsets " + off.dump());
    e.begin = size_t(*begin);
    e.end = size_t(*end);
    const size_t expected = size_t((e.shape.numel() * dtype_bits(e.dtype) + 7) / 8);
    TITAN_CHECK(e.begin <= e.end && e.end - e.begin == expected,
                what + " shape " + e.shape.str() + " needs " + std::to_string(expected) + " bytes but data_offsets span " +
                    std::to_string(e.end - e.begin));
    TITAN_CHECK(e.end <= data_size, what + " ends at byte " + std::to_string(e.end) + " of a " +
                                        std::to_string(data_size) + "-byte data section",
                "the file is truncated; re-export or re-download it");
    ranges.emplace_back(e.begin, e.end);
    file.entries_[name] = e;
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    TITAN_CHECK(ranges[i].first >= ranges[i - 1].second, where + ": tensors' byte ranges overlap", "the file is corrupt");
  return file;
}

Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = entries_.find(name);
  TITAN_CHECK(it != entries_.end(), "tensor '" + name + "' is not in " + path_.string(),
              "check the checkpoint matches the model (names and flavor)");
  const Entry& e = it->second;
  const uint8_t* ptr = data_ + e.begin;
  auto keep = mapping_;
  Tensor view = Tensor::from_blob(const_cast<uint8_t*>(ptr), e.shape, e.dtype, [keep](void*) {});
  // Files written by other tools need not align tensors to their element size; copy those.
  const size_t align = size_t(std::max(1, dtype_bits(e.dtype) / 8));
  return reinterpret_cast<uintptr_t>(ptr) % align == 0 ? view : view.clone();
}

}  // namespace titan::checkpoint
