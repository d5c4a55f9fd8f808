#include "grammar/code_set.h"

#include <algorithm>
#include <string>

namespace exl {

CodeSet CodeSet::range(uint32_t lo, uint32_t hi) {
  CodeSet s;
  s.add(lo, hi);
  return s;
}

void CodeSet::add(uint32_t lo, uint32_t hi) {
  if (lo > hi) return;
  ranges.push_back({lo, std::min(hi, kMaxCodePoint)});
  normalize();
}

void CodeSet::add(const CodeSet& o) {
  ranges.insert(ranges.end(), o.ranges.begin(), o.ranges.end());
  normalize();
}

void CodeSet::normalize() {
  std::vector<std::pair<uint32_t, uint32_t>> in;
  for (auto [lo, hi] : ranges) {
    if (lo <= 0xD7FF || hi >= 0xE000) {
      if (lo < 0xD800 && hi >= 0xD800) {
        in.push_back({lo, 0xD7FF});
        if (hi >= 0xE000) in.push_back({0xE000, hi});
      } else if (lo >= 0xD800 && lo <= 0xDFFF) {
        if (hi >= 0xE000) in.push_back({0xE000, hi});
      } else {
        in.push_back({lo, hi});
      }
    }
  }
  std::sort(in.begin(), in.end());
  ranges.clear();
  for (auto r : in) {
    if (!ranges.empty() && r.first <= ranges.back().second + 1)
      ranges.back().second = std::max(ranges.back().second, r.second);
    else
      ranges.push_back(r);
  }
}

CodeSet CodeSet::negated() const {
  CodeSet out;
  uint32_t next = 0;
  for (auto [lo, hi] : ranges) {
    if (lo > next) out.ranges.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodePoint) out.ranges.push_back({next, kMaxCodePoint});
  out.normalize();
  return out;
}

bool CodeSet::contains(uint32_t c) const {
  for (auto [lo, hi] : ranges)
    if (c >= lo && c <= hi) return true;
  return false;
}

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

namespace {

int utf8_len(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

// Splits [lo, hi] into ranges whose UTF-8 encodings are products of per-byte ranges.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::pair<std::string, std::string>>& out) {
  if (lo > hi) return;
  for (uint32_t b : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (lo <= b && hi > b) {
      utf8_sequences(lo, b, out);
      utf8_sequences(b + 1, hi, out);
      return;
    }
  int n = utf8_len(lo);
  for (int i = 1; i < n; ++i) {
    uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(a, lo);
  append_utf8(b, hi);
  out.push_back({a, b});
}

Frag emit_raw(FragBuilder& fb, const CodeSet& set) {
  std::vector<Frag> alts;
  std::vector<std::pair<std::string, std::string>> seqs;
  for (auto [lo, hi] : set.ranges) utf8_sequences(lo, hi, seqs);
  for (auto& [a, b] : seqs) {
    std::vector<Frag> parts;
    for (size_t i = 0; i < a.size(); ++i) parts.push_back(fb.bytes(uint8_t(a[i]), uint8_t(b[i])));
    alts.push_back(fb.seq(parts));
  }
  return fb.alt(alts);
}

Frag hex_digit(FragBuilder& fb, uint32_t v) {
  const char* digits = "0123456789abcdef";
  char lo = digits[v];
  if (v < 10) return fb.bytes(uint8_t(lo), uint8_t(lo));
  return fb.alt({fb.bytes(uint8_t(lo), uint8_t(lo)), fb.bytes(uint8_t(lo - 32), uint8_t(lo - 32))});
}

}  // namespace

Frag emit_code_set(FragBuilder& fb, const CodeSet& set, bool json_escape) {
  if (!json_escape) return emit_raw(fb, set);
  CodeSet plain;
  std::vector<Frag> alts;
  for (auto [lo, hi] : set.ranges) {
    for (uint32_t c = lo; c <= hi && c < 0x20; ++c) {
      switch (c) {
        case 8: alts.push_back(fb.literal("\\b")); break;
        case 9: alts.push_back(fb.literal("\\t")); break;
        case 10: alts.push_back(fb.literal("\\n")); break;
        case 12: alts.push_back(fb.literal("\\f")); break;
        case 13: alts.push_back(fb.literal("\\r")); break;
        default: alts.push_back(fb.seq({fb.literal("\\u00"), hex_digit(fb, c >> 4), hex_digit(fb, c & 15)}));
      }
    }
    if (lo <= '"' && hi >= '"') alts.push_back(fb.literal("\\\""));
    if (lo <= '\\' && hi >= '\\') alts.push_back(fb.literal("\\\\"));
    plain.ranges.push_back({lo, hi});
  }
  CodeSet specials = CodeSet::range(0, 0x1F);
  specials.add('"', '"');
  specials.add('\\', '\\');
  CodeSet rest;
  CodeSet keep = specials.negated();
  for (auto [lo, hi] : plain.ranges)
    for (auto [klo, khi] : keep.ranges) {
      uint32_t a = std::max(lo, klo), b = std::min(hi, khi);
      if (a <= b) rest.ranges.push_back({a, b});
    }
  rest.normalize();
  if (!rest.empty()) alts.push_back(emit_raw(fb, rest));
  return fb.alt(alts);
}

}  // namespace exl
