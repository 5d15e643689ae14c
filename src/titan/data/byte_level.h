// Byte-level BPE's alphabet: every byte is one printable Unicode character (the GPT-2 map),
// plus the UTF-8 helpers the tokenizer needs to walk text safely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace titan::data {

// The character (UTF-8 encoded) that stands for `byte` in a byte-level vocabulary:
// printable Latin-1 bytes stand for themselves, the others map to U+0100.. in byte order.
const std::string& byte_to_chars(uint8_t byte);

// The byte-level characters of `bytes`, e.g. " the" -> "Ġthe": the form vocab entries take.
std::string bytes_to_chars(std::string_view bytes);

// The bytes a vocabulary entry stands for. An entry holding a character outside the byte map
// decodes to its own UTF-8 text, as Hugging Face's ByteLevel decoder does.
std::string chars_to_bytes(std::string_view chars);

// Byte offset of the first invalid UTF-8 sequence (overlong, surrogate, truncated, > U+10FFFF),
// or npos when `text` is valid.
size_t invalid_utf8_offset(std::string_view text);

// Decodes the code point at `pos` of valid UTF-8 and advances `pos` past it.
char32_t next_code_point(std::string_view text, size_t& pos);

// Decodes the code point that ends at `end` of valid UTF-8 (end > 0).
char32_t code_point_before(std::string_view text, size_t end);

// Unicode White_Space, the set Rust's char::is_whitespace uses for added-token lstrip/rstrip.
bool is_unicode_whitespace(char32_t c);

}  // namespace titan::data
