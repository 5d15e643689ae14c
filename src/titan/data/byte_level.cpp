#include "titan/data/byte_level.h"

#include <array>

namespace titan::data {
namespace {

// The code point standing for each byte, built as GPT-2's bytes_to_unicode does.
struct ByteMap {
  std::array<std::string, 256> chars;
  std::array<int16_t, 324> byte_of_code_point;  // -1 where no byte maps to the code point

  ByteMap() {
    byte_of_code_point.fill(-1);
    auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
    int next_extra = 256;
    for (int b = 0; b < 256; ++b) {
      const int cp = printable(b) ? b : next_extra++;
      byte_of_code_point[cp] = static_cast<int16_t>(b);
      // Every code point here is below U+0800: one or two UTF-8 bytes.
      if (cp < 0x80) {
        chars[b] = std::string(1, static_cast<char>(cp));
      } else {
        chars[b] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      }
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

}  // namespace

const std::string& byte_to_chars(uint8_t byte) { return byte_map().chars[byte]; }

std::string bytes_to_chars(std::string_view bytes) {
  const ByteMap& map = byte_map();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char b : bytes) out += map.chars[static_cast<uint8_t>(b)];
  return out;
}

std::string chars_to_bytes(std::string_view chars) {
  const ByteMap& map = byte_map();
  std::string out;
  out.reserve(chars.size());
  if (invalid_utf8_offset(chars) != std::string_view::npos) return std::string(chars);
  for (size_t pos = 0; pos < chars.size();) {
    const char32_t cp = next_code_point(chars, pos);
    if (cp >= map.byte_of_code_point.size() || map.byte_of_code_point[cp] < 0) return std::string(chars);
    out += static_cast<char>(map.byte_of_code_point[cp]);
  }
  return out;
}

size_t invalid_utf8_offset(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int length;
    char32_t min_cp;
    char32_t cp;
    if ((c & 0xE0) == 0xC0) {
      length = 2, min_cp = 0x80, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      length = 3, min_cp = 0x800, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      length = 4, min_cp = 0x10000, cp = c & 0x07;
    } else {
      return i;
    }
    if (i + length > n) return i;
    for (int k = 1; k < length; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min_cp || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += length;
  }
  return std::string_view::npos;
}

char32_t next_code_point(std::string_view text, size_t& pos) {
  const auto c = static_cast<unsigned char>(text[pos]);
  int length = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : 4;
  char32_t cp = length == 1 ? c : length == 2 ? (c & 0x1F) : length == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < length; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[pos + k]) & 0x3F);
  pos += length;
  return cp;
}

char32_t code_point_before(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return next_code_point(text, start);
}

bool is_unicode_whitespace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace titan::data
