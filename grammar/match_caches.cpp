#include "grammar/match_caches.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "grammar/grammar_error.h"

namespace exl {

size_t MatchCaches::NodeKeyHash::operator()(const NodeKey& k) const {
  uint64_t h = uint64_t(uint32_t(k.rule)) * 0x9E3779B97F4A7C15ull;
  h ^= (uint64_t(uint32_t(k.state)) + 0x7F4A7C15ull + (h << 6) + (h >> 2)) * 0xBF58476D1CE4E5B9ull;
  h ^= (uint64_t(uint32_t(k.parent)) + (h << 6) + (h >> 2)) * 0x94D049BB133111EBull;
  return size_t(h ^ (h >> 31));
}

void MatchCaches::Scratch::prepare(size_t n) {
  if (a.size() < n) a.resize(n, kFar), b.resize(n, kFar);
}

void MatchCaches::Scratch::reset() {
  for (uint32_t p : touched) a[p] = b[p] = kFar;
  touched.clear();
}

MatchCaches::MatchCaches(const Grammar& grammar, const TokenIndex* ix)
    : g(grammar), idx(ix), rule_runs(grammar.rules.size()), rule_flags(grammar.rules.size()),
      rule_reach(grammar.rules.size()), rule_char_like(grammar.rules.size()),
      rule_class_steps(grammar.rules.size()), debug(std::getenv("EXL_GRAMMAR_DEBUG") != nullptr),
      verify(std::getenv("EXL_GRAMMAR_VERIFY") != nullptr) {
  step_results.emplace_back();
  if (idx) max_depth = idx->max_depth();
}

// The slot of k in t (t's size a power of two): where k's id is, or the empty slot to put it in.
size_t MatchCaches::NodeTable::slot(const std::vector<int32_t>& t, const NodeKey& k, const std::vector<NodeKey>& keys) {
  size_t m = t.size() - 1, i = NodeKeyHash{}(k) & m;
  while (t[i] >= 0 && !(keys[size_t(t[i])] == k)) i = (i + 1) & m;
  return i;
}

int32_t MatchCaches::NodeTable::find(const NodeKey& k, const std::vector<NodeKey>& keys) const {
  if (!cur.empty()) {
    int32_t id = cur[slot(cur, k, keys)];
    if (id >= 0) return id;
  }
  return old.empty() ? -1 : old[slot(old, k, keys)];
}

void MatchCaches::NodeTable::insert(int32_t id, const std::vector<NodeKey>& keys) {
  if (2 * (n_cur + 1) > cur.size()) {
    // old is drained long before cur is half full again: it held at most a quarter of cur's size
    for (; drain < old.size(); ++drain)
      if (old[drain] >= 0) cur[slot(cur, keys[size_t(old[drain])], keys)] = old[drain], ++n_cur;
    old = std::move(cur);
    cur.assign(std::max<size_t>(64, 2 * old.size()), -1);
    n_cur = 0;
    drain = 0;
  }
  cur[slot(cur, keys[size_t(id)], keys)] = id;
  ++n_cur;
  for (size_t moved = 0; moved < kMovesPerInsert && drain < old.size(); ++drain) {
    int32_t x = old[drain];
    if (x < 0) continue;
    cur[slot(cur, keys[size_t(x)], keys)] = x;
    ++n_cur;
    ++moved;
  }
  if (drain >= old.size() && !old.empty()) old = {}, drain = 0;
}

int32_t MatchCaches::intern(int32_t rule, int32_t state, int32_t parent) {
  NodeKey k{rule, state, parent};
  int32_t id = node_ids.find(k, nodes);
  if (id >= 0) return id;
  id = int32_t(nodes.size());
  nodes.push_back(k);
  node_ids.insert(id, nodes);
  node_steps.emplace_back();
  table_bytes += 2 * sizeof(NodeKey) + 2 * sizeof(int32_t) + sizeof(std::vector<uint32_t>) + 16;
  return id;
}

void MatchCaches::pop_to(int32_t parent, MatchState& out) {
  if (parent == kRoot) out.accept = true;
  else if (parent == kBarrier) out.barrier = true;
  else work.push_back(parent);
}

// Expands calls and returns from the nodes in `work` into out.
void MatchCaches::closure(MatchState& out) {
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

MatchState MatchCaches::start(int32_t rule, int32_t state, int32_t parent) {
  MatchState s;
  work.push_back(intern(rule, state, parent));
  closure(s);
  return s;
}

const MatchState& MatchCaches::step1(int32_t n, uint8_t b) {
  NodeKey k = nodes[size_t(n)];
  const Rule& r = g.rules[size_t(k.rule)];
  uint8_t cls = r.byte_class[b];
  if (node_steps[size_t(n)].empty()) {
    node_steps[size_t(n)].assign(size_t(r.n_classes), kUnset);
    table_bytes += size_t(r.n_classes) * sizeof(uint32_t);
  }
  uint32_t id = node_steps[size_t(n)][cls];
  if (id != kUnset) return step_results[id];
  int32_t t = r.trans[size_t(k.state) * size_t(r.n_classes) + cls];
  id = 0;
  if (t >= 0) {
    MatchState s;
    work.push_back(intern(k.rule, t, k.parent));
    closure(s);
    id = uint32_t(step_results.size());
    table_bytes += sizeof(MatchState) + s.nodes.size() * sizeof(int32_t);
    step_results.push_back(std::move(s));
  }
  node_steps[size_t(n)][cls] = id;
  return step_results[id];
}

void MatchCaches::step(const MatchState& in, uint8_t b, MatchState& out) {
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
const MatchState* MatchCaches::advance(const MatchState& in, uint8_t b, MatchState& buf) {
  if (in.nodes.size() == 1) return &step1(in.nodes[0], b);
  step(in, b, buf);
  return &buf;
}

bool MatchCaches::walk_bytes(MatchState& cur, std::string_view bytes) {
  MatchState next;
  for (char c : bytes) {
    step(cur, uint8_t(c), next);
    if (next.dead()) return false;
    std::swap(cur, next);
  }
  return true;
}

// Per rule: the byte runs of equal class, and per state whether it can consume a byte (1) and
// whether it leaves the position's frame (2: accepting or calling).
const std::vector<std::array<uint8_t, 3>>& MatchCaches::runs(int32_t rule) {
  auto& v = rule_runs[size_t(rule)];
  if (!v.empty()) return v;
  const Rule& r = g.rules[size_t(rule)];
  for (int b = 0; b < 256;) {
    int e = b;
    while (e + 1 < 256 && r.byte_class[size_t(e + 1)] == r.byte_class[size_t(b)]) ++e;
    v.push_back({uint8_t(b), uint8_t(e), r.byte_class[size_t(b)]});
    b = e + 1;
  }
  return v;
}

const std::vector<uint8_t>& MatchCaches::flags(int32_t rule) {
  auto& f = rule_flags[size_t(rule)];
  if (!f.empty()) return f;
  const Rule& r = g.rules[size_t(rule)];
  f.resize(r.states.size());
  for (size_t s = 0; s < r.states.size(); ++s)
    f[s] = uint8_t((r.states[s].has_bytes ? 1 : 0) | (r.states[s].accepting || !r.states[s].calls.empty() ? 2 : 0));
  return f;
}

// A canonical serialization of the byte automaton reachable from (rule, state), calls marked
// but not followed: position masks depend on nothing else, so vocabularies share them. Only for
// small reachable parts (larger ones are computed per grammar).
std::optional<std::string> MatchCaches::callfree_key(int32_t rule, int32_t state) {
  constexpr size_t kMaxKeyStates = 128;  // the one-character JSON string rule has 79
  const Rule& r = g.rules[size_t(rule)];
  const auto& rn = runs(rule);
  std::vector<std::pair<int32_t, int32_t>> id;  // (state, canonical id), small
  auto lookup = [&](int32_t s) {
    for (auto [k, v] : id)
      if (k == s) return v;
    return -1;
  };
  std::vector<int32_t> order{state};
  id.push_back({state, 0});
  std::string key;
  for (size_t i = 0; i < order.size(); ++i) {
    int32_t s = order[i];
    key += r.states[size_t(s)].accepting ? 'A' : 'N';
    key += r.states[size_t(s)].calls.empty() ? 'n' : 'c';
    const int32_t* row = &r.trans[size_t(s) * size_t(r.n_classes)];
    for (size_t k = 0; k < rn.size();) {
      int32_t t = row[rn[k][2]];
      size_t e = k;
      while (e + 1 < rn.size() && row[rn[e + 1][2]] == t) ++e;
      if (t >= 0) {
        int32_t v = lookup(t);
        if (v < 0) {
          if (order.size() >= kMaxKeyStates) return std::nullopt;
          v = int32_t(order.size());
          id.push_back({t, v});
          order.push_back(t);
        }
        key += char(rn[k][0]);
        key += char(rn[e][1]);
        key.append(reinterpret_cast<const char*>(&v), sizeof v);
      }
      k = e + 1;
    }
    key += ';';
  }
  return key;
}

const PositionMask& MatchCaches::position(int32_t rule, int32_t state) {
  uint64_t key = (uint64_t(uint32_t(rule)) << 32) | uint32_t(state);
  auto it = positions.find(key);
  if (it != positions.end()) return *it->second;
  std::optional<std::string> ck = callfree_key(rule, state);
  std::shared_ptr<const PositionMask> pm = ck ? idx->cached_mask(*ck) : nullptr;
  if (!pm) {
    auto t0 = std::chrono::steady_clock::now();
    pm = std::make_shared<const PositionMask>(compute_position(rule, state));
    if (debug)
      std::fprintf(stderr, "position %s:%d callfree=%d slice=%d acc=%zu/%zu unc=%zu %.3f ms\n",
                   g.rules[size_t(rule)].name.c_str(), state, int(bool(ck)), pm->slice, pm->accepted.size(),
                   pm->bits.size(), pm->uncertain.size(),
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (ck) idx->cache_mask(*ck, pm);
  }
  table_bytes += sizeof(PositionMask) + 32 +
                 (pm->bits.size() + pm->accepted.size() + pm->uncertain.size()) * sizeof(int32_t);
  return *positions.emplace(key, std::move(pm)).first->second;
}

// Per language state u of a slice: the distinct (byte class of the rule, next u) pairs of its
// byte ranges.
const MatchCaches::ClassSteps& MatchCaches::class_steps(int32_t rule, size_t slice) {
  auto& per = rule_class_steps[size_t(rule)];
  if (per.size() <= slice) per.resize(slice + 1);
  ClassSteps& cs = per[slice];
  if (!cs.empty()) return cs;
  const Rule& r = g.rules[size_t(rule)];
  const TokenSlice& sl = idx->slices()[slice];
  cs.resize(sl.states.size());
  for (size_t u = 0; u < sl.states.size(); ++u)
    for (const SliceRange& rg : sl.states[u])
      for (int b = rg.lo; b <= rg.hi; ++b) {
        std::pair<uint8_t, uint8_t> e{r.byte_class[size_t(b)], rg.next};
        if (std::find(cs[u].begin(), cs[u].end(), e) == cs[u].end()) cs[u].push_back(e);
      }
  return cs;
}

// Successors of product node p = s * nu + u (through bytes that keep the rule alive), whether
// some language byte dies there (bad) and whether one returns or calls (dirty); with `clean`
// only the successors whose state neither accepts nor calls.
void MatchCaches::expand(const Rule& r, const uint8_t* fl, const ClassSteps& cs, uint32_t p, bool clean,
                          std::vector<uint32_t>& succ, bool& bad, bool& dirty) {
  size_t nu = cs.size(), st = p / nu, u = p % nu;
  const int32_t* row = &r.trans[st * size_t(r.n_classes)];
  succ.clear();
  bad = dirty = false;
  for (auto [c, next] : cs[u]) {
    int32_t t = row[c];
    uint8_t f = t >= 0 ? fl[size_t(t)] : 0;
    if (!(f & 1)) bad = true;
    if (f & 2) dirty = true;
    if (!(f & 1) || (clean && (f & 2))) continue;
    succ.push_back(uint32_t(size_t(t) * nu + next));
  }
}

// For (rule, state) and a slice: `reach` = how many characters of the slice's language can be
// read from the state (at a character boundary) with the automaton still able to go on, i.e.
// the distance to the nearest (state, language state) pair where some language byte dies
// (kFar: none within the slice's longest member); `exact` = whether every longer string of the
// language dies within the rule before any return or call (so no slice member longer than
// `reach` is accepted or uncertain there). Searched forward from the state over the product
// with the language automaton, no deeper than the slice's longest member.
std::pair<uint32_t, bool> MatchCaches::reach_from(int32_t rule, int32_t state, size_t slice) {
  const Rule& r = g.rules[size_t(rule)];
  const uint8_t* fl = flags(rule).data();
  const ClassSteps& cs = class_steps(rule, slice);
  const size_t nu = cs.size();
  const auto limit = uint32_t(idx->slices()[slice].short_len + 1);
  auto w = [&](uint32_t p) { return p % nu == 0 ? 1u : 0u; };
  scratch.prepare(r.states.size() * nu);
  std::vector<uint32_t>& cost = scratch.a;  // kFar: not seen
  std::vector<uint32_t>& longest = scratch.b;
  std::vector<uint32_t>& touched = scratch.touched;
  struct Reset {
    Scratch& s;
    ~Reset() { s.reset(); }
  } reset{scratch};
  std::deque<uint32_t> dq;
  std::vector<uint32_t> succ;
  auto root = uint32_t(size_t(state) * nu);
  cost[root] = 1;
  touched.push_back(root);
  dq.push_back(root);
  uint32_t d = kFar;
  bool bad = false, dirty = false;
  while (!dq.empty()) {
    uint32_t p = dq.front();
    dq.pop_front();
    uint32_t c = cost[p];
    if (c > limit) break;
    expand(r, fl, cs, p, false, succ, bad, dirty);
    if (bad) {
      d = c;
      break;
    }
    for (uint32_t q : succ) {
      uint32_t nc = c + w(q);
      if (cost[q] <= nc) continue;
      if (cost[q] == kFar) touched.push_back(q);
      cost[q] = nc;
      (w(q) ? dq.push_back(q) : dq.push_front(q));
    }
  }
  if (d == kFar || d > limit) return {kFar, false};
  // exact: the longest clean path from the root (characters, the last node not counted) is d-1
  constexpr uint32_t kOpen = kFar - 1;
  std::vector<std::pair<uint32_t, std::vector<uint32_t>>> stack;
  auto open = [&](uint32_t p) -> bool {
    expand(r, fl, cs, p, true, succ, bad, dirty);
    if (dirty) return false;
    if (cost[p] == kFar) touched.push_back(p), cost[p] = kOpen;
    longest[p] = kOpen;
    stack.push_back({p, succ});
    return true;
  };
  if (!open(root)) return {d - 1, false};
  std::vector<uint32_t> best{0};
  while (!stack.empty()) {
    auto& [p, rest] = stack.back();
    if (!rest.empty()) {
      uint32_t q = rest.back();
      rest.pop_back();
      uint32_t lq = longest[q];
      if (lq == kFar) {
        if (stack.size() > size_t(4) * limit + 4 || !open(q)) return {d - 1, false};
        best.push_back(0);
        continue;
      }
      if (lq == kOpen) return {d - 1, false};  // a cycle
      best.back() = std::max(best.back(), lq + w(p));
      if (best.back() > d - 1) return {d - 1, false};
      continue;
    }
    uint32_t v = best.back(), done = p;
    best.pop_back();
    longest[done] = v;
    stack.pop_back();
    if (!stack.empty()) {
      best.back() = std::max(best.back(), v + w(stack.back().first));
      if (best.back() > d - 1) return {d - 1, false};
    }
  }
  return {d - 1, longest[root] == d - 1};
}

const MatchCaches::SliceReach& MatchCaches::slice_reach(int32_t rule, int32_t state, size_t slice) {
  auto& cached = rule_reach[size_t(rule)];
  if (cached.size() <= slice) cached.resize(slice + 1);
  SliceReach& out = cached[slice];
  const Rule& r = g.rules[size_t(rule)];
  if (out.reach.empty()) {
    out.reach.assign(r.states.size(), kUnsetReach);
    out.exact.assign(r.states.size(), 0);
  }
  if (out.reach[size_t(state)] == kUnsetReach) {
    auto [reach, exact] = reach_from(rule, state, slice);
    out.reach[size_t(state)] = reach;
    out.exact[size_t(state)] = exact;
  }
  return out;
}

// Classifies the trie's tokens from (rule, state), following byte transitions only: accepted
// when the token ends inside the rule or exactly where it returns/calls; uncertain when it
// leaves the rule (returns or calls) before its end and then dies in the rule's own bytes.
void MatchCaches::walk_trie(int32_t rule, int32_t state, const TokenTrie& trie, std::vector<int32_t>& acc,
                            std::vector<int32_t>& unc) {
  const Rule& r = g.rules[size_t(rule)];
  const uint8_t* fl = flags(rule).data();
  const int32_t* trans = r.trans.data();
  const uint8_t* cls = r.byte_class.data();
  const auto nc = size_t(r.n_classes);
  const TrieNode* tn = trie.nodes.data();
  const int32_t* toks = trie.tokens.data();
  walk_state.resize(trie.max_depth + 1);
  walk_seen.resize(trie.max_depth + 1);
  int32_t* st = walk_state.data();
  uint8_t* bseen = walk_seen.data();
  st[0] = state;
  bseen[0] = 0;
  size_t n = trie.nodes.size();
  for (size_t i = 1; i < n;) {
    const TrieNode& nd = tn[i];
    size_t d = nd.depth;
    int32_t t = trans[size_t(st[d - 1]) * nc + cls[nd.byte]];
    uint8_t f = t >= 0 ? fl[t] : 0;
    uint8_t bprev = bseen[d - 1];
    if (nd.tok_begin != nd.tok_end) {
      if (f) acc.insert(acc.end(), toks + nd.tok_begin, toks + nd.tok_end);
      else if (bprev) unc.insert(unc.end(), toks + nd.tok_begin, toks + nd.tok_end);
    }
    if (!(f & 1)) {
      if (bprev || (f & 2))
        for (size_t j = i + 1; j < nd.subtree_end; ++j)
          unc.insert(unc.end(), toks + tn[j].tok_begin, toks + tn[j].tok_end);
      i = nd.subtree_end;
      continue;
    }
    st[d] = t;
    bseen[d] = uint8_t(bprev | (f & 2));
    ++i;
  }
}

// EXL_GRAMMAR_VERIFY: checks a sliced position against a walk of the whole trie.
void MatchCaches::verify_position(int32_t rule, int32_t state, const PositionMask& pm, std::vector<int32_t> acc,
                                  std::vector<int32_t> unc) {
  if (pm.slice >= 0) {
    const auto& sb = idx->slices()[size_t(pm.slice)].by_len[pm.slice_len];
    for (size_t t = 0; t < idx->vocab_size(); ++t)
      if (sb[t / 32] >> (t % 32) & 1) acc.push_back(int32_t(t));
  }
  std::vector<int32_t> fa, fu;
  walk_trie(rule, state, idx->trie(), fa, fu);
  for (auto* v : {&acc, &unc, &fa, &fu}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  if (acc != fa || unc != fu)
    grammar_fail("grammar: matcher: sliced position ", g.rules[size_t(rule)].name, ":", state, " differs from a full walk (",
                 acc.size(), "/", fa.size(), " accepted, ", unc.size(), "/", fu.size(), " uncertain)");
}

// EXL_GRAMMAR_VERIFY: the slice members among a node's uncertain tokens do pass the real stack.
void MatchCaches::verify_repeat_slice(int32_t n, const std::vector<int32_t>& uncertain, const std::vector<uint32_t>& sb) {
  std::vector<int32_t> members, ok;
  for (int32_t t : uncertain)
    if (sb[size_t(t) / 32] >> (t % 32) & 1) members.push_back(t);
  check_uncertain(n, members, ok);
  if (ok.size() != members.size())
    grammar_fail("grammar: matcher: repeat slice at ", g.rules[size_t(nodes[size_t(n)].rule)].name, " accepts ",
                 members.size() - ok.size(), " tokens the stack rejects");
}

PositionMask MatchCaches::compute_position(int32_t rule, int32_t state) {
  PositionMask pm;
  const TokenTrie* trie = &idx->trie();
  for (size_t i = 0; i < idx->slices().size(); ++i) {
    const TokenSlice& sl = idx->slices()[i];
    const SliceReach& sr = slice_reach(rule, state, i);
    uint32_t reach = sr.reach[size_t(state)];
    if (reach == 0) continue;
    auto len = uint32_t(std::min<size_t>(reach, sl.short_len));
    bool far = len == sl.short_len, exact = !far && sr.exact[size_t(state)];
    if (!far && !exact && pm.slice >= 0) continue;
    pm.slice = int32_t(i);
    pm.slice_len = len;
    if (far || exact) {
      trie = far ? &sl.rest_short : &sl.rest;
      break;
    }
  }
  if (pm.slice >= 0 && trie == &idx->trie())
    for (const auto& [k, t] : idx->slices()[size_t(pm.slice)].rest_longer)
      if (k <= pm.slice_len) trie = &t;
  std::vector<int32_t> acc, unc;
  walk_trie(rule, state, *trie, acc, unc);
  if (verify) verify_position(rule, state, pm, acc, unc);
  if (acc.size() > idx->mask_words()) {
    pm.bits.assign(idx->mask_words(), 0);
    for (int32_t t : acc) pm.bits[size_t(t) / 32] |= 1u << (t % 32);
  } else {
    pm.accepted = std::move(acc);
  }
  // the trie walk emits tokens in trie (DFS) order, which is already byte order
  if (verify && !std::is_sorted(unc.begin(), unc.end(), [&](int32_t a, int32_t b) { return idx->bytes(a) < idx->bytes(b); }))
    grammar_fail("grammar: matcher: uncertain tokens of ", g.rules[size_t(rule)].name, ":", state, " are not in byte order");
  pm.uncertain = std::move(unc);
  return pm;
}

// Marks the uncertain tokens of a position that node n accepts; tokens come sorted by bytes,
// so states along a shared prefix are reused.
void MatchCaches::check_uncertain(int32_t n, const std::vector<int32_t>& tokens, std::vector<int32_t>& out) {
  size_t depth = 0;
  for (int32_t t : tokens) depth = std::max(depth, idx->bytes(t).size());
  std::vector<const MatchState*> lv(depth + 1);
  std::vector<MatchState> buf(depth + 1);
  MatchState root;
  root.nodes.assign(1, n);
  lv[0] = &root;
  size_t computed = 0;
  bool dead_at_computed = false;
  std::string_view prev;
  for (int32_t t : tokens) {
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
    if (!dead_at_computed) out.push_back(t);
  }
}

// A node that behaves like n for every token (at most max_depth bytes): when n's parent is the
// count frame of a repeat over a call-free, non-empty body, counts far from both bounds are
// interchangeable, so long counted strings share their uncertain-token checks.
int32_t MatchCaches::canonical(int32_t n) {
  NodeKey k = nodes[size_t(n)];
  if (k.parent < 0) return n;
  NodeKey p = nodes[size_t(k.parent)];
  const Rule& rr = g.rules[size_t(p.rule)];
  if (rr.kind != Rule::Kind::repeat || rr.body != k.rule) return n;
  const Rule& body = g.rules[size_t(rr.body)];
  if (body.kind != Rule::Kind::automaton || body.states.empty() || body.states[0].accepting) return n;
  for (const DfaState& st : body.states)
    if (!st.calls.empty()) return n;
  uint64_t far = uint64_t(max_depth) + 2, c = uint32_t(p.state), mn = rr.min, mx = rr.max;
  uint64_t dmax = mx == kUnbounded ? UINT64_MAX : mx - std::min<uint64_t>(c, mx);
  uint64_t rep = c;
  if (c < mn && mn - c >= far && mn >= far) rep = 0;
  else if (c >= mn && dmax >= far && (mx == kUnbounded || mx - mn >= far)) rep = mn;
  if (rep == c) return n;
  return intern(k.rule, k.state, intern(p.rule, int32_t(rep), p.parent));
}

// Whether rule b, called at its start, reads any one character of slice i's language and then
// accepts (passing through live states only): a repeat over such a body accepts every slice
// member while its count stays below the maximum.
bool MatchCaches::char_like(int32_t b, size_t i) {
  auto& v = rule_char_like[size_t(b)];
  if (v.size() <= i) v.resize(i + 1, 2);
  if (v[i] != 2) return v[i];
  const Rule& r = g.rules[size_t(b)];
  const TokenSlice& sl = idx->slices()[i];
  const uint8_t* fl = flags(b).data();
  bool ok = r.kind == Rule::Kind::automaton && !r.states.empty();
  std::vector<std::pair<int32_t, uint8_t>> todo{{0, 0}}, seen = todo;
  while (ok && !todo.empty()) {
    auto [st, u] = todo.back();
    todo.pop_back();
    for (const SliceRange& rg : sl.states[u]) {
      for (int x = rg.lo; x <= rg.hi && ok; ++x) {
        int32_t t = r.step(st, uint8_t(x));
        if (rg.next == 0) {
          ok = t >= 0 && r.states[size_t(t)].accepting;
        } else {
          ok = t >= 0 && (fl[size_t(t)] & 1);
          std::pair<int32_t, uint8_t> q{t, rg.next};
          if (ok && std::find(seen.begin(), seen.end(), q) == seen.end()) {
            if (seen.size() > 256) ok = false;
            seen.push_back(q), todo.push_back(q);
          }
        }
      }
    }
  }
  v[i] = ok;
  return ok;
}

// The slice whose members node n surely accepts (n at the start of a char-like repeat body whose
// count leaves room for the slice's longest member), or -1.
int32_t MatchCaches::repeat_slice(int32_t n) {
  NodeKey k = nodes[size_t(n)];
  if (k.state != 0 || k.parent < 0) return -1;
  NodeKey p = nodes[size_t(k.parent)];
  const Rule& rr = g.rules[size_t(p.rule)];
  if (rr.kind != Rule::Kind::repeat || rr.body != k.rule) return -1;
  for (size_t i = 0; i < idx->slices().size(); ++i) {
    uint64_t room = rr.max == kUnbounded ? UINT64_MAX : uint64_t(rr.max) - std::min<uint64_t>(uint32_t(p.state), rr.max);
    if (room >= idx->slices()[i].max_len && char_like(k.rule, i)) return int32_t(i);
  }
  return -1;
}

const std::vector<uint32_t>& MatchCaches::mask(const MatchState& s) {
  std::string key(reinterpret_cast<const char*>(s.nodes.data()), s.nodes.size() * sizeof(int32_t));
  key += s.accept ? '1' : '0';
  auto it = masks.find(key);
  if (it != masks.end()) return it->second;
  while (masks.size() >= kMaskCacheEntries) {
    auto old = masks.find(*mask_order.front());
    mask_order.pop_front();
    mask_bytes -= old->first.size() + old->second.size() * sizeof(uint32_t) + 64;
    masks.erase(old);
  }
  std::vector<uint32_t> m(idx->mask_words(), 0);
  for (int32_t n : s.nodes) {
    NodeKey k = nodes[size_t(n)];
    const PositionMask& pm = position(k.rule, k.state);
    if (!pm.bits.empty())
      for (size_t w = 0; w < m.size(); ++w) m[w] |= pm.bits[w];
    if (pm.slice >= 0) {
      const auto& sb = idx->slices()[size_t(pm.slice)].by_len[pm.slice_len];
      for (size_t w = 0; w < m.size(); ++w) m[w] |= sb[w];
    }
    for (int32_t t : pm.accepted) m[size_t(t) / 32] |= 1u << (t % 32);
    if (pm.uncertain.empty()) continue;
    if (node_uncertain_size > kUncertainWords) node_uncertain.clear(), node_uncertain_size = 0;
    int32_t key = canonical(n);
    auto [it, fresh] = node_uncertain.try_emplace(key);
    UncertainResult& ur = it->second;
    if (fresh) {
      int32_t rs = repeat_slice(key);
      if (rs >= 0) {
        const TokenSlice& sl = idx->slices()[size_t(rs)];
        const auto& sb = sl.by_len[sl.max_len];
        std::vector<int32_t> rest;
        for (int32_t t : pm.uncertain)
          if (!(sb[size_t(t) / 32] >> (t % 32) & 1)) rest.push_back(t);
        check_uncertain(key, rest, ur.list);
        if (verify) verify_repeat_slice(key, pm.uncertain, sb);
        ur.bits = sb;
        for (int32_t t : ur.list) ur.bits[size_t(t) / 32] |= 1u << (t % 32);
        ur.list.clear();
      } else {
        check_uncertain(key, pm.uncertain, ur.list);
      }
      if (ur.list.size() > idx->mask_words()) {
        ur.bits.assign(idx->mask_words(), 0);
        for (int32_t t : ur.list) ur.bits[size_t(t) / 32] |= 1u << (t % 32);
        ur.list.clear();
      }
      node_uncertain_size += ur.list.size() + ur.bits.size() + 8;
    }
    for (int32_t t : ur.list) m[size_t(t) / 32] |= 1u << (t % 32);
    for (size_t w = 0; w < ur.bits.size(); ++w) m[w] |= ur.bits[w];
  }
  if (s.accept)
    for (int32_t e : idx->eos_ids()) m[size_t(e) / 32] |= 1u << (e % 32);
  mask_bytes += key.size() + m.size() * sizeof(uint32_t) + 64;
  auto added = masks.emplace(std::move(key), std::move(m)).first;
  mask_order.push_back(&added->first);
  return added->second;
}

size_t MatchCaches::memory_bytes() const {
  return table_bytes + mask_bytes + node_uncertain_size * sizeof(uint32_t);
}

int MatchCaches::single_next_byte(const MatchState& s) const {
  int only = -1;
  for (int32_t n : s.nodes) {
    NodeKey k = nodes[size_t(n)];
    const Rule& r = g.rules[size_t(k.rule)];
    for (int b = 0; b < 256; ++b)
      if (r.step(k.state, uint8_t(b)) >= 0) {
        if (only >= 0 && only != b) return -2;
        only = b;
      }
  }
  return only;
}

}  // namespace exl
