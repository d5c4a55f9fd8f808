#include "grammar/grammar.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"

namespace exl {

size_t Grammar::total_states() const {
  size_t n = 0;
  for (const Rule& r : rules) n += r.states.size();
  return n;
}

Frag FragBuilder::empty() {
  Frag f{nfa_->add_state(), nfa_->add_state()};
  eps(f.in, f.out);
  return f;
}

Frag FragBuilder::bytes(uint8_t lo, uint8_t hi) {
  Frag f{nfa_->add_state(), nfa_->add_state()};
  nfa_->out[size_t(f.in)].push_back({NfaEdge::Kind::bytes, lo, hi, -1, f.out});
  return f;
}

Frag FragBuilder::literal(std::string_view s) {
  int32_t in = nfa_->add_state(), cur = in;
  for (char c : s) {
    int32_t nx = nfa_->add_state();
    nfa_->out[size_t(cur)].push_back({NfaEdge::Kind::bytes, uint8_t(c), uint8_t(c), -1, nx});
    cur = nx;
  }
  return {in, cur};
}

Frag FragBuilder::call(int32_t rule) {
  Frag f{nfa_->add_state(), nfa_->add_state()};
  nfa_->out[size_t(f.in)].push_back({NfaEdge::Kind::call, 0, 0, rule, f.out});
  return f;
}

void FragBuilder::eps(int32_t from, int32_t to) {
  nfa_->out[size_t(from)].push_back({NfaEdge::Kind::eps, 0, 0, -1, to});
}

Frag FragBuilder::seq(std::initializer_list<Frag> parts) { return seq(std::vector<Frag>(parts)); }

Frag FragBuilder::seq(const std::vector<Frag>& parts) {
  if (parts.empty()) return empty();
  for (size_t i = 0; i + 1 < parts.size(); ++i) eps(parts[i].out, parts[i + 1].in);
  return {parts.front().in, parts.back().out};
}

Frag FragBuilder::alt(const std::vector<Frag>& parts) {
  Frag f{nfa_->add_state(), nfa_->add_state()};
  for (const Frag& p : parts) {
    eps(f.in, p.in);
    eps(p.out, f.out);
  }
  return f;
}

Frag FragBuilder::star(Frag x) {
  Frag f{nfa_->add_state(), nfa_->add_state()};
  eps(f.in, x.in);
  eps(f.in, f.out);
  eps(x.out, x.in);
  eps(x.out, f.out);
  return f;
}

Frag FragBuilder::plus(Frag x) {
  Frag f{nfa_->add_state(), nfa_->add_state()};
  eps(f.in, x.in);
  eps(x.out, x.in);
  eps(x.out, f.out);
  return f;
}

Frag FragBuilder::opt(Frag x) {
  Frag f{nfa_->add_state(), nfa_->add_state()};
  eps(f.in, x.in);
  eps(f.in, f.out);
  eps(x.out, f.out);
  return f;
}

Frag FragBuilder::dfa(const Rule& d) {
  int32_t base = int32_t(nfa_->out.size());
  for (size_t i = 0; i < d.states.size(); ++i) nfa_->add_state();
  int32_t out = nfa_->add_state();
  for (size_t s = 0; s < d.states.size(); ++s) {
    int32_t from = base + int32_t(s);
    if (d.states[s].accepting) eps(from, out);
    for (int b = 0; b < 256;) {
      int32_t t = d.step(int32_t(s), uint8_t(b));
      int e = b;
      while (e + 1 < 256 && d.step(int32_t(s), uint8_t(e + 1)) == t) ++e;
      if (t >= 0) nfa_->out[size_t(from)].push_back({NfaEdge::Kind::bytes, uint8_t(b), uint8_t(e), -1, base + t});
      b = e + 1;
    }
  }
  return {base, out};
}

void FragBuilder::set_root(Frag f) {
  eps(0, f.in);
  eps(f.out, 1);
}

int32_t GrammarBuilder::add_rule(std::string name) {
  nfas_.emplace_back();
  names_.push_back(std::move(name));
  repeats_.emplace_back();
  is_repeat_.push_back(false);
  ready_.emplace_back();
  return int32_t(nfas_.size() - 1);
}

int32_t GrammarBuilder::add_repeat(std::string name, int32_t body, uint32_t min, uint32_t max) {
  int32_t id = add_rule(std::move(name));
  Rule& r = repeats_.back();
  r.kind = Rule::Kind::repeat;
  r.name = names_.back();
  r.body = body;
  r.min = min;
  r.max = max;
  is_repeat_.back() = true;
  return id;
}

void GrammarBuilder::set_from_dfa(int32_t rule, const Rule& d) {
  Nfa n;
  n.out.resize(d.states.size() + 2);
  auto st = [](int32_t s) { return s + 2; };
  n.out[0].push_back({NfaEdge::Kind::eps, 0, 0, -1, st(0)});
  for (size_t s = 0; s < d.states.size(); ++s) {
    if (d.states[s].accepting) n.out[size_t(st(int32_t(s)))].push_back({NfaEdge::Kind::eps, 0, 0, -1, 1});
    for (int b = 0; b < 256;) {
      int32_t t = d.step(int32_t(s), uint8_t(b));
      int e = b;
      while (e + 1 < 256 && d.step(int32_t(s), uint8_t(e + 1)) == t) ++e;
      if (t >= 0) n.out[size_t(st(int32_t(s)))].push_back({NfaEdge::Kind::bytes, uint8_t(b), uint8_t(e), -1, st(t)});
      b = e + 1;
    }
  }
  nfas_[size_t(rule)] = std::move(n);
}

void GrammarBuilder::set_dfa(int32_t rule, std::shared_ptr<const Rule> d) {
  for (const DfaState& st : d->states)
    if (!st.calls.empty()) grammar_fail("grammar: rule '", names_[size_t(rule)], "': set_dfa needs a byte-only automaton");
  nfas_[size_t(rule)] = Nfa{};
  ready_[size_t(rule)] = std::move(d);
}

namespace {

using StateSet = std::vector<int32_t>;

struct StateSetHash {
  size_t operator()(const StateSet& s) const {
    uint64_t h = 0x9E3779B97F4A7C15ull ^ s.size();
    for (int32_t x : s) h = (h ^ uint32_t(x)) * 0x100000001B3ull, h ^= h >> 29;
    return size_t(h);
  }
};

void closure(const Nfa& nfa, StateSet& set, std::vector<uint8_t>& mark, std::vector<int32_t>& stack) {
  stack.assign(set.begin(), set.end());
  for (int32_t s : set) mark[size_t(s)] = 1;
  while (!stack.empty()) {
    int32_t s = stack.back();
    stack.pop_back();
    for (const NfaEdge& e : nfa.out[size_t(s)])
      if (e.kind == NfaEdge::Kind::eps && !mark[size_t(e.to)]) {
        mark[size_t(e.to)] = 1;
        set.push_back(e.to);
        stack.push_back(e.to);
      }
  }
  for (int32_t s : set) mark[size_t(s)] = 0;
  std::sort(set.begin(), set.end());
}

Rule determinize_uncached(const Nfa& nfa, std::string name, size_t max_states, bool allow_calls) {
  Rule r;
  r.name = std::move(name);
  max_states = std::min(max_states, grammar_automaton_limit());
  size_t nfa_edges = 0;
  for (const auto& edges : nfa.out) nfa_edges += edges.size();
  // The NFA and the subsets are held only while this runs; the automaton stays charged.
  GrammarTransientBytes transient;
  transient.charge(nfa.out.size() * (sizeof(std::vector<NfaEdge>) + 1 + sizeof(int32_t)) + nfa_edges * sizeof(NfaEdge));
  std::array<bool, 257> boundary{};
  boundary[0] = true;
  for (const auto& edges : nfa.out)
    for (const NfaEdge& e : edges) {
      if (e.kind == NfaEdge::Kind::bytes) {
        boundary[e.lo] = true;
        boundary[size_t(e.hi) + 1] = true;
      } else if (e.kind == NfaEdge::Kind::call && !allow_calls) {
        grammar_fail("grammar: rule '", r.name, "': a byte-only automaton cannot call rules");
      }
    }
  int cls = -1;
  std::vector<uint8_t> first_byte;
  for (int b = 0; b < 256; ++b) {
    if (boundary[size_t(b)]) {
      ++cls;
      first_byte.push_back(uint8_t(b));
    }
    r.byte_class[size_t(b)] = uint8_t(cls);
  }
  r.n_classes = cls + 1;
  std::vector<uint8_t> mark(nfa.out.size(), 0);
  std::unordered_map<StateSet, int32_t, StateSetHash> ids;
  std::vector<const StateSet*> sets;  // keys of ids (node-based: stable addresses)
  std::unordered_map<StateSet, int32_t, StateSetHash> kernels;  // set before closure -> id
  std::vector<int32_t> stack;
  StateSet closed;
  std::vector<int32_t> single(nfa.out.size(), -1);  // one-state kernels (most, in embedded DFAs)
  auto intern = [&](const StateSet& kernel) -> int32_t {
    if (kernel.size() == 1) {
      if (single[size_t(kernel[0])] >= 0) return single[size_t(kernel[0])];
    } else if (auto kit = kernels.find(kernel); kit != kernels.end()) {
      return kit->second;
    }
    closed = kernel;
    closure(nfa, closed, mark, stack);
    auto it = ids.find(closed);
    if (it == ids.end()) {
      if (sets.size() >= max_states)
        grammar_fail("grammar: rule '", r.name, "': automaton exceeds ", max_states, " states");
      // The subset itself (stored once here and once as a kernel), then its row and its state.
      transient.charge(2 * closed.size() * sizeof(int32_t) + 96 + size_t(r.n_classes) * sizeof(int32_t) + sizeof(DfaState));
      grammar_charge(1, 0);
      it = ids.emplace(closed, int32_t(sets.size())).first;
      sets.push_back(&it->first);
    }
    if (kernel.size() == 1) single[size_t(kernel[0])] = it->second;
    else kernels.emplace(kernel, it->second);
    return it->second;
  };
  intern({0});
  // Per DFA state, the classes are cut only where one of its byte edges starts or ends: every
  // class of a segment has the same target set, which is built and interned once.
  struct ClassEdge {
    int32_t lo, hi, to;
  };
  std::vector<ClassEdge> edges;
  std::vector<int32_t> cuts;
  std::vector<std::pair<int32_t, int32_t>> call_edges;  // (callee, return state)
  StateSet t;
  for (size_t i = 0; i < sets.size(); ++i) {
    edges.clear();
    cuts.clear();
    call_edges.clear();
    bool acc = false;
    for (int32_t s : *sets[i]) {
      if (s == 1) acc = true;
      for (const NfaEdge& e : nfa.out[size_t(s)]) {
        if (e.kind == NfaEdge::Kind::bytes) {
          edges.push_back({r.byte_class[e.lo], r.byte_class[e.hi], e.to});
          cuts.push_back(r.byte_class[e.lo]);
          cuts.push_back(r.byte_class[e.hi] + 1);
        } else if (e.kind == NfaEdge::Kind::call) {
          call_edges.push_back({e.callee, e.to});
        }
      }
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    DfaState ds;
    ds.accepting = acc;
    size_t row = r.trans.size();
    r.trans.resize(row + size_t(r.n_classes), -1);
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      int32_t c0 = cuts[k], c1 = cuts[k + 1];
      t.clear();
      for (const ClassEdge& e : edges)
        if (e.lo <= c0 && c0 <= e.hi) t.push_back(e.to);
      if (t.empty()) continue;
      std::sort(t.begin(), t.end());
      t.erase(std::unique(t.begin(), t.end()), t.end());
      int32_t id = intern(t);
      std::fill(r.trans.begin() + std::ptrdiff_t(row) + c0, r.trans.begin() + std::ptrdiff_t(row) + c1, id);
      ds.has_bytes = true;
    }
    std::sort(call_edges.begin(), call_edges.end());
    for (size_t k = 0; k < call_edges.size();) {
      size_t e = k;
      t.clear();
      for (; e < call_edges.size() && call_edges[e].first == call_edges[k].first; ++e)
        if (t.empty() || t.back() != call_edges[e].second) t.push_back(call_edges[e].second);
      ds.calls.push_back({call_edges[k].first, intern(t)});
      k = e;
    }
    r.states.push_back(std::move(ds));
  }
  (void)first_byte;
  return r;
}

// Determinized rules by NFA, shared by every grammar compiled in the process: schemas repeat the
// same pieces (the generic string and value rules, formats, key sets, numbers), and the NFA
// serialization is much cheaper than the subset construction.
struct DeterminizeCache {
  static constexpr size_t kMaxNfaStates = 4096;
  static constexpr size_t kMaxBytes = size_t(256) << 20;
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<const Rule>> map;
  size_t bytes = 0;
};

DeterminizeCache& determinize_cache() {
  static DeterminizeCache c;
  return c;
}

std::string nfa_key(const Nfa& nfa, bool allow_calls) {
  std::string key(1, allow_calls ? 'c' : 'b');
  for (const auto& edges : nfa.out) {
    for (const NfaEdge& e : edges) {
      key += char(e.kind);
      if (e.kind == NfaEdge::Kind::bytes) key += char(e.lo), key += char(e.hi);
      else if (e.kind == NfaEdge::Kind::call) key.append(reinterpret_cast<const char*>(&e.callee), sizeof e.callee);
      key.append(reinterpret_cast<const char*>(&e.to), sizeof e.to);
    }
    key += '\xff';
  }
  return key;
}

Rule determinize(const Nfa& nfa, std::string name, size_t max_states, bool allow_calls) {
  if (nfa.out.size() > DeterminizeCache::kMaxNfaStates) return determinize_uncached(nfa, std::move(name), max_states, allow_calls);
  std::string key = nfa_key(nfa, allow_calls);
  DeterminizeCache& c = determinize_cache();
  std::shared_ptr<const Rule> hit;
  {
    std::lock_guard lock(c.mu);
    auto it = c.map.find(key);
    if (it != c.map.end()) hit = it->second;
  }
  if (hit) {
    max_states = std::min(max_states, grammar_automaton_limit());
    if (hit->states.size() > max_states)
      grammar_fail("grammar: rule '", name, "': automaton exceeds ", max_states, " states");
    grammar_charge(hit->states.size(), 0);
    Rule r = *hit;
    r.name = std::move(name);
    return r;
  }
  Rule r = determinize_uncached(nfa, std::move(name), max_states, allow_calls);
  size_t size = key.size() + r.trans.size() * sizeof(int32_t) + r.states.size() * sizeof(DfaState) + 512;
  std::lock_guard lock(c.mu);
  if (c.bytes + size > DeterminizeCache::kMaxBytes) {
    if (std::getenv("EXL_GRAMMAR_DEBUG")) std::fprintf(stderr, "determinize cache cleared (%zu entries)\n", c.map.size());
    c.map.clear(), c.bytes = 0;
  }
  if (c.map.emplace(std::move(key), std::make_shared<const Rule>(r)).second) c.bytes += size;
  return r;
}

// States of `r` from which an accepting state is reachable, given which rules are productive.
std::vector<bool> live_states(const Rule& r, const std::vector<bool>& productive) {
  size_t n = r.states.size();
  const auto nc = size_t(r.n_classes);
  std::vector<uint32_t> start(n + 1, 0);
  auto each_edge = [&](auto&& f) {
    for (size_t s = 0; s < n; ++s) {
      const int32_t* row = &r.trans[s * nc];
      for (size_t c = 0; c < nc; ++c)
        if (row[c] >= 0 && (c == 0 || row[c] != row[c - 1])) f(size_t(row[c]), int32_t(s));  // runs once
      for (const CallEdge& e : r.states[s].calls)
        if (productive[size_t(e.callee)]) f(size_t(e.next), int32_t(s));
    }
  };
  each_edge([&](size_t to, int32_t) { ++start[to + 1]; });
  for (size_t i = 0; i < n; ++i) start[i + 1] += start[i];
  std::vector<int32_t> rev(start[n]);
  std::vector<uint32_t> fill(start.begin(), start.end() - 1);
  each_edge([&](size_t to, int32_t from) { rev[fill[to]++] = from; });
  std::vector<bool> live(n, false);
  std::vector<int32_t> stack;
  for (size_t s = 0; s < n; ++s)
    if (r.states[s].accepting) {
      live[s] = true;
      stack.push_back(int32_t(s));
    }
  while (!stack.empty()) {
    auto s = size_t(stack.back());
    stack.pop_back();
    for (uint32_t k = start[s]; k < start[s + 1]; ++k)
      if (!live[size_t(rev[k])]) {
        live[size_t(rev[k])] = true;
        stack.push_back(rev[k]);
      }
  }
  return live;
}

// Whether an accepting state is reachable from the start (depth-first, stops at the first one).
bool accepts_something(const Rule& r, const std::vector<bool>& productive) {
  if (r.states.empty()) return false;
  const auto nc = size_t(r.n_classes);
  std::vector<uint8_t> seen(r.states.size(), 0);
  std::vector<int32_t> stack{0};
  seen[0] = 1;
  while (!stack.empty()) {
    auto s = size_t(stack.back());
    stack.pop_back();
    if (r.states[s].accepting) return true;
    auto push = [&](int32_t t) {
      if (t >= 0 && !seen[size_t(t)]) seen[size_t(t)] = 1, stack.push_back(t);
    };
    for (const CallEdge& e : r.states[s].calls)
      if (productive[size_t(e.callee)]) push(e.next);
    const int32_t* row = &r.trans[s * nc];
    for (size_t c = 0; c < nc; ++c) push(row[c]);
  }
  return false;
}

// Rules whose language is not empty: a worklist over callers, so a rule is looked at again only
// when one of its callees became productive.
std::vector<bool> productive_rules(const Grammar& g) {
  size_t n = g.rules.size();
  std::vector<bool> productive(n, false);
  std::vector<std::vector<int32_t>> callers(n);
  for (size_t i = 0; i < n; ++i) {
    const Rule& r = g.rules[i];
    if (r.kind == Rule::Kind::repeat) {
      callers[size_t(r.body)].push_back(int32_t(i));
      continue;
    }
    for (const DfaState& st : r.states)
      for (const CallEdge& e : st.calls)
        if (callers[size_t(e.callee)].empty() || callers[size_t(e.callee)].back() != int32_t(i))
          callers[size_t(e.callee)].push_back(int32_t(i));
  }
  std::vector<int32_t> work;
  std::vector<uint8_t> queued(n, 1);
  for (size_t i = n; i-- > 0;) work.push_back(int32_t(i));
  while (!work.empty()) {
    auto i = size_t(work.back());
    work.pop_back();
    queued[i] = 0;
    if (productive[i]) continue;
    const Rule& r = g.rules[i];
    bool p = r.kind == Rule::Kind::repeat ? (r.min == 0 || productive[size_t(r.body)])
                                          : accepts_something(r, productive);
    if (!p) continue;
    productive[i] = true;
    for (int32_t c : callers[i])
      if (!productive[size_t(c)] && !queued[size_t(c)]) {
        queued[size_t(c)] = 1;
        work.push_back(c);
      }
  }
  return productive;
}

void prune(Grammar& g) {
  size_t n = g.rules.size();
  std::vector<bool> productive = productive_rules(g);
  for (size_t i = 0; i < n; ++i) {
    Rule& r = g.rules[i];
    if (r.kind == Rule::Kind::repeat) {
      if (!productive[size_t(r.body)]) r.max = 0;
      continue;
    }
    std::vector<bool> live = live_states(r, productive);
    for (size_t s = 0; s < r.states.size(); ++s) {
      bool any = false;
      for (int c = 0; c < r.n_classes; ++c) {
        int32_t& t = r.trans[s * size_t(r.n_classes) + size_t(c)];
        if (t >= 0 && !live[size_t(t)]) t = -1;
        any |= t >= 0;
      }
      r.states[s].has_bytes = any && live[s];
      auto& calls = r.states[s].calls;
      calls.erase(std::remove_if(calls.begin(), calls.end(),
                                 [&](const CallEdge& e) { return !live[s] || !productive[size_t(e.callee)] || !live[size_t(e.next)]; }),
                  calls.end());
    }
  }
}

void check_left_recursion(const Grammar& g) {
  size_t n = g.rules.size();
  std::vector<bool> nullable(n, false);
  auto reach_states = [&](const Rule& r, auto&& on_call) {
    std::vector<bool> seen(r.states.size(), false);
    std::vector<int32_t> stack{0};
    seen[0] = true;
    bool acc = false;
    while (!stack.empty()) {
      int32_t s = stack.back();
      stack.pop_back();
      acc |= r.states[size_t(s)].accepting;
      for (const CallEdge& e : r.states[size_t(s)].calls) {
        on_call(e.callee);
        if (nullable[size_t(e.callee)] && !seen[size_t(e.next)]) {
          seen[size_t(e.next)] = true;
          stack.push_back(e.next);
        }
      }
    }
    return acc;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t i = 0; i < n; ++i) {
      if (nullable[i]) continue;
      const Rule& r = g.rules[i];
      bool v = r.kind == Rule::Kind::repeat ? (r.min == 0 || r.max == 0 || nullable[size_t(r.body)])
                                            : reach_states(r, [](int32_t) {});
      if (v) nullable[i] = changed = true;
    }
  }
  std::vector<std::vector<int32_t>> left(n);
  for (size_t i = 0; i < n; ++i) {
    const Rule& r = g.rules[i];
    if (r.kind == Rule::Kind::repeat) {
      if (r.max > 0) left[i].push_back(r.body);
    } else {
      reach_states(r, [&](int32_t c) { left[i].push_back(c); });
    }
  }
  std::vector<uint8_t> color(n, 0);
  for (size_t root = 0; root < n; ++root) {
    if (color[root]) continue;
    std::vector<std::pair<int32_t, size_t>> stack{{int32_t(root), 0}};
    color[root] = 1;
    while (!stack.empty()) {
      auto& [v, k] = stack.back();
      if (k < left[size_t(v)].size()) {
        int32_t w = left[size_t(v)][k++];
        if (color[size_t(w)] == 1)
          grammar_fail("grammar: rule '", g.rules[size_t(w)].name,
                       "' is left-recursive (it can reach itself without consuming input)");
        if (color[size_t(w)] == 0) {
          color[size_t(w)] = 1;
          stack.push_back({w, 0});
        }
      } else {
        color[size_t(v)] = 2;
        stack.pop_back();
      }
    }
  }
}

}  // namespace

