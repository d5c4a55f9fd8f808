// Grammar + vocabulary -> token masks.
//
// CompiledGrammar: an immutable Grammar bound to a TokenIndex, plus the MatchCaches shared by all
// matchers of that grammar (stack nodes, byte steps, per-position token masks, whole masks:
// grammar/match_caches.h). Held as shared_ptr; the caches sit behind one mutex, so matchers on
// different threads may share it.
//
// Matcher: one per generation job (not thread-safe itself). Its state is a set of stacks of
// (rule, automaton state) frames — a nondeterministic pushdown automaton over bytes. Masks:
//  - for each automaton position (rule, state), the tokens whose bytes are consumed without
//    returning from that rule are classified once (accepted / rejected, context-independent) by a
//    walk of the token trie; tokens that would return from the rule mid-token are "uncertain";
//  - fill_mask ORs the per-position accepted sets of the current stacks and checks only the
//    uncertain tokens against the real stacks; results are cached per stack set.
// EOS ids are allowed exactly when the input so far is a complete match.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/token_index.h"

namespace exl {

class MatchCaches;  // grammar/match_caches.h (internal)

class CompiledGrammar {
 public:
  // index may be null: such a grammar checks bytes (Matcher::accept_bytes) but cannot fill masks.
  CompiledGrammar(Grammar grammar, std::shared_ptr<const TokenIndex> index);
  ~CompiledGrammar();
  const Grammar& grammar() const { return grammar_; }
  const TokenIndex* index() const { return index_.get(); }
  MatchCaches& caches() const { return *caches_; }
  // An estimate of the heap bytes this grammar holds: its rules and what its matchers have cached
  // so far (takes the caches' lock; the shared TokenIndex is not counted).
  size_t memory_bytes() const;

 private:
  Grammar grammar_;
  std::shared_ptr<const TokenIndex> index_;
  std::unique_ptr<MatchCaches> caches_;
  size_t rule_bytes_ = 0;
};

// The matcher's position: stacks as ids of shared stack nodes, and whether the input so far is a
// complete match.
struct MatchState {
  std::vector<int32_t> nodes;  // sorted; each node's top frame can consume a byte
  bool accept = false;
  bool barrier = false;  // internal: a frame below the start was popped (mask precomputation)
  bool dead() const { return nodes.empty() && !accept; }
  bool operator==(const MatchState&) const = default;
};

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Sets bit t%32 of word t/32 for every allowed token (mask must hold index()->mask_words()
  // words; other bits are left alone, so clear it first). Throws without a TokenIndex.
  void fill_mask(std::span<uint32_t> mask);
  // Advances by one token; false (and no change) when the token is not allowed. Accepting an EOS
  // id in an accepting state marks the matcher terminated.
  bool accept(int32_t token);
  // Advances by raw bytes as one step; false (and no change) when they leave the language.
  bool accept_bytes(std::string_view bytes);
  // Undoes the last n successful accept/accept_bytes calls (n <= steps()).
  void rollback(size_t n);
  size_t steps() const { return history_.size() - 1; }
  bool is_accepting() const { return history_.back().accept; }
  bool is_terminated() const { return terminated_; }
  // The bytes the grammar forces next (empty when there is a choice or the input may end here).
  std::string forced_bytes() const;

 private:
  std::shared_ptr<const CompiledGrammar> g_;
  std::vector<MatchState> history_;  // history_.back() is the current state
  std::vector<bool> term_history_;
  bool terminated_ = false;
};

}  // namespace exl
