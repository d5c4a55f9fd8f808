#include "engine/tokenizer/byte_level.h"

#include <array>
#include <unordered_map>

#include "engine/tokenizer/utf8.h"

namespace exl::byte_level {

namespace {

struct Tables {
  std::array<std::string, 256> chars;
  std::unordered_map<char32_t, uint8_t> bytes;

  Tables() {
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      char32_t cp = printable ? static_cast<char32_t>(b) : next++;
      utf8::append(chars[b], cp);
      bytes.emplace(cp, static_cast<uint8_t>(b));
    }
  }
};

const Tables& tables() {
  static const Tables t;
  return t;
}

}  // namespace

const std::string& char_of(uint8_t b) { return tables().chars[b]; }

std::optional<uint8_t> byte_of(char32_t cp) {
  const auto& m = tables().bytes;
  auto it = m.find(cp);
  if (it == m.end()) return std::nullopt;
  return it->second;
}

std::string decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    utf8::Char c = utf8::decode(s, pos);
    auto b = c.valid ? byte_of(c.cp) : std::nullopt;
    if (!b) return std::string(s);
    out += static_cast<char>(*b);
    pos += c.len;
  }
  return out;
}

std::string encode(std::string_view s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) out += char_of(static_cast<uint8_t>(c));
  return out;
}

}  // namespace exl::byte_level