namespace {
Rule intersect_bytes_unpruned(const Rule& a, const Rule& b, bool difference, size_t max_states);
}  // namespace

bool accepts_nothing(const Grammar& g) {
  if (g.root < 0 || size_t(g.root) >= g.rules.size()) return true;
  return !productive_rules(g)[size_t(g.root)];
}

Rule determinize_bytes(const Nfa& nfa, std::string name, size_t max_states) {
  return determinize(nfa, std::move(name), max_states, false);
}

Grammar GrammarBuilder::finish(int32_t root) {
  Grammar g;
  g.root = root;
  const size_t max_states = grammar_automaton_limit();
  const std::vector<int32_t> canon = merge_equal_rules();
  for (size_t i = 0; i < nfas_.size(); ++i) {
    if (is_repeat_[i]) repeats_[i].body = canon[size_t(repeats_[i].body)];
    for (auto& edges : nfas_[i].out)
      for (NfaEdge& e : edges)
        if (e.kind == NfaEdge::Kind::call) e.callee = canon[size_t(e.callee)];
  }
  for (size_t i = 0; i < nfas_.size(); ++i) {
    if (canon[i] != int32_t(i)) {
      // a copy: nothing calls it any more; it forwards to its equal (it may be the root)
      Rule r;
      r.name = names_[i];
      r.states.resize(2);
      r.trans.assign(2, -1);
      r.states[0].calls.push_back({canon[i], 1});
      r.states[1].accepting = true;
      g.rules.push_back(std::move(r));
      continue;
    }
    if (ready_[i]) {
      g.rules.push_back(*ready_[i]);
      g.rules.back().name = names_[i];
      const Rule& r = g.rules.back();
      grammar_charge(r.states.size(), r.trans.size() * sizeof(int32_t) + r.states.size() * sizeof(DfaState));
      continue;
    }
    if (is_repeat_[i]) {
      g.rules.push_back(repeats_[i]);
      continue;
    }
    auto t0 = std::chrono::steady_clock::now();
    g.rules.push_back(determinize(nfas_[i], names_[i], max_states, true));
    grammar_charge(0, g.rules.back().trans.size() * sizeof(int32_t) + g.rules.back().states.size() * sizeof(DfaState));
    if (std::getenv("EXL_GRAMMAR_DEBUG"))
      std::fprintf(stderr, "determinize %s: nfa %zu -> %zu states, %d classes, %.3f ms\n", names_[i].c_str(),
                   nfas_[i].out.size(), g.rules.back().states.size(), g.rules.back().n_classes,
                   std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  prune(g);
  check_left_recursion(g);
  merge_callfree_alternatives(g);
  return g;
}

Rule intersect_bytes(const Rule& a, const Rule& b, bool difference, size_t max_states) {
  auto t0 = std::chrono::steady_clock::now();
  Rule out = intersect_bytes_unpruned(a, b, difference, max_states);
  size_t built = out.states.size();
  auto t1 = std::chrono::steady_clock::now();
  Grammar g;
  g.rules.push_back(std::move(out));
  prune(g);
  if (std::getenv("EXL_GRAMMAR_DEBUG"))
    std::fprintf(stderr, "product %s: %zu x %zu -> %zu states, %d classes, %.3f ms (prune %.3f ms)\n", a.name.c_str(),
                 a.states.size(), b.states.size(), built, g.rules[0].n_classes,
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
                 std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t1).count());
  return std::move(g.rules[0]);
}

namespace {

Rule intersect_bytes_unpruned(const Rule& a, const Rule& b, bool difference, size_t max_states) {
  max_states = std::min(max_states, grammar_automaton_limit());
  GrammarTransientBytes transient;
  Rule r;
  r.name = a.name;
  if (a.states.empty()) return r;
  std::vector<std::pair<uint8_t, uint8_t>> class_of;  // new class -> (a class, b class)
  for (int x = 0; x < 256; ++x) {
    std::pair<uint8_t, uint8_t> p{a.byte_class[size_t(x)], b.states.empty() ? 0 : b.byte_class[size_t(x)]};
    auto it = std::find(class_of.begin(), class_of.end(), p);
    if (it == class_of.end()) it = class_of.insert(class_of.end(), p);
    r.byte_class[size_t(x)] = uint8_t(it - class_of.begin());
  }
  r.n_classes = int32_t(class_of.size());
  // Pair ids by x * (|b| + 1) + y + 1 in a table zeroed by the allocator (pages are touched only
  // where pairs are reached) when the pair space is small enough, else in a hash map.
  constexpr size_t kMaxFlatPairs = size_t(16) << 20;
  const size_t stride = b.states.size() + 1, n_pairs = a.states.size() * stride;
  std::unique_ptr<uint32_t, decltype(&std::free)> flat(
      n_pairs <= kMaxFlatPairs ? static_cast<uint32_t*>(std::calloc(n_pairs, sizeof(uint32_t))) : nullptr, &std::free);
  if (flat) transient.charge(n_pairs * sizeof(uint32_t) / 8);  // about the pages a product touches
  std::unordered_map<uint64_t, int32_t> ids;
  std::vector<std::pair<int32_t, int32_t>> pairs;
  auto intern = [&](int32_t x, int32_t y) {
    uint32_t* slot = flat ? flat.get() + size_t(x) * stride + size_t(y + 1) : nullptr;
    if (slot && *slot) return int32_t(*slot - 1);
    if (!slot) {
      uint64_t key = (uint64_t(uint32_t(x)) << 32) | uint32_t(y);
      auto it = ids.find(key);
      if (it != ids.end()) return it->second;
      ids.emplace(key, int32_t(pairs.size()));
    }
    if (pairs.size() >= max_states) grammar_fail("grammar: automaton product exceeds ", max_states, " states");
    grammar_charge(1, 0);
    transient.charge(r.n_classes * sizeof(int32_t) + sizeof(DfaState) + 48);
    if (slot) *slot = uint32_t(pairs.size() + 1);
    pairs.push_back({x, y});
    return int32_t(pairs.size() - 1);
  };
  intern(0, b.states.empty() ? -1 : 0);
  const auto nc = size_t(r.n_classes);
  for (size_t i = 0; i < pairs.size(); ++i) {
    auto [x, y] = pairs[i];
    bool acc_b = y >= 0 && b.states[size_t(y)].accepting;
    DfaState ds;
    ds.accepting = a.states[size_t(x)].accepting && (difference ? !acc_b : acc_b);
    size_t row = r.trans.size();
    r.trans.resize(row + nc, -1);
    for (size_t c = 0; c < nc; ++c) {
      int32_t tx = a.trans[size_t(x) * size_t(a.n_classes) + class_of[c].first];
      if (tx < 0) continue;
      int32_t ty = y >= 0 ? b.trans[size_t(y) * size_t(b.n_classes) + class_of[c].second] : -1;
      if (ty < 0 && !difference) continue;
      int32_t t = intern(tx, ty);
      r.trans[row + c] = t;
      ds.has_bytes = true;
    }
    r.states.push_back(std::move(ds));
  }
  return r;
}

}  // namespace

bool is_empty_bytes(const Rule& a) {
  if (a.states.empty()) return true;
  std::vector<bool> seen(a.states.size(), false);
  std::vector<int32_t> stack{0};
  seen[0] = true;
  while (!stack.empty()) {
    int32_t s = stack.back();
    stack.pop_back();
    if (a.states[size_t(s)].accepting) return false;
    for (int c = 0; c < a.n_classes; ++c) {
      int32_t t = a.trans[size_t(s) * size_t(a.n_classes) + size_t(c)];
      if (t >= 0 && !seen[size_t(t)]) {
        seen[size_t(t)] = true;
        stack.push_back(t);
      }
    }
  }
  return true;
}

bool accepts_bytes(const Rule& a, std::string_view s) {
  int32_t st = 0;
  for (char c : s) {
    st = a.step(st, uint8_t(c));
    if (st < 0) return false;
  }
  return a.states[size_t(st)].accepting;
}

}  // namespace exl
