#include "grammar/grammar_compose.h"

#include "grammar/grammar_error.h"

namespace exl {

namespace {

// A rule with identity byte classes, built state by state.
struct ChainRule {
  Rule r;
  explicit ChainRule(std::string name) {
    r.name = std::move(name);
    for (int b = 0; b < 256; ++b) r.byte_class[size_t(b)] = uint8_t(b);
    r.n_classes = 256;
    add_state();
  }
  int32_t add_state() {
    r.states.emplace_back();
    r.trans.resize(r.trans.size() + 256, -1);
    return int32_t(r.states.size() - 1);
  }
  // Bytes of s from `from`; returns the state after them.
  int32_t literal(int32_t from, std::string_view s) {
    for (char c : s) {
      int32_t to = add_state();
      r.trans[size_t(from) * 256 + uint8_t(c)] = to;
      r.states[size_t(from)].has_bytes = true;
      from = to;
    }
    return from;
  }
  int32_t call(int32_t from, int32_t callee, int32_t to = -1) {
    if (to < 0) to = add_state();
    r.states[size_t(from)].calls.push_back({callee, to});
    return to;
  }
};

}  // namespace

int32_t GrammarComposer::add(Rule r) {
  rules_.push_back(std::move(r));
  return int32_t(rules_.size() - 1);
}

int32_t GrammarComposer::embed(const Grammar& g) {
  const auto base = int32_t(rules_.size());
  for (Rule r : g.rules) {
    if (r.kind == Rule::Kind::repeat) r.body += base;
    for (DfaState& s : r.states)
      for (CallEdge& e : s.calls) e.callee += base;
    rules_.push_back(std::move(r));
  }
  return base + g.root;
}

int32_t GrammarComposer::sequence(std::string name, const std::vector<SeqItem>& items) {
  ChainRule c(std::move(name));
  int32_t s = 0;
  bool consumes = false;
  for (const SeqItem& it : items) {
    if (it.rule >= 0) {
      if (size_t(it.rule) >= rules_.size()) grammar_fail("grammar: compose: '", c.r.name, "' calls unknown rule ", it.rule);
      s = c.call(s, it.rule);
      consumes = true;
    } else if (!it.literal.empty()) {
      s = c.literal(s, it.literal);
      consumes = true;
    }
  }
  if (!consumes) grammar_fail("grammar: compose: sequence '", c.r.name, "' has nothing to match");
  c.r.states[size_t(s)].accepting = true;
  return add(std::move(c.r));
}

int32_t GrammarComposer::alternatives(std::string name, const std::vector<int32_t>& rules) {
  if (rules.empty()) grammar_fail("grammar: compose: alternatives '", name, "' has no alternative");
  ChainRule c(std::move(name));
  const int32_t end = c.add_state();
  for (int32_t r : rules) {
    if (r < 0 || size_t(r) >= rules_.size()) grammar_fail("grammar: compose: '", c.r.name, "' calls unknown rule ", r);
    c.call(0, r, end);
  }
  c.r.states[size_t(end)].accepting = true;
  return add(std::move(c.r));
}

int32_t GrammarComposer::list(std::string name, int32_t item, std::string_view separator, bool many) {
  if (item < 0 || size_t(item) >= rules_.size()) grammar_fail("grammar: compose: list '", name, "' of unknown rule ", item);
  if (many && separator.empty()) grammar_fail("grammar: compose: list '", name, "' needs a separator");
  ChainRule c(std::move(name));
  const int32_t after = c.call(0, item);
  c.r.states[size_t(after)].accepting = true;
  if (many) c.call(c.literal(after, separator), item, after);
  return add(std::move(c.r));
}

Grammar GrammarComposer::finish(int32_t root) {
  if (root < 0 || size_t(root) >= rules_.size()) grammar_fail("grammar: compose: unknown root rule ", root);
  Grammar g;
  g.rules = std::move(rules_);
  g.root = root;
  rules_.clear();
  return g;
}

}  // namespace exl
