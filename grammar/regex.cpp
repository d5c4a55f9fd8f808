#include "grammar/regex.h"

#include <algorithm>
#include <memory>
#include <string>

#include "grammar/code_set.h"
#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"

namespace exl {
namespace {

constexpr uint32_t kExpandLimit = 16;

struct RNode {
  enum class Kind { set, cat, alt, rep, bol, eol };
  Kind kind = Kind::cat;
  CodeSet set;
  std::vector<RNode> kids;
  uint32_t min = 0, max = 0;
};

CodeSet digit_set() { return CodeSet::range('0', '9'); }
CodeSet word_set() {
  CodeSet s = CodeSet::range('0', '9');
  s.add('A', 'Z');
  s.add('a', 'z');
  s.add('_', '_');
  return s;
}
CodeSet space_set() {
  CodeSet s = CodeSet::range(9, 13);
  for (uint32_t c : {0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu, 0x3000u, 0xFEFFu}) s.add(c, c);
  s.add(0x2000, 0x200A);
  return s;
}
CodeSet dot_set() {
  CodeSet s = CodeSet::all();
  CodeSet nl = CodeSet::single('\n');
  nl.add('\r', '\r');
  nl.add(0x2028, 0x2029);
  CodeSet out;
  for (auto [lo, hi] : nl.negated().ranges) out.ranges.push_back({lo, hi});
  out.normalize();
  return out;
}

class Parser {
 public:
  explicit Parser(std::string_view p) : p_(p) {}

  RNode parse() {
    RNode n = alt();
    if (pos_ < p_.size()) fail(p_[pos_] == ')' ? "unmatched ')'" : "unexpected character");
    return n;
  }

 private:
  std::string_view p_;
  size_t pos_ = 0;

  [[noreturn]] void fail(std::string_view what) const {
    grammar_fail("grammar: regex: '", p_, "' at ", pos_, ": ", what);
  }
  bool eof() const { return pos_ >= p_.size(); }
  char peek() const { return p_[pos_]; }

  uint32_t next_cp() {
    auto b = uint8_t(p_[pos_]);
    int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
    if (n == 0 || pos_ + size_t(n) > p_.size()) fail("invalid UTF-8");
    uint32_t c = n == 1 ? b : n == 2 ? (b & 0x1F) : n == 3 ? (b & 0x0F) : (b & 0x07);
    for (int i = 1; i < n; ++i) {
      auto cb = uint8_t(p_[pos_ + size_t(i)]);
      if ((cb & 0xC0) != 0x80) fail("invalid UTF-8");
      c = (c << 6) | (cb & 0x3F);
    }
    pos_ += size_t(n);
    return c;
  }

  RNode alt() {
    RNode first = cat();
    if (eof() || peek() != '|') return first;
    RNode n;
    n.kind = RNode::Kind::alt;
    n.kids.push_back(std::move(first));
    while (!eof() && peek() == '|') {
      ++pos_;
      n.kids.push_back(cat());
    }
    return n;
  }

  RNode cat() {
    RNode n;
    n.kind = RNode::Kind::cat;
    while (!eof() && peek() != '|' && peek() != ')') {
      RNode a = atom();
      quantify(a);
      n.kids.push_back(std::move(a));
    }
    return n;
  }

  bool parse_count(uint32_t& min, uint32_t& max) {
    size_t save = pos_;
    auto number = [&](uint32_t& v) {
      size_t start = pos_;
      uint64_t x = 0;
      while (!eof() && peek() >= '0' && peek() <= '9') {
        x = x * 10 + uint64_t(peek() - '0');
        if (x > 1000000) fail("repetition count too large");
        ++pos_;
      }
      v = uint32_t(x);
      return pos_ > start;
    };
    ++pos_;
    if (!number(min)) return pos_ = save, false;
    max = min;
    if (!eof() && peek() == ',') {
      ++pos_;
      if (!number(max)) max = kUnbounded;
    }
    if (eof() || peek() != '}') return pos_ = save, false;
    ++pos_;
    if (max < min) fail("repetition {m,n} with n < m");
    return true;
  }

