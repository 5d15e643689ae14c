// Token shards: the on-disk form of a tokenized corpus (see docs/data.md for the byte layout).
// A shard is written once by ShardWriter, streaming, and read many times through a read-only
// memory map by ShardReader, which trusts nothing in the file until it has checked it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

namespace titan::data {

// "TITANTOK" as it appears at byte 0 of every shard, so `head -c 8 shard.bin` shows what it is.
inline constexpr char kShardMagic[8] = {'T', 'I', 'T', 'A', 'N', 'T', 'O', 'K'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderBytes = 128;

// The fixed header at byte 0, little-endian, exactly as stored.
struct ShardHeader {
  char magic[8];
  uint32_t version;
  uint32_t token_bytes;    // 2 (u16 tokens) when vocab_size <= 65536, else 4 (u32)
  uint64_t num_tokens;     // tokens of all documents, separators not included
  uint64_t num_documents;
  uint64_t vocab_size;
  int32_t bos_id;          // -1: documents get no BOS when packed
  int32_t eos_id;          // always set: the packer ends every document with it
  uint64_t checksum;       // xxh64 (seed 0) of every byte after the header
  uint8_t reserved[72];    // zero; room for later versions without moving the payload
};
static_assert(sizeof(ShardHeader) == kShardHeaderBytes);

// Bytes per stored token for a vocabulary: the smallest of u16/u32 that holds every id.
uint32_t token_bytes_for_vocab(int64_t vocab_size);

// Bytes the whole file must have: header, tokens padded to 8 bytes, then num_documents + 1
// u64 document offsets (8-aligned so the map can read them in place).
uint64_t shard_file_bytes(const ShardHeader& header);

// Writes one shard document by document. Everything goes to "<path>.tmp", which finish()
// renames to <path>: a crash leaves no file that looks like a complete shard.
class ShardWriter {
 public:
  ShardWriter(std::string path, int64_t vocab_size, int32_t bos_id, int32_t eos_id);
  ~ShardWriter();  // removes the temporary file when finish() never ran
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends one document; every id must lie in [0, vocab_size).
  void add_document(std::span<const int32_t> tokens);
  // Writes the offsets and the final header, flushes to disk and renames into place.
  void finish();

  int64_t num_tokens() const { return int64_t(offsets_.back()); }
  int64_t num_documents() const { return int64_t(offsets_.size()) - 1; }

 private:
  void write_bytes(const void* data, size_t bytes);

  std::string path_, temp_path_;
  ShardHeader header_{};
  std::FILE* file_ = nullptr;
  void* hash_state_ = nullptr;        // XXH64_state_t*, kept opaque to spare includers xxhash.h
  std::vector<uint64_t> offsets_{0};  // [D + 1] token offset where each document starts
  std::vector<uint8_t> narrowed_;     // reused scratch for u16/u32 conversion
};

// A read-only memory map of one shard, checked on open: magic, version, token width, size of
// the file against the header, the document offsets, and (on request) the checksum and every
// token id against the vocabulary. Every error names the file and says how to fix it.
class ShardReader {
 public:
  explicit ShardReader(std::string path, bool verify = false);
  ~ShardReader();
  ShardReader(ShardReader&& other) noexcept;
  ShardReader& operator=(ShardReader&& other) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  const ShardHeader& header() const { return header_; }
  int64_t num_tokens() const { return int64_t(header_.num_tokens); }
  int64_t num_documents() const { return int64_t(header_.num_documents); }

  // [D + 1] document d holds tokens [offsets[d], offsets[d + 1]).
  std::span<const uint64_t> document_offsets() const { return offsets_; }
  // Copies tokens [begin, begin + count) widened to int32.
  void copy_tokens(int64_t begin, int64_t count, int32_t* out) const;

 private:
  void verify_payload() const;

  std::string path_;
  ShardHeader header_{};
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
  const uint8_t* tokens_ = nullptr;
  std::span<const uint64_t> offsets_;
};

}  // namespace titan::data
