// GrammarBuilder::finish's merges: equal rules (merge_equal_rules) and byte-only alternatives
// as one union (merge_callfree_alternatives).
#include <algorithm>
#include <map>
#include <unordered_map>

#include "grammar/grammar.h"
#include "grammar/grammar_budget.h"
#include "grammar/grammar_error.h"

namespace exl {

// Rules whose definitions are equal once their callees are replaced by canonical ones are one
// rule: schemas expanded into alternatives (oneOf exclusions, dependencies) repeat the same
// members and objects many times over, and each copy would be determinized again. Rules are
// visited callees first (Tarjan's order of strongly connected components); a recursive rule
// keeps its own id (its callees are still replaced), so every merge is of rules whose languages
// are equal by construction.
std::vector<int32_t> GrammarBuilder::merge_equal_rules() {
  const size_t n = nfas_.size();
  std::vector<int32_t> canon(n);
  for (size_t i = 0; i < n; ++i) canon[i] = int32_t(i);
  auto callees = [&](size_t i, auto&& f) {
    if (is_repeat_[i]) return f(repeats_[i].body);
    for (const auto& edges : nfas_[i].out)
      for (const NfaEdge& e : edges)
        if (e.kind == NfaEdge::Kind::call) f(e.callee);
  };
  auto hash_of = [&](size_t i) {
    uint64_t h = 0xcbf29ce484222325ull;
    auto mix = [&](uint64_t x) { h = (h ^ x) * 0x100000001b3ull, h ^= h >> 32; };
    if (ready_[i]) return mix(1), mix(uint64_t(reinterpret_cast<uintptr_t>(ready_[i].get()))), h;
    if (is_repeat_[i]) return mix(2), mix(uint32_t(canon[size_t(repeats_[i].body)])), mix(repeats_[i].min), mix(repeats_[i].max), h;
    mix(3);
    for (const auto& edges : nfas_[i].out) {
      mix(edges.size());
      for (const NfaEdge& e : edges)
        mix((uint64_t(e.kind) | uint64_t(e.lo) << 8 | uint64_t(e.hi) << 16 |
             uint64_t(uint32_t(e.kind == NfaEdge::Kind::call ? canon[size_t(e.callee)] : 0)) << 24) ^
            uint64_t(uint32_t(e.to)) << 40);
    }
    return h;
  };
  auto equal = [&](size_t a, size_t b) {
    if (bool(ready_[a]) != bool(ready_[b]) || is_repeat_[a] != is_repeat_[b]) return false;
    if (ready_[a]) return ready_[a] == ready_[b];
    if (is_repeat_[a])
      return canon[size_t(repeats_[a].body)] == canon[size_t(repeats_[b].body)] && repeats_[a].min == repeats_[b].min &&
             repeats_[a].max == repeats_[b].max;
    const Nfa &x = nfas_[a], &y = nfas_[b];
    if (x.out.size() != y.out.size()) return false;
    for (size_t s = 0; s < x.out.size(); ++s) {
      if (x.out[s].size() != y.out[s].size()) return false;
      for (size_t k = 0; k < x.out[s].size(); ++k) {
        const NfaEdge &e = x.out[s][k], &f = y.out[s][k];
        if (e.kind != f.kind || e.lo != f.lo || e.hi != f.hi || e.to != f.to) return false;
        if (e.kind == NfaEdge::Kind::call && canon[size_t(e.callee)] != canon[size_t(f.callee)]) return false;
      }
    }
    return true;
  };
  // Tarjan's algorithm, iteratively; a component is complete when its root is popped.
  std::vector<int32_t> index(n, -1), low(n, 0), stack;
  std::vector<uint8_t> on_stack(n, 0);
  std::vector<std::vector<int32_t>> out(n);
  for (size_t i = 0; i < n; ++i) callees(i, [&](int32_t c) { out[i].push_back(c); });
  std::unordered_multimap<uint64_t, int32_t> seen;
  int32_t next_index = 0;
  std::vector<std::pair<int32_t, size_t>> dfs;
  for (size_t r = 0; r < n; ++r) {
    if (index[r] >= 0) continue;
    dfs.push_back({int32_t(r), 0});
    while (!dfs.empty()) {
      auto& [v, k] = dfs.back();
      auto vi = size_t(v);
      if (k == 0) {
        index[vi] = low[vi] = next_index++;
        stack.push_back(v);
        on_stack[vi] = 1;
      }
      if (k < out[vi].size()) {
        auto w = size_t(out[vi][k++]);
        if (index[w] < 0) dfs.push_back({int32_t(w), 0});
        else if (on_stack[w]) low[vi] = std::min(low[vi], index[w]);
        continue;
      }
      if (low[vi] == index[vi]) {
        bool single = stack.back() == v &&
                      std::find(out[vi].begin(), out[vi].end(), v) == out[vi].end();
        for (int32_t x = -1; x != v;) {
          x = stack.back();
          stack.pop_back();
          on_stack[size_t(x)] = 0;
        }
        if (single) {
          uint64_t h = hash_of(vi);
          auto [b, e] = seen.equal_range(h);
          for (; b != e; ++b)
            if (equal(vi, size_t(b->second))) break;
          if (b != e) canon[vi] = b->second;
          else seen.emplace(h, v);
        }
      }
      int32_t done = v;
      dfs.pop_back();
      if (!dfs.empty()) low[size_t(dfs.back().first)] = std::min(low[size_t(dfs.back().first)], low[size_t(done)]);
    }
  }
  return canon;
}

namespace {

// A rule that only calls another: state 0 calls X and returns to an accepting state that reads
// nothing (what a schema alternative compiled to one call becomes). Returns X, or r itself.
int32_t merge_forward_target(const Grammar& g, int32_t r) {
  for (int hops = 0; hops < 8; ++hops) {
    const Rule& x = g.rules[size_t(r)];
    if (x.kind != Rule::Kind::automaton || x.states.empty()) return r;
    const DfaState& s0 = x.states[0];
    if (s0.accepting || s0.has_bytes || s0.calls.size() != 1) return r;
    const DfaState& s1 = x.states[size_t(s0.calls[0].next)];
    if (!s1.accepting || s1.has_bytes || !s1.calls.empty() || s0.calls[0].callee == r) return r;
    r = s0.calls[0].callee;
  }
  return r;
}

bool merge_is_callfree(const Rule& r) {
  if (r.kind != Rule::Kind::automaton || r.states.empty()) return false;
  return std::all_of(r.states.begin(), r.states.end(), [](const DfaState& s) { return s.calls.empty(); });
}

// Two states of one automaton with the same accepting flag, byte row and calls: the same future.
bool merge_same_row(const Rule& r, int32_t a, int32_t b) {
  if (a == b) return true;
  const DfaState &x = r.states[size_t(a)], &y = r.states[size_t(b)];
  if (x.accepting != y.accepting || x.calls.size() != y.calls.size()) return false;
  for (size_t k = 0; k < x.calls.size(); ++k)
    if (x.calls[k].callee != y.calls[k].callee || x.calls[k].next != y.calls[k].next) return false;
  const auto nc = size_t(r.n_classes);
  return std::equal(r.trans.begin() + std::ptrdiff_t(size_t(a) * nc), r.trans.begin() + std::ptrdiff_t(size_t(a) * nc + nc),
                    r.trans.begin() + std::ptrdiff_t(size_t(b) * nc));
}

}  // namespace

// A oneOf of string patterns becomes one automaton position per step instead of one per branch,
// so a mask classifies the vocabulary once.
void merge_callfree_alternatives(Grammar& g) {
  constexpr size_t kMaxUnionStates = 20000;
  std::map<std::vector<int32_t>, int32_t> unions;  // callees -> union rule (-1: too large)
  const size_t n = g.rules.size();
  for (size_t i = 0; i < n; ++i) {
    if (g.rules[i].kind != Rule::Kind::automaton) continue;
    for (size_t s = 0; s < g.rules[i].states.size(); ++s) {
      std::vector<CallEdge> calls = g.rules[i].states[s].calls;
      if (calls.size() < 2) continue;
      std::vector<int32_t> target(calls.size());
      for (size_t k = 0; k < calls.size(); ++k) {
        int32_t t = merge_forward_target(g, calls[k].callee);
        target[k] = merge_is_callfree(g.rules[size_t(t)]) ? t : -1;
      }
      std::vector<bool> used(calls.size(), false);
      std::vector<CallEdge> out;
      bool changed = false;
      for (size_t k = 0; k < calls.size(); ++k) {
        if (used[k]) continue;
        used[k] = true;
        if (target[k] < 0) {
          out.push_back(calls[k]);
          continue;
        }
        std::vector<size_t> group{k};
        for (size_t j = k + 1; j < calls.size(); ++j)
          if (!used[j] && target[j] >= 0 && merge_same_row(g.rules[i], calls[k].next, calls[j].next)) used[j] = true, group.push_back(j);
        std::vector<int32_t> callees;
        for (size_t j : group) callees.push_back(target[j]);
        std::sort(callees.begin(), callees.end());
        callees.erase(std::unique(callees.begin(), callees.end()), callees.end());
        int32_t u = callees.size() == 1 ? callees[0] : -1;
        if (callees.size() > 1) {
          auto it = unions.find(callees);
          if (it == unions.end()) {
            size_t states = 0;
            Nfa nfa;
            FragBuilder fb(nfa);
            std::vector<Frag> alts;
            for (int32_t c : callees) {
              states += g.rules[size_t(c)].states.size();
              alts.push_back(fb.dfa(g.rules[size_t(c)]));
            }
            fb.set_root(fb.alt(alts));
            int32_t id = -1;
            try {
              Rule d = determinize_bytes(nfa, g.rules[size_t(callees[0])].name + "|union", std::min(kMaxUnionStates, std::max<size_t>(4096, 4 * states)));
              grammar_charge(0, d.trans.size() * sizeof(int32_t) + d.states.size() * sizeof(DfaState));
              id = int32_t(g.rules.size());
              g.rules.push_back(std::move(d));
            } catch (const GrammarBudgetError&) {
              throw;
            } catch (const GrammarCancelled&) {
              throw;
            } catch (const GrammarError&) {
            }
            it = unions.emplace(callees, id).first;
          }
          u = it->second;
        }
        if (u < 0) {
          for (size_t j : group) out.push_back(calls[j]);
          continue;
        }
        out.push_back({u, calls[k].next});
        changed = true;
      }
      if (changed) g.rules[i].states[s].calls = std::move(out);
    }
  }
}


}  // namespace exl