  void quantify(RNode& a) {
    while (!eof()) {
      uint32_t min, max;
      char c = peek();
      if (c == '*') min = 0, max = kUnbounded, ++pos_;
      else if (c == '+') min = 1, max = kUnbounded, ++pos_;
      else if (c == '?') min = 0, max = 1, ++pos_;
      else if (c == '{') {
        if (!parse_count(min, max)) return;
      } else
        return;
      if (a.kind == RNode::Kind::bol || a.kind == RNode::Kind::eol) fail("quantifier after an anchor");
      if (!eof() && peek() == '?') ++pos_;
      RNode r;
      r.kind = RNode::Kind::rep;
      r.min = min;
      r.max = max;
      r.kids.push_back(std::move(a));
      a = std::move(r);
      if (!eof() && (peek() == '*' || peek() == '+' || peek() == '?' || peek() == '{'))
        if (peek() != '{') fail("nothing to repeat");
    }
  }

  static RNode set_node(CodeSet s) {
    RNode n;
    n.kind = RNode::Kind::set;
    n.set = std::move(s);
    return n;
  }

  RNode atom() {
    char c = peek();
    if (c == '(') return group();
    if (c == '[') return set_node(klass());
    if (c == '.') return ++pos_, set_node(dot_set());
    if (c == '^') return ++pos_, RNode{RNode::Kind::bol, {}, {}, 0, 0};
    if (c == '$') return ++pos_, RNode{RNode::Kind::eol, {}, {}, 0, 0};
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    if (c == '{') {
      uint32_t a, b;
      size_t save = pos_;
      if (parse_count(a, b)) pos_ = save, fail("nothing to repeat");
    }
    if (c == '\\') return set_node(escape(false));
    return set_node(CodeSet::single(next_cp()));
  }

  RNode group() {
    ++pos_;
    if (!eof() && peek() == '?') {
      ++pos_;
      if (eof()) fail("unterminated group");
      if (peek() == ':') {
        ++pos_;
      } else if (peek() == '<' && pos_ + 1 < p_.size() && p_[pos_ + 1] != '=' && p_[pos_ + 1] != '!') {
        while (!eof() && peek() != '>') ++pos_;
        if (eof()) fail("unterminated group name");
        ++pos_;
      } else if (peek() == '=' || peek() == '!' || peek() == '<') {
        fail("look-around assertions are not supported");
      } else {
        fail("unsupported group syntax (inline flags?)");
      }
    }
    RNode n = alt();
    if (eof() || peek() != ')') fail("missing ')'");
    ++pos_;
    return n;
  }

  uint32_t hex(size_t n) {
    uint32_t v = 0;
    for (size_t i = 0; i < n; ++i) {
      if (eof() || !isxdigit(uint8_t(peek()))) fail("bad hex escape");
      char h = peek();
      v = v * 16 + uint32_t(h <= '9' ? h - '0' : (h | 32) - 'a' + 10);
      ++pos_;
    }
    return v;
  }

