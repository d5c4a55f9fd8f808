#include "grammar/matcher.h"

#include <algorithm>
#include <deque>
#include <mutex>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
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

}  // namespace

struct GrammarRuntime {
  static constexpr uint32_t kUnset = UINT32_MAX;
  const Grammar& g;
  const TokenIndex* idx;
  std::mutex mu;
  std::vector<NodeKey> nodes;
  std::vector<std::vector<uint32_t>> node_steps;  // per node, per byte class: index into step_results
  std::unordered_map<NodeKey, int32_t, NodeKeyHash> node_ids;
  std::deque<MatchState> step_results;  // [0] is the dead state
  std::unordered_map<uint64_t, std::shared_ptr<const PositionMask>> positions;
  std::unordered_map<std::string, std::vector<uint32_t>> masks;
  size_t max_depth = 0;
  std::vector<int32_t> work;
  std::vector<int32_t> seen;

  GrammarRuntime(const Grammar& gr, const TokenIndex* ix) : g(gr), idx(ix) {
    step_results.emplace_back();
    if (idx)
      for (const TrieNode& n : idx->nodes()) max_depth = std::max<size_t>(max_depth, n.depth);
  }

  int32_t intern(int32_t rule, int32_t state, int32_t parent) {
    NodeKey k{rule, state, parent};
    auto [it, fresh] = node_ids.emplace(k, int32_t(nodes.size()));
    if (fresh) {
      nodes.push_back(k);
      node_steps.emplace_back();
    }
    return it->second;
  }

  void pop_to(int32_t parent, MatchState& out) {
    if (parent == kRoot) out.accept = true;
    else if (parent == kBarrier) out.barrier = true;
    else work.push_back(parent);
  }

