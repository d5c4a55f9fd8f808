// Sets of Unicode code points (sorted, disjoint, non-adjacent ranges; surrogates never included)
// and their compilation into byte-level automaton fragments: raw UTF-8, or the JSON string-body
// encoding (", \ and control characters escaped the way a compact JSON serializer writes them).
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "grammar/grammar.h"

namespace exl {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

struct CodeSet {
  std::vector<std::pair<uint32_t, uint32_t>> ranges;

  static CodeSet single(uint32_t c) { return range(c, c); }
  static CodeSet range(uint32_t lo, uint32_t hi);
  static CodeSet all() { return range(0, kMaxCodePoint); }
  void add(uint32_t lo, uint32_t hi);
  void add(const CodeSet& o);
  CodeSet negated() const;
  bool empty() const { return ranges.empty(); }
  bool contains(uint32_t c) const;
  void normalize();  // sort, merge, drop surrogates
};

// A fragment accepting exactly one character of `set`, encoded as raw UTF-8 or, with json_escape,
// as it appears inside a JSON string: '"' -> \", '\' -> \\, \b \f \n \r \t, other controls below
// 0x20 -> \u00XX (hex digits in either case), everything else as raw UTF-8.
Frag emit_code_set(FragBuilder& fb, const CodeSet& set, bool json_escape);

// Appends the UTF-8 encoding of c.
void append_utf8(std::string& out, uint32_t c);

}  // namespace exl