  CodeSet escape(bool in_class) {
    size_t start = pos_;
    ++pos_;
    if (eof()) fail("trailing backslash");
    char c = peek();
    ++pos_;
    switch (c) {
      case 'd': return digit_set();
      case 'D': return digit_set().negated();
      case 'w': return word_set();
      case 'W': return word_set().negated();
      case 's': return space_set();
      case 'S': return space_set().negated();
      case 'n': return CodeSet::single('\n');
      case 'r': return CodeSet::single('\r');
      case 't': return CodeSet::single('\t');
      case 'f': return CodeSet::single('\f');
      case 'v': return CodeSet::single('\v');
      case '0':
        if (!eof() && peek() >= '0' && peek() <= '9') fail("octal escapes are not supported");
        return CodeSet::single(0);
      case 'x': return CodeSet::single(hex(2));
      case 'u': {
        if (!eof() && peek() == '{') {
          ++pos_;
          uint32_t v = 0;
          size_t digits = 0;
          while (!eof() && peek() != '}') {
            v = v * 16 + hex(1);
            if (++digits > 6 || v > kMaxCodePoint) fail("code point out of range");
          }
          if (eof() || digits == 0) fail("bad \\u{...} escape");
          ++pos_;
          return CodeSet::single(v);
        }
        uint32_t v = hex(4);
        if (v >= 0xD800 && v <= 0xDBFF && pos_ + 1 < p_.size() && p_[pos_] == '\\' && p_[pos_ + 1] == 'u') {
          size_t save = pos_;
          pos_ += 2;
          uint32_t lo = hex(4);
          if (lo >= 0xDC00 && lo <= 0xDFFF) return CodeSet::single(0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00));
          pos_ = save;
        }
        if (v >= 0xD800 && v <= 0xDFFF) fail("lone surrogate escape");
        return CodeSet::single(v);
      }
      case 'b':
        if (in_class) return CodeSet::single(8);
        pos_ = start;
        fail("word boundaries (\\b) are not supported");
      case 'B': pos_ = start; fail("word boundaries (\\B) are not supported");
      case 'p':
      case 'P': pos_ = start; fail("Unicode property classes (\\p{..}) are not supported");
      case 'k': pos_ = start; fail("named backreferences are not supported");
      case 'c': pos_ = start; fail("control escapes (\\cX) are not supported");
      default:
        if (c >= '1' && c <= '9') {
          pos_ = start;
          fail("backreferences are not supported");
        }
        --pos_;
        return CodeSet::single(next_cp());
    }
  }

  CodeSet klass() {
    ++pos_;
    bool neg = false;
    if (!eof() && peek() == '^') neg = true, ++pos_;
    CodeSet s;
    while (true) {
      if (eof()) fail("unterminated character class");
      if (peek() == ']') break;
      CodeSet a = class_atom();
      if (!eof() && peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        size_t dash = pos_;
        ++pos_;
        CodeSet b = class_atom();
        if (a.ranges.size() != 1 || a.ranges[0].first != a.ranges[0].second || b.ranges.size() != 1 ||
            b.ranges[0].first != b.ranges[0].second) {
          pos_ = dash;
          fail("class escape used as a range bound");
        }
        if (b.ranges[0].first < a.ranges[0].first) pos_ = dash, fail("range out of order in character class");
        s.ranges.push_back({a.ranges[0].first, b.ranges[0].first});
      } else {
        s.ranges.insert(s.ranges.end(), a.ranges.begin(), a.ranges.end());
      }
    }
    ++pos_;
    s.normalize();
    return neg ? s.negated() : s;
  }

  CodeSet class_atom() {
    if (peek() == '\\') {
      if (pos_ + 1 < p_.size() && p_[pos_ + 1] == '-') return pos_ += 2, CodeSet::single('-');
      return escape(true);
    }
    uint32_t c = next_cp();
    CodeSet s;
    s.ranges.push_back({c, c});
    return s;
  }
};

struct Emitter {
  GrammarBuilder& gb;
  const RegexOptions& opts;
  std::string_view pattern;

  Frag emit(int32_t rule, const RNode& n) {
    FragBuilder fb = gb.frags(rule);
    switch (n.kind) {
      case RNode::Kind::set: return emit_code_set(fb, n.set, opts.json_string);
      case RNode::Kind::cat: {
        std::vector<Frag> parts;
        for (const RNode& k : n.kids) parts.push_back(emit(rule, k));
        return gb.frags(rule).seq(parts);
      }
      case RNode::Kind::alt: {
        std::vector<Frag> parts;
        for (const RNode& k : n.kids) parts.push_back(emit(rule, k));
        return gb.frags(rule).alt(parts);
      }
      case RNode::Kind::rep: return emit_rep(rule, n);
      case RNode::Kind::bol:
      case RNode::Kind::eol:
        grammar_fail("grammar: regex: '", pattern, "': anchors (^ $) are only supported at the start or end of a top-level alternative");
    }
    return fb.empty();
  }

