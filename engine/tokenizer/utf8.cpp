#include "engine/tokenizer/utf8.h"

namespace exl::utf8 {

namespace {

// The valid range of the second byte for a lead byte, and the sequence length (0: invalid lead).
struct Lead {
  int len;
  unsigned char lo, hi;
};

Lead lead_of(unsigned char b) {
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Length of the valid prefix of the sequence at pos (== lead.len when complete), and whether it
// stopped because the input ended.
struct Scan {
  size_t valid_len;
  bool truncated;
};

Scan scan(std::string_view s, size_t pos, const Lead& lead) {
  size_t n = 1;
  while (n < static_cast<size_t>(lead.len)) {
    if (pos + n >= s.size()) return {n, true};
    auto c = static_cast<unsigned char>(s[pos + n]);
    unsigned char lo = n == 1 ? lead.lo : 0x80, hi = n == 1 ? lead.hi : 0xBF;
    if (c < lo || c > hi) return {n, false};
    ++n;
  }
  return {n, false};
}

}  // namespace

Char decode(std::string_view s, size_t pos) {
  auto b = static_cast<unsigned char>(s[pos]);
  if (b < 0x80) return {b, 1, true};
  Lead lead = lead_of(b);
  if (lead.len == 0) return {0xFFFD, 1, false};
  Scan sc = scan(s, pos, lead);
  if (sc.valid_len < static_cast<size_t>(lead.len)) return {0xFFFD, sc.valid_len, false};
  char32_t cp = b & (0xFF >> (lead.len + 1));
  for (int i = 1; i < lead.len; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3F);
  return {cp, static_cast<size_t>(lead.len), true};
}

void append(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t append_lossy(std::string& out, std::string_view in, bool final) {
  size_t pos = 0;
  while (pos < in.size()) {
    auto b = static_cast<unsigned char>(in[pos]);
    if (b < 0x80) {
      out += static_cast<char>(b);
      ++pos;
      continue;
    }
    Lead lead = lead_of(b);
    if (lead.len == 0) {
      append(out, 0xFFFD);
      ++pos;
      continue;
    }
    Scan sc = scan(in, pos, lead);
    if (sc.valid_len == static_cast<size_t>(lead.len)) {
      out.append(in.substr(pos, sc.valid_len));
    } else {
      if (sc.truncated && !final) return pos;
      append(out, 0xFFFD);
    }
    pos += sc.valid_len;
  }
  return pos;
}

std::string lossy(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  append_lossy(out, in, true);
  return out;
}

bool is_valid(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    Char c = decode(s, pos);
    if (!c.valid) return false;
    pos += c.len;
  }
  return true;
}

}  // namespace exl::utf8
