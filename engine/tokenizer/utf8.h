// UTF-8 helpers for the tokenizers: code point iteration that tolerates invalid bytes, and the
// lossy conversion (each maximal invalid subpart becomes U+FFFD, as Rust's from_utf8_lossy and
// the WHATWG decoder do) that can run incrementally without ever splitting a character.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace exl::utf8 {

// U+2581 LOWER ONE EIGHTH BLOCK, the word-boundary marker of SentencePiece and Metaspace pipelines.
inline constexpr std::string_view kMetaspace = "\xE2\x96\x81";

// One decoded unit of a byte string: a valid character or one maximal invalid subpart.
struct Char {
  char32_t cp;   // the code point; 0xFFFD for an invalid subpart
  size_t len;    // bytes it spans (>= 1)
  bool valid;
};

// Decodes the unit starting at s[pos] (pos < s.size()).
Char decode(std::string_view s, size_t pos);

// Appends cp as UTF-8 (cp must be a Unicode scalar value).
void append(std::string& out, char32_t cp);

// Converts as much of `in` as is decided: valid characters are copied, invalid subparts become
// U+FFFD. Unless `final`, a trailing incomplete but still possibly valid sequence is left alone.
// Appends to `out` and returns the number of bytes of `in` consumed.
size_t append_lossy(std::string& out, std::string_view in, bool final);

// The whole of `in`, lossily converted.
std::string lossy(std::string_view in);

bool is_valid(std::string_view s);

}  // namespace exl::utf8