  // Refuses, before anything is expanded, a counted repetition whose automaton would pass the
  // per-automaton state limit: about `copies` times the states of one copy of the body.
  void check_expansion(const RNode& body, const RNode& n, uint32_t copies) {
    GrammarBuilder scratch;
    int32_t r = scratch.add_rule("count");
    scratch.frags(r).set_root(Emitter{scratch, opts, pattern}.emit(r, body));
    const size_t limit = grammar_automaton_limit();
    const Rule one = determinize_bytes(scratch.nfa(r), "count", limit);
    const size_t need = size_t(copies) * std::max<size_t>(1, one.states.size() - 1);
    if (need > limit) {
      std::string count = "{" + std::to_string(n.min) + (n.max == n.min ? "" : ",") +
                          (n.max == kUnbounded || n.max == n.min ? "" : std::to_string(n.max)) + "}";
      grammar_fail("grammar: regex: '", pattern, "': the repetition ", count, " needs about ", need,
                   " automaton states, more than the limit of ", limit);
    }
    grammar_charge(0, need * (sizeof(NfaEdge) + sizeof(std::vector<NfaEdge>)));
  }

  Frag emit_rep(int32_t rule, const RNode& n) {
    const RNode& k = n.kids[0];
    bool big = n.min > kExpandLimit || (n.max != kUnbounded && n.max > kExpandLimit);
    if (big && !opts.byte_only) {
      int32_t body = gb.add_rule(gb.name(rule) + "/rep");
      gb.frags(body).set_root(emit(body, k));
      int32_t rep = gb.add_repeat(gb.name(rule) + "/count", body, n.min, n.max);
      return gb.frags(rule).call(rep);
    }
    const uint32_t copies = n.max == kUnbounded ? n.min + 1 : n.max;
    if (copies > kExpandLimit) check_expansion(k, n, copies);
    // Optional copies as a flat chain (each copy's end may leave the repetition), never nested:
    // nested optionals give every position an epsilon closure as deep as the count, which made
    // the subset construction quadratic in it.
    std::vector<Frag> parts;
    for (uint32_t i = 0; i < n.min; ++i) parts.push_back(emit(rule, k));
    if (n.max == kUnbounded) {
      parts.push_back(gb.frags(rule).star(emit(rule, k)));
    } else if (n.max > n.min) {
      FragBuilder fb = gb.frags(rule);
      const int32_t in = gb.nfa(rule).add_state(), out = gb.nfa(rule).add_state();
      int32_t cur = in;
      for (uint32_t i = n.min; i < n.max; ++i) {
        Frag copy = emit(rule, k);
        fb.eps(cur, out);
        fb.eps(cur, copy.in);
        cur = copy.out;
      }
      fb.eps(cur, out);
      parts.push_back({in, out});
    }
    return gb.frags(rule).seq(parts);
  }
};

}  // namespace

