#include "titan/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include <fmt/format.h>

#include "titan/core/error.h"

namespace titan::data {

// Shards are read in place from the map, so the file's byte order must be the machine's.
static_assert(std::endian::native == std::endian::little, "token shards are little-endian");

namespace {

constexpr const char* kRegenerateHint = "re-run `titan data prepare` to rebuild the shard";

uint64_t align8(uint64_t bytes) { return (bytes + 7) & ~uint64_t(7); }

std::string errno_text() { return std::strerror(errno); }

}  // namespace

uint32_t token_bytes_for_vocab(int64_t vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

uint64_t shard_file_bytes(const ShardHeader& header) {
  return kShardHeaderBytes + align8(header.num_tokens * header.token_bytes) + (header.num_documents + 1) * 8;
}

// ---- writer ---------------------------------------------------------------------------------

ShardWriter::ShardWriter(std::string path, int64_t vocab_size, int32_t bos_id, int32_t eos_id)
    : path_(std::move(path)), temp_path_(path_ + ".tmp") {
  TITAN_CHECK(vocab_size > 0 && vocab_size <= (int64_t(1) << 31),
              fmt::format("token shard {}: vocab size {} is outside [1, 2^31] (ids are int32)", path_, vocab_size),
              "pass the tokenizer's vocabulary size");
  TITAN_CHECK(eos_id >= 0 && eos_id < vocab_size,
              fmt::format("token shard {}: EOS id {} is not in the vocabulary [0, {})", path_, eos_id, vocab_size),
              "the tokenizer must define an end-of-text token; check its special tokens");
  TITAN_CHECK(bos_id >= -1 && bos_id < vocab_size,
              fmt::format("token shard {}: BOS id {} is not in the vocabulary [0, {})", path_, bos_id, vocab_size),
              "use -1 for a tokenizer without a BOS token");
  std::memcpy(header_.magic, kShardMagic, sizeof kShardMagic);
  header_.version = kShardVersion;
  header_.token_bytes = token_bytes_for_vocab(vocab_size);
  header_.vocab_size = uint64_t(vocab_size);
  header_.bos_id = bos_id;
  header_.eos_id = eos_id;

  file_ = std::fopen(temp_path_.c_str(), "wb");
  TITAN_CHECK(file_ != nullptr, fmt::format("cannot create token shard {}: {}", temp_path_, errno_text()),
              "check that the output directory exists and is writable");
  // A zero header holds the place; finish() rewrites it once the counts and checksum are known.
  const ShardHeader placeholder{};
  TITAN_CHECK(std::fwrite(&placeholder, sizeof placeholder, 1, file_) == 1,
              fmt::format("cannot write token shard {}: {}", temp_path_, errno_text()), "check free disk space");
  auto* state = XXH64_createState();
  XXH64_reset(state, 0);
  hash_state_ = state;
}

ShardWriter::~ShardWriter() {
  if (file_) {
    std::fclose(file_);
    std::remove(temp_path_.c_str());
  }
  XXH64_freeState(static_cast<XXH64_state_t*>(hash_state_));
}

void ShardWriter::write_bytes(const void* data, size_t bytes) {
  if (bytes == 0) return;
  TITAN_CHECK(std::fwrite(data, 1, bytes, file_) == bytes,
              fmt::format("cannot write token shard {}: {}", temp_path_, errno_text()), "check free disk space");
  XXH64_update(static_cast<XXH64_state_t*>(hash_state_), data, bytes);
}

void ShardWriter::add_document(std::span<const int32_t> tokens) {
  TITAN_CHECK(file_ != nullptr, fmt::format("token shard {} is already finished", path_),
              "open a new ShardWriter for more documents");
  const int64_t vocab = int64_t(header_.vocab_size);
  for (size_t i = 0; i < tokens.size(); ++i) {
    TITAN_CHECK(tokens[i] >= 0 && tokens[i] < vocab,
                fmt::format("token shard {}: document {} has token id {} at position {}, outside the vocabulary "
                            "[0, {})",
                            path_, num_documents(), tokens[i], i, vocab),
                "the encoder and the vocabulary size disagree; pass the vocabulary size of the tokenizer that "
                "encoded the text");
  }
  if (header_.token_bytes == 4) {
    write_bytes(tokens.data(), tokens.size() * 4);
  } else {
    narrowed_.resize(tokens.size() * 2);
    auto* out = reinterpret_cast<uint16_t*>(narrowed_.data());
    for (size_t i = 0; i < tokens.size(); ++i) out[i] = uint16_t(tokens[i]);
    write_bytes(narrowed_.data(), narrowed_.size());
  }
  offsets_.push_back(offsets_.back() + tokens.size());
}

void ShardWriter::finish() {
  TITAN_CHECK(file_ != nullptr, fmt::format("token shard {} is already finished", path_),
              "call finish() once per shard");
  header_.num_tokens = offsets_.back();
  header_.num_documents = offsets_.size() - 1;
  const uint64_t token_bytes = header_.num_tokens * header_.token_bytes;
  const uint64_t zeros = 0;
  write_bytes(&zeros, align8(token_bytes) - token_bytes);
  write_bytes(offsets_.data(), offsets_.size() * sizeof(uint64_t));
  header_.checksum = XXH64_digest(static_cast<XXH64_state_t*>(hash_state_));

  const bool written = std::fseek(file_, 0, SEEK_SET) == 0 && std::fwrite(&header_, sizeof header_, 1, file_) == 1 &&
                       std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
  const std::string reason = errno_text();
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!written || !closed) {
    std::remove(temp_path_.c_str());
    TITAN_FAIL(fmt::format("cannot write token shard {}: {}", temp_path_, reason), "check free disk space");
  }
  std::error_code ec;
  std::filesystem::rename(temp_path_, path_, ec);
  TITAN_CHECK(!ec, fmt::format("cannot rename {} to {}: {}", temp_path_, path_, ec.message()),
              "check permissions on the output directory");
}

// ---- reader ---------------------------------------------------------------------------------

ShardReader::ShardReader(std::string path, bool verify) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  TITAN_CHECK(fd >= 0, fmt::format("cannot open token shard {}: {}", path_, errno_text()),
              "check the path; shards are made by `titan data prepare`");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string reason = errno_text();
    ::close(fd);
    TITAN_FAIL(fmt::format("cannot stat token shard {}: {}", path_, reason), kRegenerateHint);
  }
  const uint64_t file_bytes = uint64_t(st.st_size);
  if (file_bytes < kShardHeaderBytes) {
    ::close(fd);
    TITAN_FAIL(fmt::format("token shard {} is truncated: {} bytes, {} bytes missing from the {}-byte header", path_,
                           file_bytes, kShardHeaderBytes - file_bytes, kShardHeaderBytes),
               kRegenerateHint);
  }
  void* map = ::mmap(nullptr, file_bytes, PROT_READ, MAP_SHARED, fd, 0);
  const std::string map_reason = errno_text();
  ::close(fd);  // the mapping keeps the file open
  TITAN_CHECK(map != MAP_FAILED, fmt::format("cannot memory-map token shard {}: {}", path_, map_reason),
              "check that the file is a regular file on a local or mmap-capable file system");
  map_ = static_cast<const uint8_t*>(map);
  map_bytes_ = file_bytes;

  // From here on a failed check must unmap; the destructor does not run for a throwing constructor.
  try {
    std::memcpy(&header_, map_, sizeof header_);
    TITAN_CHECK(std::memcmp(header_.magic, kShardMagic, sizeof kShardMagic) == 0,
                fmt::format("{} is not a titan token shard: its first 8 bytes are not \"TITANTOK\"", path_),
                "pass a shard made by `titan data prepare` (llm.c or other .bin token files need re-preparing)");
    TITAN_CHECK(header_.version == kShardVersion,
                fmt::format("token shard {} has format version {}; this build reads version {}", path_,
                            header_.version, kShardVersion),
                kRegenerateHint + std::string(" with this build"));
    TITAN_CHECK(header_.token_bytes == token_bytes_for_vocab(int64_t(header_.vocab_size)) &&
                    header_.vocab_size > 0 && header_.vocab_size <= (uint64_t(1) << 31),
                fmt::format("token shard {} has an inconsistent header: {} bytes per token for vocab size {}", path_,
                            header_.token_bytes, header_.vocab_size),
                kRegenerateHint);
    TITAN_CHECK(header_.eos_id >= 0 && uint64_t(header_.eos_id) < header_.vocab_size && header_.bos_id >= -1 &&
                    header_.bos_id < int64_t(header_.vocab_size),
                fmt::format("token shard {} has BOS {} / EOS {} outside its vocabulary [0, {})", path_,
                            header_.bos_id, header_.eos_id, header_.vocab_size),
                kRegenerateHint);
    // Guard the size arithmetic against a header whose counts would overflow it.
    TITAN_CHECK(header_.num_tokens <= file_bytes && header_.num_documents <= file_bytes,
                fmt::format("token shard {} is truncated or corrupt: its header counts {} tokens and {} documents "
                            "but the file has only {} bytes",
                            path_, header_.num_tokens, header_.num_documents, file_bytes),
                kRegenerateHint);
    const uint64_t expected = shard_file_bytes(header_);
    TITAN_CHECK(file_bytes >= expected,
                fmt::format("token shard {} is truncated: {} bytes, expected {} ({} bytes missing)", path_,
                            file_bytes, expected, expected - file_bytes),
                kRegenerateHint);
    TITAN_CHECK(file_bytes == expected,
                fmt::format("token shard {} has {} bytes, expected {} ({} unexpected trailing bytes)", path_,
                            file_bytes, expected, file_bytes - expected),
                kRegenerateHint);
    tokens_ = map_ + kShardHeaderBytes;
    const auto* offsets = reinterpret_cast<const uint64_t*>(tokens_ + align8(header_.num_tokens * header_.token_bytes));
    offsets_ = {offsets, header_.num_documents + 1};
    TITAN_CHECK(offsets_.front() == 0 && offsets_.back() == header_.num_tokens,
                fmt::format("token shard {} is corrupt: document offsets span [{}, {}) instead of [0, {})", path_,
                            offsets_.front(), offsets_.back(), header_.num_tokens),
                kRegenerateHint);
    for (size_t d = 0; d + 1 < offsets_.size(); ++d) {
      TITAN_CHECK(offsets_[d] <= offsets_[d + 1],
                  fmt::format("token shard {} is corrupt: document {} starts at token {} after document {} at {}",
                              path_, d + 1, offsets_[d + 1], d, offsets_[d]),
                  kRegenerateHint);
    }
    if (verify) verify_payload();
  } catch (...) {
    ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
    throw;
  }
}

