#include "engine/tokenizer/split_regex.h"

#include <re2/re2.h>

#include "kernels/error.h"

namespace exl {

namespace {

// Oniguruma's Unicode \s: the White_Space property.
constexpr std::string_view kSpaceBody =
    "\\t-\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";
constexpr std::string_view kWordBody = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr std::string_view kDigitBody = "\\p{Nd}";
constexpr std::string_view kLookaheadTail = "\\s+(?!\\S)|\\s+";

[[noreturn]] void unsupported(std::string_view pattern, std::string_view what) {
  fail("engine: tokenizer: pre-tokenizer regex '", pattern, "': ", what, " is not supported");
}

std::string class_body(char e) {
  switch (e) {
    case 's': case 'S': return std::string(kSpaceBody);
    case 'w': case 'W': return std::string(kWordBody);
    default: return std::string(kDigitBody);
  }
}

// Translates one Oniguruma pattern fragment to RE2 syntax; see the header.
std::string translate(std::string_view full, std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\') {
      if (i + 1 >= p.size()) unsupported(full, "a trailing backslash");
      char e = p[++i];
      bool lower = e == 's' || e == 'w' || e == 'd';
      bool upper = e == 'S' || e == 'W' || e == 'D';
      if (lower && in_class) {
        out += class_body(e);
      } else if (lower) {
        out += '[';
        out += class_body(e);
        out += ']';
      } else if (upper && in_class) {
        unsupported(full, std::string("\\") + e + " inside a character class");
      } else if (upper) {
        out += "[^";
        out += class_body(e);
        out += ']';
      } else {
        out += '\\';
        out += e;
      }
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      if (c == '[') out += '\\';
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += "\\]", ++i;
      continue;
    }
    if (c == '(') {
      if (i + 1 < p.size() && p[i + 1] == '?') {
        std::string_view rest = p.substr(i + 2);
        if (rest.starts_with("=") || rest.starts_with("!") || rest.starts_with("<") || rest.starts_with(">"))
          unsupported(full, "look-around or atomic group");
        out += c;
      } else {
        out += "(?:";
      }
      continue;
    }
    out += c;
  }
  if (in_class) unsupported(full, "an unterminated character class");
  return out;
}

// False when `piece` holds an ASCII byte that is not whitespace (so no \s+ run matched it).
bool maybe_space(std::string_view piece) {
  for (char c : piece) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !(u == ' ' || (u >= '\t' && u <= '\r'))) return false;
  }
  return true;
}

}  // namespace

SplitRegex::SplitRegex(std::string_view pattern) {
  std::string_view head = pattern;
  if (head.ends_with(kLookaheadTail)) {
    head.remove_suffix(kLookaheadTail.size());
    if (!head.empty() && !head.ends_with("|")) unsupported(pattern, "'\\s+(?!\\S)|\\s+' not as top-level alternatives");
    lookahead_group_ = true;
  }
  translated_ = translate(pattern, head);
  if (lookahead_group_) {
    if (!translated_.empty()) translated_ = "(?:" + translated_.substr(0, translated_.size() - 1) + ")|";
    translated_ += "([" + std::string(kSpaceBody) + "]+)";
  }
  RE2::Options opt;
  opt.set_log_errors(false);
  // The Unicode classes make many DFA states: with 64 MiB, RE2's DFA cache refilled so often that
  // a 4,000-word prompt took 9 ms to split instead of 4.4 (dev box), the bulk of a served
  // request's time before its prefill (BENCHMARKS.md, session 25). The budget is used lazily.
  opt.set_max_mem(int64_t(256) << 20);
  re_ = std::make_unique<RE2>(translated_, opt);
  if (!re_->ok()) fail("engine: tokenizer: pre-tokenizer regex '", pattern, "': ", re_->error());
}

SplitRegex::~SplitRegex() = default;
SplitRegex::SplitRegex(SplitRegex&&) noexcept = default;
SplitRegex& SplitRegex::operator=(SplitRegex&&) noexcept = default;

void SplitRegex::split(std::string_view text, std::vector<std::string_view>& out) const {
  const size_t n = text.size();
  size_t pos = 0;       // where the next unemitted byte is
  size_t search = 0;    // where to search from (after an empty match it runs ahead of pos)
  re2::StringPiece m[2];
  while (search < n) {
    // The bounds alone (RE2's DFAs); which alternative matched is asked only of a match that may
    // be the whitespace group's: no letter, digit or punctuation in it.
    if (!re_->Match(text, search, n, RE2::UNANCHORED, m, 1)) break;
    size_t start = static_cast<size_t>(m[0].data() - text.data());
    size_t end = start + m[0].size();
    m[1] = re2::StringPiece();
    if (lookahead_group_ && end < n && maybe_space(m[0]))
      re_->Match(text, start, end, RE2::ANCHOR_BOTH, m, 2);
    if (lookahead_group_ && m[1].data() != nullptr && end < n) {
      size_t last = end - 1;
      while (last > start && (static_cast<unsigned char>(text[last]) & 0xC0) == 0x80) --last;
      if (last > start) end = last;
    }
    if (end == start) {
      search = start + 1;
      while (search < n && (static_cast<unsigned char>(text[search]) & 0xC0) == 0x80) ++search;
      continue;
    }
    if (start > pos) out.push_back(text.substr(pos, start - pos));
    out.push_back(text.substr(start, end - start));
    pos = search = end;
  }
  if (pos < n) out.push_back(text.substr(pos));
}

}  // namespace exl