Frag emit_regex(GrammarBuilder& gb, int32_t rule, std::string_view pattern, const RegexOptions& opts) {
  RNode root = Parser(pattern).parse();
  // Top-level alternatives, with the groups that hold anchors distributed over them ("^$|(^a+$)"
  // is "^$" or "^a+$", "^([^,]|$)" is "^[^,]" or "^$"), and alternatives dropped whose anchor
  // cannot hold (a '^' after a character, a '$' before one: "/^[0-9]{4}$/" matches nothing).
  auto has_anchor = [](auto&& self, const RNode& n) -> bool {
    if (n.kind == RNode::Kind::bol || n.kind == RNode::Kind::eol) return true;
    if (n.kind != RNode::Kind::cat && n.kind != RNode::Kind::alt) return false;
    for (const RNode& k : n.kids)
      if (self(self, k)) return true;
    return false;
  };
  auto min_len = [](auto&& self, const RNode& n) -> uint64_t {
    switch (n.kind) {
      case RNode::Kind::set: return 1;
      case RNode::Kind::bol:
      case RNode::Kind::eol: return 0;
      case RNode::Kind::rep: return n.min == 0 ? 0 : n.min * self(self, n.kids[0]);
      case RNode::Kind::cat: {
        uint64_t t = 0;
        for (const RNode& k : n.kids) t += self(self, k);
        return t;
      }
      case RNode::Kind::alt: {
        uint64_t m = UINT64_MAX;
        for (const RNode& k : n.kids) m = std::min(m, self(self, k));
        return m == UINT64_MAX ? 0 : m;
      }
    }
    return 0;
  };
  constexpr size_t kMaxAnchorAlternatives = 256;
  std::vector<RNode> alts;
  size_t distributed = 0;
  auto flatten = [&](auto&& self, RNode n) -> void {
    if (n.kind == RNode::Kind::alt) {
      for (RNode& k : n.kids) self(self, std::move(k));
      return;
    }
    if (n.kind != RNode::Kind::cat) {
      alts.push_back(std::move(n));
      return;
    }
    for (size_t i = 0; i < n.kids.size(); ++i) {
      RNode& k = n.kids[i];
      if ((k.kind != RNode::Kind::cat && k.kind != RNode::Kind::alt) || !has_anchor(has_anchor, k)) continue;
      if (k.kind == RNode::Kind::cat) {
        std::vector<RNode> inner = std::move(k.kids);
        n.kids.erase(n.kids.begin() + std::ptrdiff_t(i));
        n.kids.insert(n.kids.begin() + std::ptrdiff_t(i), std::make_move_iterator(inner.begin()),
                      std::make_move_iterator(inner.end()));
        self(self, std::move(n));
        return;
      }
      if ((distributed += k.kids.size()) > kMaxAnchorAlternatives) break;
      for (const RNode& x : k.kids) {
        RNode c = n;
        c.kids[i] = x;
        self(self, std::move(c));
      }
      return;
    }
    uint64_t before = 0, total = min_len(min_len, n);
    for (const RNode& k : n.kids) {
      if (k.kind == RNode::Kind::bol && before > 0) return;
      before += min_len(min_len, k);
      if (k.kind == RNode::Kind::eol && total > before) return;
    }
    alts.push_back(std::move(n));
  };
  flatten(flatten, std::move(root));
  Emitter em{gb, opts, pattern};
  // Alternatives with the same anchors share one search prefix and suffix: separate ones would
  // make the automaton track which alternatives have matched (2^n states for n alternatives).
  std::vector<Frag> groups[2][2];
  for (RNode& a : alts) {
    bool bol = false, eol = false;
    if (a.kind == RNode::Kind::cat) {
      if (!a.kids.empty() && a.kids.front().kind == RNode::Kind::bol) bol = true, a.kids.erase(a.kids.begin());
      if (!a.kids.empty() && a.kids.back().kind == RNode::Kind::eol) eol = true, a.kids.pop_back();
    }
    groups[bol][eol].push_back(em.emit(rule, a));
  }
  auto any_star = [&] {
    FragBuilder fb = gb.frags(rule);
    Frag ch = emit_code_set(fb, CodeSet::all(), opts.json_string);
    return gb.frags(rule).star(ch);
  };
  std::vector<Frag> out;
  for (int bol = 0; bol < 2; ++bol)
    for (int eol = 0; eol < 2; ++eol) {
      if (groups[bol][eol].empty()) continue;
      std::vector<Frag> parts;
      if (opts.search && !bol) parts.push_back(any_star());
      parts.push_back(gb.frags(rule).alt(groups[bol][eol]));
      if (opts.search && !eol) parts.push_back(any_star());
      out.push_back(gb.frags(rule).seq(parts));
    }
  return gb.frags(rule).alt(out);
}

Grammar compile_regex_grammar(std::string_view pattern, const GrammarBudget& budget) {
  return with_grammar_budget(budget, [&] {
    GrammarBuilder gb;
    int32_t root = gb.add_rule("regex");
    gb.frags(root).set_root(emit_regex(gb, root, pattern, {}));
    return gb.finish(root);
  });
}

}  // namespace exl