void ShardReader::verify_payload() const {
  const uint64_t actual = XXH64(map_ + kShardHeaderBytes, map_bytes_ - kShardHeaderBytes, 0);
  TITAN_CHECK(actual == header_.checksum,
              fmt::format("token shard {} is corrupt: checksum {:016x} does not match {:016x} in its header", path_,
                          actual, header_.checksum),
              kRegenerateHint);
  // The checksum proves the bytes are what the writer wrote; this proves the writer's ids fit
  // the vocabulary the embedding table will be built for.
  const uint64_t vocab = header_.vocab_size;
  for (uint64_t i = 0; i < header_.num_tokens; ++i) {
    const uint64_t id = header_.token_bytes == 2 ? reinterpret_cast<const uint16_t*>(tokens_)[i]
                                                 : reinterpret_cast<const uint32_t*>(tokens_)[i];
    TITAN_CHECK(id < vocab,
                fmt::format("token shard {}: token {} has id {}, outside the vocabulary [0, {})", path_, i, id, vocab),
                kRegenerateHint);
  }
}

ShardReader::~ShardReader() {
  if (map_) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

ShardReader::ShardReader(ShardReader&& other) noexcept
    : path_(std::move(other.path_)),
      header_(other.header_),
      map_(std::exchange(other.map_, nullptr)),
      map_bytes_(std::exchange(other.map_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      offsets_(std::exchange(other.offsets_, {})) {}

ShardReader& ShardReader::operator=(ShardReader&& other) noexcept {
  if (this != &other) {
    if (map_) ::munmap(const_cast<uint8_t*>(map_), map_bytes_);
    path_ = std::move(other.path_);
    header_ = other.header_;
    map_ = std::exchange(other.map_, nullptr);
    map_bytes_ = std::exchange(other.map_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    offsets_ = std::exchange(other.offsets_, {});
  }
  return *this;
}

void ShardReader::copy_tokens(int64_t begin, int64_t count, int32_t* out) const {
  // One comparison per call, next to a copy of many tokens: cheap insurance against a bad caller.
  TITAN_CHECK(begin >= 0 && count >= 0 && uint64_t(begin + count) <= header_.num_tokens,
              fmt::format("token shard {}: tokens [{}, {}) are outside [0, {})", path_, begin, begin + count,
                          header_.num_tokens),
              "this is a bug in the caller's indexing");
  if (header_.token_bytes == 2) {
    const auto* src = reinterpret_cast<const uint16_t*>(tokens_) + begin;
    for (int64_t i = 0; i < count; ++i) out[i] = int32_t(src[i]);
  } else if (count > 0) {  // an empty document may come with a null `out` (memcpy forbids it)
    std::memcpy(out, reinterpret_cast<const uint32_t*>(tokens_) + begin, size_t(count) * 4);
  }
}

}  // namespace titan::data
