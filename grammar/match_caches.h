// The tables every Matcher of one CompiledGrammar shares, built lazily as matchers walk the
// grammar (internal to grammar/: only matcher.cpp and match_caches.cpp include this header).
//
// What it holds:
//  - stack nodes: interned (rule, state, parent node) frames; a matcher's position is a sorted
//    set of node ids (MatchState), so equal stacks are equal ids and share everything below;
//  - byte steps: per node and byte class, the MatchState after that byte (closure of calls and
//    returns included), memoized;
//  - position masks: per automaton position (rule, state), the tokens accepted without leaving
//    the rule and the "uncertain" ones (token_index.h's PositionMask); small call-free positions
//    come from the TokenIndex's vocabulary-wide cache, others are computed here;
//  - per-rule helpers of those computations: byte-class runs, state flags, slice reach;
//  - uncertain results: per canonical node, which uncertain tokens the real stack accepts;
//  - whole masks: per MatchState, the finished token bitset.
//
// Invariants: node ids, step results and position masks never change once made, so ids stored in
// a MatchState stay valid for the life of the caches. The whole-mask cache is bounded
// (kMaskCacheEntries, the oldest evicted one by one) and so are the uncertain results (cleared past
// kUncertainWords words); the node and step tables grow with the distinct stacks matchers reach.
// A closure that expands more than kMaxClosure frames throws GrammarError.
//
// Thread-safety: none inside. Every member function must be called with `mu` held; Matcher
// takes it around each call, so matchers on different threads may share one CompiledGrammar.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/token_index.h"

namespace exl {

class MatchCaches {
 public:
  static constexpr int32_t kRoot = -1;     // parent of the start rule's frame: popping it accepts
  static constexpr int32_t kBarrier = -2;  // parent in mask precomputation: popping it sets barrier
  static constexpr size_t kMaxClosure = 200000;
  static constexpr size_t kMaskCacheEntries = 2048;
  static constexpr size_t kUncertainWords = size_t(16) << 20;

  // idx may be null: then only start, step and walk_bytes may be used (no masks).
  MatchCaches(const Grammar& grammar, const TokenIndex* idx);

  std::mutex mu;

  const Grammar& grammar() const { return g; }
  const TokenIndex* index() const { return idx; }

  // The position at (rule, state) under `parent` (kRoot for a whole input), closure applied.
  MatchState start(int32_t rule, int32_t state, int32_t parent);
  // The position after byte b (out.dead() when b leaves the language).
  void step(const MatchState& in, uint8_t b, MatchState& out);
  // Advances cur by bytes; false (cur then unspecified) when they leave the language.
  bool walk_bytes(MatchState& cur, std::string_view bytes);
  // The one byte every node of s can consume next (0..255), -1 when none can, -2 when there is a
  // choice of bytes.
  int single_next_byte(const MatchState& s) const;
  // The allowed tokens at s as a bitset of index()->mask_words() words, EOS ids set when s
  // accepts. The reference stays valid until the next call.
  const std::vector<uint32_t>& mask(const MatchState& s);
  // An estimate of the heap bytes the tables hold now (node and step tables, position masks,
  // uncertain results, whole masks); it grows as matchers reach new stacks.
  size_t memory_bytes() const;

 private:
  struct NodeKey {
    int32_t rule, state, parent;
    bool operator==(const NodeKey&) const = default;
  };
  struct NodeKeyHash {
    size_t operator()(const NodeKey& k) const;
  };
  // The uncertain tokens of a position that one node accepts: a list, or a bitset when large.
  struct UncertainResult {
    std::vector<int32_t> list;
    std::vector<uint32_t> bits;
  };
  // Per state of a rule, for one slice: how far the slice's language reaches, and whether exactly.
  struct SliceReach {
    std::vector<uint32_t> reach;
    std::vector<uint8_t> exact;
  };
  // Per language state of a slice: the distinct (byte class of the rule, next language state) pairs.
  using ClassSteps = std::vector<std::vector<std::pair<uint8_t, uint8_t>>>;
  // Scratch arrays indexed by product node, reset through the list of touched entries.
  struct Scratch {
    std::vector<uint32_t> a, b;
    std::vector<uint32_t> touched;
    void prepare(size_t n);
    void reset();
  };
  static constexpr uint32_t kUnset = UINT32_MAX;
  static constexpr uint32_t kFar = UINT32_MAX;
  static constexpr uint32_t kUnsetReach = UINT32_MAX - 2;

