#include "grammar/matcher.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "grammar/grammar_error.h"

namespace exl {

namespace {

constexpr int32_t kRoot = -1;
constexpr int32_t kBarrier = -2;
constexpr size_t kMaxClosure = 200000;
constexpr size_t kMaskCacheEntries = 2048;

struct NodeKey {
  int32_t rule, state, parent;
  bool operator==(const NodeKey&) const = default;
};
struct NodeKeyHash {
  size_t operator()(const NodeKey& k) const {
    uint64_t h = uint64_t(uint32_t(k.rule)) * 0x9E3779B97F4A7C15ull;
    h ^= (uint64_t(uint32_t(k.state)) + 0x7F4A7C15ull + (h << 6) + (h >> 2)) * 0xBF58476D1CE4E5B9ull;
    h ^= (uint64_t(uint32_t(k.parent)) + (h << 6) + (h >> 2)) * 0x94D049BB133111EBull;
    return size_t(h ^ (h >> 31));
  }
};

struct PositionMask {
  std::vector<uint32_t> bits;      // non-empty when the accepted set is large
  std::vector<int32_t> accepted;   // otherwise
  std::vector<int32_t> uncertain;  // need the real stack
};

}  // namespace

struct GrammarRuntime {
  const Grammar& g;
  const TokenIndex* idx;
  std::mutex mu;
  std::vector<NodeKey> nodes;
  std::unordered_map<NodeKey, int32_t, NodeKeyHash> node_ids;
  std::unordered_map<uint64_t, uint32_t> step_ids;
  std::deque<MatchState> step_results;
  std::unordered_map<uint64_t, PositionMask> positions;
  std::unordered_map<std::string, std::vector<uint32_t>> masks;
  // scratch
  std::vector<int32_t> work;
  std::vector<int32_t> seen;

  GrammarRuntime(const Grammar& gr, const TokenIndex* ix) : g(gr), idx(ix) { step_results.emplace_back(); }

  int32_t intern(int32_t rule, int32_t state, int32_t parent) {
    NodeKey k{rule, state, parent};
    auto [it, fresh] = node_ids.emplace(k, int32_t(nodes.size()));
    if (fresh) nodes.push_back(k);
    return it->second;
  }

  void pop_to(int32_t parent, MatchState& out) {
    if (parent == kRoot) out.accept = true;
    else if (parent == kBarrier) out.barrier = true;
    else work.push_back(parent);
  }

  // Expands calls and returns from `seeds` (already in work) into out.
  void closure(MatchState& out) {
    seen.clear();
    size_t steps = 0;
    while (!work.empty()) {
      int32_t n = work.back();
      work.pop_back();
      if (std::find(seen.begin(), seen.end(), n) != seen.end()) continue;
      seen.push_back(n);
      if (++steps > kMaxClosure) grammar_fail("grammar: matcher: stack expansion exceeds ", kMaxClosure, " frames");
      NodeKey k = nodes[size_t(n)];
      const Rule& r = g.rules[size_t(k.rule)];
      if (r.kind == Rule::Kind::repeat) {
        auto c = uint32_t(k.state);
        if (c < r.max) {
          uint32_t nc = (r.max == kUnbounded && c >= r.min) ? c : c + 1;
          int32_t ret = intern(k.rule, int32_t(nc), k.parent);
          work.push_back(intern(r.body, 0, ret));
        }
        if (c >= r.min) pop_to(k.parent, out);
        continue;
      }
      const DfaState& st = r.states[size_t(k.state)];
      if (st.has_bytes) out.nodes.push_back(n);
      for (const CallEdge& e : st.calls) {
        int32_t ret = intern(k.rule, e.next, k.parent);
        work.push_back(intern(e.callee, 0, ret));
      }
      if (st.accepting) pop_to(k.parent, out);
    }
    std::sort(out.nodes.begin(), out.nodes.end());
    out.nodes.erase(std::unique(out.nodes.begin(), out.nodes.end()), out.nodes.end());
  }

