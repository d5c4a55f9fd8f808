#include "grammar/matcher.h"

#include <mutex>

#include "grammar/grammar_error.h"
#include "grammar/match_caches.h"

namespace exl {

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenIndex> index)
    : grammar_(std::move(grammar)), index_(std::move(index)),
      caches_(std::make_unique<MatchCaches>(grammar_, index_.get())) {
  for (const Rule& r : grammar_.rules) {
    rule_bytes_ += sizeof(Rule) + r.name.size() + r.trans.size() * sizeof(int32_t) + r.states.size() * sizeof(DfaState);
    for (const DfaState& s : r.states) rule_bytes_ += s.calls.size() * sizeof(CallEdge);
  }
}

size_t CompiledGrammar::memory_bytes() const {
  std::lock_guard lock(caches_->mu);
  return sizeof(CompiledGrammar) + rule_bytes_ + caches_->memory_bytes();
}

CompiledGrammar::~CompiledGrammar() = default;

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) : g_(std::move(grammar)) {
  MatchCaches& rt = g_->caches();
  std::lock_guard lock(rt.mu);
  history_.push_back(rt.start(g_->grammar().root, 0, MatchCaches::kRoot));
  term_history_.push_back(false);
}

void Matcher::fill_mask(std::span<uint32_t> mask) {
  MatchCaches& rt = g_->caches();
  if (!rt.index()) grammar_fail("grammar: matcher: fill_mask needs a grammar compiled with a token index");
  if (mask.size() < rt.index()->mask_words())
    grammar_fail("grammar: matcher: mask has ", mask.size(), " words, need ", rt.index()->mask_words());
  if (terminated_) return;
  std::lock_guard lock(rt.mu);
  const std::vector<uint32_t>& m = rt.mask(history_.back());
  for (size_t w = 0; w < m.size(); ++w) mask[w] |= m[w];
}

bool Matcher::accept(int32_t token) {
  MatchCaches& rt = g_->caches();
  if (!rt.index()) grammar_fail("grammar: matcher: accept(token) needs a grammar compiled with a token index");
  if (token < 0 || size_t(token) >= rt.index()->vocab_size() || terminated_) return false;
  if (rt.index()->is_eos(token)) {
    if (!history_.back().accept) return false;
    history_.push_back(history_.back());
    terminated_ = true;
    term_history_.push_back(true);
    return true;
  }
  const std::string& b = rt.index()->bytes(token);
  if (b.empty()) return false;
  return accept_bytes(b);
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (terminated_) return false;
  MatchCaches& rt = g_->caches();
  std::lock_guard lock(rt.mu);
  MatchState cur = history_.back();
  if (!rt.walk_bytes(cur, bytes)) return false;
  cur.barrier = false;
  history_.push_back(std::move(cur));
  term_history_.push_back(false);
  return true;
}

void Matcher::rollback(size_t n) {
  if (n > steps()) grammar_fail("grammar: matcher: rollback(", n, ") past the start (", steps(), " steps)");
  history_.resize(history_.size() - n);
  term_history_.resize(term_history_.size() - n);
  terminated_ = term_history_.back();
}

std::string Matcher::forced_bytes() const {
  std::string out;
  if (terminated_) return out;
  MatchCaches& rt = g_->caches();
  std::lock_guard lock(rt.mu);
  MatchState cur = history_.back(), next;
  while (!cur.accept && out.size() < 4096) {
    const int only = rt.single_next_byte(cur);
    if (only == -2) return out;
    if (only < 0) break;
    rt.step(cur, uint8_t(only), next);
    std::swap(cur, next);
    out += char(only);
  }
  return out;
}

}  // namespace exl