  // Stack nodes and byte steps.
  int32_t intern(int32_t rule, int32_t state, int32_t parent);
  void pop_to(int32_t parent, MatchState& out);
  void closure(MatchState& out);
  const MatchState& step1(int32_t n, uint8_t b);
  const MatchState* advance(const MatchState& in, uint8_t b, MatchState& buf);

  // Position masks.
  const std::vector<std::array<uint8_t, 3>>& runs(int32_t rule);
  const std::vector<uint8_t>& flags(int32_t rule);
  std::optional<std::string> callfree_key(int32_t rule, int32_t state);
  const PositionMask& position(int32_t rule, int32_t state);
  PositionMask compute_position(int32_t rule, int32_t state);
  void walk_trie(int32_t rule, int32_t state, const TokenTrie& trie, std::vector<int32_t>& acc,
                 std::vector<int32_t>& unc);

  // Slices: how much of a slice's language a position surely accepts.
  const ClassSteps& class_steps(int32_t rule, size_t slice);
  static void expand(const Rule& r, const uint8_t* fl, const ClassSteps& cs, uint32_t p, bool clean,
                     std::vector<uint32_t>& succ, bool& bad, bool& dirty);
  std::pair<uint32_t, bool> reach_from(int32_t rule, int32_t state, size_t slice);
  const SliceReach& slice_reach(int32_t rule, int32_t state, size_t slice);

  // Uncertain tokens against the real stack.
  void check_uncertain(int32_t n, const std::vector<int32_t>& tokens, std::vector<int32_t>& out);
  int32_t canonical(int32_t n);
  bool char_like(int32_t b, size_t i);
  int32_t repeat_slice(int32_t n);

  // EXL_GRAMMAR_VERIFY self-checks.
  void verify_position(int32_t rule, int32_t state, const PositionMask& pm, std::vector<int32_t> acc,
                       std::vector<int32_t> unc);
  void verify_repeat_slice(int32_t n, const std::vector<int32_t>& uncertain, const std::vector<uint32_t>& sb);

  const Grammar& g;
  const TokenIndex* idx;
  std::vector<NodeKey> nodes;
  std::vector<std::vector<uint32_t>> node_steps;  // per node, per byte class: index into step_results
  // Node ids by key: open addressing over ids (the keys are nodes[id]), grown incrementally: a
  // table twice the size takes the old one's ids a few per insertion, so no single step pays for
  // moving all of them (a one-shot rehash of ~100,000 nodes cost a mask ~10 ms).
  struct NodeTable {
    static constexpr size_t kMovesPerInsert = 8;
    std::vector<int32_t> cur, old;  // -1: empty slot
    size_t n_cur = 0, drain = 0;
    static size_t slot(const std::vector<int32_t>& t, const NodeKey& k, const std::vector<NodeKey>& keys);
    int32_t find(const NodeKey& k, const std::vector<NodeKey>& keys) const;
    void insert(int32_t id, const std::vector<NodeKey>& keys);
  };
  NodeTable node_ids;
  std::deque<MatchState> step_results;  // [0] is the dead state
  std::unordered_map<uint64_t, std::shared_ptr<const PositionMask>> positions;
  std::unordered_map<std::string, std::vector<uint32_t>> masks;
  std::deque<const std::string*> mask_order;  // keys of masks, oldest first
  size_t max_depth = 0;
  std::vector<int32_t> work;
  std::vector<int32_t> seen;
  std::unordered_map<int32_t, UncertainResult> node_uncertain;  // canonical node -> accepted uncertain tokens
  size_t node_uncertain_size = 0;
  std::vector<std::vector<std::array<uint8_t, 3>>> rule_runs;
  std::vector<std::vector<uint8_t>> rule_flags;
  std::vector<std::vector<SliceReach>> rule_reach;   // rule -> slice
  std::vector<std::vector<uint8_t>> rule_char_like;  // rule -> slice: 0, 1, 2 = unknown
  std::vector<std::vector<ClassSteps>> rule_class_steps;  // rule -> slice
  std::vector<int32_t> walk_state;
  std::vector<uint8_t> walk_seen;
  Scratch scratch;
  size_t table_bytes = 0;  // nodes, steps and position masks (never freed before the caches)
  size_t mask_bytes = 0;   // whole masks (freed as they are evicted)
  bool debug = false;   // EXL_GRAMMAR_DEBUG: position timings on stderr
  bool verify = false;  // EXL_GRAMMAR_VERIFY: self-checks of the mask shortcuts
};

}  // namespace exl