  MatchState start(int32_t rule, int32_t state, int32_t parent) {
    MatchState s;
    work.push_back(intern(rule, state, parent));
    closure(s);
    return s;
  }

  const MatchState& step1(int32_t n, uint8_t b) {
    uint64_t key = (uint64_t(uint32_t(n)) << 8) | b;
    auto it = step_ids.find(key);
    if (it != step_ids.end()) return step_results[it->second];
    NodeKey k = nodes[size_t(n)];
    int32_t t = g.rules[size_t(k.rule)].step(k.state, b);
    uint32_t id = 0;
    if (t >= 0) {
      MatchState s;
      work.push_back(intern(k.rule, t, k.parent));
      closure(s);
      id = uint32_t(step_results.size());
      step_results.push_back(std::move(s));
    }
    step_ids.emplace(key, id);
    return step_results[id];
  }

  void step(const MatchState& in, uint8_t b, MatchState& out) {
    out.nodes.clear();
    out.accept = out.barrier = false;
    for (int32_t n : in.nodes) {
      const MatchState& r = step1(n, b);
      out.nodes.insert(out.nodes.end(), r.nodes.begin(), r.nodes.end());
      out.accept |= r.accept;
      out.barrier |= r.barrier;
    }
    if (in.nodes.size() > 1) {
      std::sort(out.nodes.begin(), out.nodes.end());
      out.nodes.erase(std::unique(out.nodes.begin(), out.nodes.end()), out.nodes.end());
    }
  }

  bool walk_bytes(MatchState& cur, std::string_view bytes) {
    MatchState next;
    for (char c : bytes) {
      step(cur, uint8_t(c), next);
      if (next.dead()) return false;
      std::swap(cur, next);
    }
    return true;
  }

  const PositionMask& position(int32_t rule, int32_t state) {
    uint64_t key = (uint64_t(uint32_t(rule)) << 32) | uint32_t(state);
    auto it = positions.find(key);
    if (it != positions.end()) return it->second;
    PositionMask pm = compute_position(rule, state);
    return positions.emplace(key, std::move(pm)).first->second;
  }

  PositionMask compute_position(int32_t rule, int32_t state) {
    const auto& tn = idx->nodes();
    const auto& toks = idx->trie_tokens();
    std::vector<MatchState> lv(1);
    std::vector<uint8_t> bseen(1, 0);
    lv[0] = start(rule, state, kBarrier);
    lv[0].barrier = false;
    std::vector<int32_t> acc, unc;
    size_t i = 1;
    while (i < tn.size()) {
      const TrieNode& nd = tn[i];
      size_t d = nd.depth;
      if (lv.size() <= d) lv.resize(d + 1), bseen.resize(d + 1);
      step(lv[d - 1], nd.byte, lv[d]);
      bseen[d] = bseen[d - 1] || lv[d].barrier;
      bool alive = !lv[d].nodes.empty();
      for (uint32_t t = nd.tok_begin; t < nd.tok_end; ++t) {
        if (alive || lv[d].barrier) acc.push_back(toks[t]);
        else if (bseen[d - 1]) unc.push_back(toks[t]);
      }
      if (!alive) {
        if (bseen[d])
          for (size_t j = i + 1; j < nd.subtree_end; ++j)
            for (uint32_t t = tn[j].tok_begin; t < tn[j].tok_end; ++t) unc.push_back(toks[t]);
        i = nd.subtree_end;
        continue;
      }
      ++i;
    }
    PositionMask pm;
    if (acc.size() > idx->mask_words()) {
      pm.bits.assign(idx->mask_words(), 0);
      for (int32_t t : acc) pm.bits[size_t(t) / 32] |= 1u << (t % 32);
    } else {
      pm.accepted = std::move(acc);
    }
    pm.uncertain = std::move(unc);
    return pm;
  }