  // Expands calls and returns from the nodes in `work` into out.
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
      // Mask precomputation stops at calls out of the position's own frame: what a callee
      // accepts is looked at with the real stack (the callee's start is itself in the stack set),
      // so position masks depend on the position's rule alone.
      if (k.parent == kBarrier && !st.calls.empty()) out.barrier = true;
      else for (const CallEdge& e : st.calls) {
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
    NodeKey k = nodes[size_t(n)];
    const Rule& r = g.rules[size_t(k.rule)];
    uint8_t cls = r.byte_class[b];
    if (node_steps[size_t(n)].empty()) node_steps[size_t(n)].assign(size_t(r.n_classes), kUnset);
    uint32_t id = node_steps[size_t(n)][cls];
    if (id != kUnset) return step_results[id];
    int32_t t = r.trans[size_t(k.state) * size_t(r.n_classes) + cls];
    id = 0;
    if (t >= 0) {
      MatchState s;
      work.push_back(intern(k.rule, t, k.parent));
      closure(s);
      id = uint32_t(step_results.size());
      step_results.push_back(std::move(s));
    }
    node_steps[size_t(n)][cls] = id;
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

  // The state after byte b; single-node states come straight from the step cache.
  const MatchState* advance(const MatchState& in, uint8_t b, MatchState& buf) {
    if (in.nodes.size() == 1) return &step1(in.nodes[0], b);
    step(in, b, buf);
    return &buf;
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

  // A canonical serialization of the byte automaton reachable from (rule, state), calls marked
  // but not followed: position masks depend on nothing else, so vocabularies share them.
  std::optional<std::string> callfree_key(int32_t rule, int32_t state) const {
    const Rule& r = g.rules[size_t(rule)];
    if (r.kind != Rule::Kind::automaton) return std::nullopt;
    std::vector<int32_t> id(r.states.size(), -1);
    std::vector<int32_t> order{state};
    id[size_t(state)] = 0;
    std::string key;
    if (r.states.size() > 512) return std::nullopt;
    for (size_t i = 0; i < order.size(); ++i) {
      int32_t s = order[i];
      key += r.states[size_t(s)].accepting ? 'A' : 'N';
      key += r.states[size_t(s)].calls.empty() ? 'n' : 'c';
      for (int b = 0; b < 256;) {
        int32_t t = r.step(s, uint8_t(b));
        int e = b;
        while (e + 1 < 256 && r.step(s, uint8_t(e + 1)) == t) ++e;
        if (t >= 0) {
          if (id[size_t(t)] < 0) id[size_t(t)] = int32_t(order.size()), order.push_back(t);
          int32_t v = id[size_t(t)];
          key += char(b);
          key += char(e);
          key.append(reinterpret_cast<const char*>(&v), sizeof v);
        }
        b = e + 1;
      }
      key += ';';
    }
    return key;
  }

  const PositionMask& position(int32_t rule, int32_t state) {
    uint64_t key = (uint64_t(uint32_t(rule)) << 32) | uint32_t(state);
    auto it = positions.find(key);
    if (it != positions.end()) return *it->second;
    std::optional<std::string> ck = callfree_key(rule, state);
    std::shared_ptr<const PositionMask> pm = ck ? idx->cached_mask(*ck) : nullptr;
    if (!pm) {
      auto t0 = std::chrono::steady_clock::now();
      pm = std::make_shared<const PositionMask>(compute_position(rule, state));
      if (std::getenv("EXL_GRAMMAR_DEBUG"))
        std::fprintf(stderr, "position %s:%d callfree=%d acc=%zu/%zu unc=%zu %.3f ms\n", g.rules[size_t(rule)].name.c_str(), state,
                     int(bool(ck)), pm->accepted.size(), pm->bits.size(), pm->uncertain.size(),
                     std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (ck) idx->cache_mask(*ck, pm);
    }
    return *positions.emplace(key, std::move(pm)).first->second;
  }

  PositionMask compute_position(int32_t rule, int32_t state) {
    const auto& tn = idx->nodes();
    const auto& toks = idx->trie_tokens();
    std::vector<const MatchState*> lv(max_depth + 1);
    std::vector<MatchState> buf(max_depth + 1);
    std::vector<uint8_t> bseen(max_depth + 1, 0);
    MatchState init = start(rule, state, kBarrier);
    init.barrier = false;
    lv[0] = &init;
    std::vector<int32_t> acc, unc;
    size_t i = 1;
    while (i < tn.size()) {
      const TrieNode& nd = tn[i];
      size_t d = nd.depth;
      const MatchState* cur = advance(*lv[d - 1], nd.byte, buf[d]);
      lv[d] = cur;
      bseen[d] = bseen[d - 1] || cur->barrier;
      bool alive = !cur->nodes.empty();
      for (uint32_t t = nd.tok_begin; t < nd.tok_end; ++t) {
        if (alive || cur->barrier) acc.push_back(toks[t]);
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
    std::sort(unc.begin(), unc.end(), [&](int32_t a, int32_t b) { return idx->bytes(a) < idx->bytes(b); });
    pm.uncertain = std::move(unc);
    return pm;
  }

  // Marks the uncertain tokens of a position that node n accepts; tokens come sorted by bytes,
  // so states along a shared prefix are reused.
  void check_uncertain(int32_t n, const std::vector<int32_t>& tokens, std::vector<uint32_t>& m) {
    std::vector<const MatchState*> lv(max_depth + 1);
    std::vector<MatchState> buf(max_depth + 1);
    MatchState root;
    root.nodes.assign(1, n);
    lv[0] = &root;
    size_t computed = 0;
    bool dead_at_computed = false;
    std::string_view prev;
    for (int32_t t : tokens) {
      if (m[size_t(t) / 32] & (1u << (t % 32))) continue;
      std::string_view b = idx->bytes(t);
      size_t lcp = 0;
      while (lcp < b.size() && lcp < prev.size() && b[lcp] == prev[lcp]) ++lcp;
      prev = b;
      size_t d = std::min(lcp, computed);
      if (d == computed && dead_at_computed) continue;
      computed = d;
      dead_at_computed = false;
      for (; computed < b.size(); ++computed) {
        const MatchState* next = advance(*lv[computed], uint8_t(b[computed]), buf[computed + 1]);
        lv[computed + 1] = next;
        if (next->dead()) {
          ++computed;
          dead_at_computed = true;
          break;
        }
      }
      if (!dead_at_computed) m[size_t(t) / 32] |= 1u << (t % 32);
    }
  }

  const std::vector<uint32_t>& mask(const MatchState& s) {
    std::string key(reinterpret_cast<const char*>(s.nodes.data()), s.nodes.size() * sizeof(int32_t));
    key += s.accept ? '1' : '0';
    auto it = masks.find(key);
    if (it != masks.end()) return it->second;
    if (masks.size() >= kMaskCacheEntries) masks.clear();
    std::vector<uint32_t> m(idx->mask_words(), 0);
    for (int32_t n : s.nodes) {
      NodeKey k = nodes[size_t(n)];
      const PositionMask& pm = position(k.rule, k.state);
      if (!pm.bits.empty())
        for (size_t w = 0; w < m.size(); ++w) m[w] |= pm.bits[w];
      for (int32_t t : pm.accepted) m[size_t(t) / 32] |= 1u << (t % 32);
      check_uncertain(n, pm.uncertain, m);
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
