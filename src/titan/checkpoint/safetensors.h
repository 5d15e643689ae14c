// safetensors files: an 8-byte little-endian header length, a JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the raw row-major data. Readable by PyTorch / Hugging Face tools.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "titan/core/tensor.h"

namespace titan::checkpoint {

// The header of a file holding `entries` in this order (its JSON, padded so that the data section
// is 8-byte aligned); offsets (when given) receives each entry's first byte in the data section.
struct HeaderEntry {
  std::string name;
  DType dtype;
  Shape shape;
  size_t bytes;
  bool int8 = false;  // u8 bytes labelled "I8" (save_safetensors' int8_bytes)
};
std::string safetensors_header(const std::vector<HeaderEntry>& entries, const std::map<std::string, std::string>& metadata,
                               std::vector<size_t>* offsets);

// Writes tensors (contiguous or not; written row-major) with string metadata. The file is written
// under "<path>.tmp" and renamed, so a crash never leaves a truncated file under the final name.
// The u8 tensors named in int8_bytes are labelled "I8" (their bytes unchanged; DeepSeek-V4's FP4
// pairs, which the reader returns as u8 again).
void save_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {},
                      const std::set<std::string>& int8_bytes = {});

// A memory-mapped safetensors file. Tensors returned by get() are zero-copy views that keep the
// mapping alive. Opening validates the header: JSON syntax, known dtypes, shapes vs byte ranges,
// ranges inside the file and not overlapping; every error names the file and the tensor.
class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::filesystem::path& path);

  struct Entry {
    DType dtype;
    Shape shape;
    size_t begin = 0, end = 0;  // byte range within the data section
  };
  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, Entry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  Tensor get(const std::string& name) const;  // throws naming the file when absent

 private:
  std::filesystem::path path_;
  std::shared_ptr<void> mapping_;  // munmaps on release
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// The safetensors dtype string of ours ("F32", "BF16", "F8_E4M3", ...).
std::string safetensors_dtype(DType t);

}  // namespace titan::checkpoint