  const std::vector<uint32_t>& mask(const MatchState& s) {
    std::string key(reinterpret_cast<const char*>(s.nodes.data()), s.nodes.size() * sizeof(int32_t));
    key += s.accept ? '1' : '0';
    auto it = masks.find(key);
    if (it != masks.end()) return it->second;
    if (masks.size() >= kMaskCacheEntries) masks.clear();
    std::vector<uint32_t> m(idx->mask_words(), 0);
    MatchState cur;
    for (int32_t n : s.nodes) {
      NodeKey k = nodes[size_t(n)];
      const PositionMask& pm = position(k.rule, k.state);
      if (!pm.bits.empty())
        for (size_t w = 0; w < m.size(); ++w) m[w] |= pm.bits[w];
      for (int32_t t : pm.accepted) m[size_t(t) / 32] |= 1u << (t % 32);
      for (int32_t t : pm.uncertain) {
        if (m[size_t(t) / 32] & (1u << (t % 32))) continue;
        cur.nodes.assign(1, n);
        cur.accept = cur.barrier = false;
        if (walk_bytes(cur, idx->bytes(t))) m[size_t(t) / 32] |= 1u << (t % 32);
      }
    }
    if (s.accept)
      for (int32_t e : idx->eos_ids()) m[size_t(e) / 32] |= 1u << (e % 32);
    return masks.emplace(std::move(key), std::move(m)).first->second;
  }
};

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenIndex> index)
    : grammar_(std::move(grammar)), index_(std::move(index)),
      runtime_(std::make_unique<GrammarRuntime>(grammar_, index_.get())) {}

CompiledGrammar::~CompiledGrammar() = default;

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar) : g_(std::move(grammar)) {
  GrammarRuntime& rt = g_->runtime();
  std::lock_guard lock(rt.mu);
  history_.push_back(rt.start(g_->grammar().root, 0, kRoot));
  term_history_.push_back(false);
}

void Matcher::fill_mask(std::span<uint32_t> mask) {
  GrammarRuntime& rt = g_->runtime();
  if (!rt.idx) grammar_fail("grammar: matcher: fill_mask needs a grammar compiled with a token index");
  if (mask.size() < rt.idx->mask_words())
    grammar_fail("grammar: matcher: mask has ", mask.size(), " words, need ", rt.idx->mask_words());
  if (terminated_) return;
  std::lock_guard lock(rt.mu);
  const std::vector<uint32_t>& m = rt.mask(history_.back());
  for (size_t w = 0; w < m.size(); ++w) mask[w] |= m[w];
}

bool Matcher::accept(int32_t token) {
  GrammarRuntime& rt = g_->runtime();
  if (!rt.idx) grammar_fail("grammar: matcher: accept(token) needs a grammar compiled with a token index");
  if (token < 0 || size_t(token) >= rt.idx->vocab_size() || terminated_) return false;
  if (rt.idx->is_eos(token)) {
    if (!history_.back().accept) return false;
    history_.push_back(history_.back());
    terminated_ = true;
    term_history_.push_back(true);
    return true;
  }
  const std::string& b = rt.idx->bytes(token);
  if (b.empty()) return false;
  return accept_bytes(b);
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (terminated_) return false;
  GrammarRuntime& rt = g_->runtime();
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
  GrammarRuntime& rt = g_->runtime();
  std::lock_guard lock(rt.mu);
  MatchState cur = history_.back(), next;
  while (!cur.accept && out.size() < 4096) {
    int only = -1;
    for (int32_t n : cur.nodes) {
      NodeKey k = rt.nodes[size_t(n)];
      const Rule& r = rt.g.rules[size_t(k.rule)];
      for (int b = 0; b < 256; ++b)
        if (r.step(k.state, uint8_t(b)) >= 0) {
          if (only >= 0 && only != b) return out;
          only = b;
        }
    }
    if (only < 0) break;
    rt.step(cur, uint8_t(only), next);
    std::swap(cur, next);
    out += char(only);
  }
  return out;
}

}  // namespace exl
