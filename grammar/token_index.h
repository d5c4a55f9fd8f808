// The vocabulary of one tokenizer as a byte trie, built once and shared by every grammar compiled
// for that tokenizer. Input: each token's exact byte string (byte-fallback tokens as their byte,
// SentencePiece "▁" as a space, byte-level BPE characters mapped back to bytes) and the ids that end
// a generation. Tokens with empty bytes (special tokens other than EOS, holes) are never allowed
// by a grammar; EOS ids are allowed exactly where the grammar accepts.
// Also built once: "slices" (after llguidance's slicer) — token sets defined by a byte language
// (JSON string-body text); a grammar position that provably accepts every string of a slice's
// language ORs the slice's bitset and walks only the trie of the remaining tokens.
// Immutable after construction apart from an internal, locked mask cache; safe to share between
// threads.
#pragma once
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace exl {

struct TrieNode {
  uint8_t byte = 0;
  uint16_t depth = 0;       // bytes from the root (the root has depth 0)
  uint32_t subtree_end = 0;  // index of the first node after this node's subtree (DFS order)
  uint32_t tok_begin = 0, tok_end = 0;  // tokens ending exactly here: tokens[tok_begin, tok_end)
};

// A byte trie over a set of tokens, nodes in DFS order (nodes[0] is the root).
struct TokenTrie {
  std::vector<TrieNode> nodes;
  std::vector<int32_t> tokens;
  size_t max_depth = 0;
};

// A byte language over which a slice is defined: a tiny DFA (state 0 = start, every state is
// accepting) given as byte ranges per state. Tokens whose bytes stay inside it are the slice.
struct SliceRange {
  uint8_t lo, hi;
  uint8_t next;
};
// Positions deep inside long strings use the slice up to short_len characters and walk
// rest_short (the other tokens plus the few longer members), so the search for how much of the
// language a position surely accepts stays short; positions that accept members up to a few
// characters walk the matching rest_longer trie.
struct TokenSlice {
  static constexpr size_t kShortLen = 16;
  std::vector<std::vector<SliceRange>> states;
  size_t max_len = 0;  // characters of the longest member (a character cut at the end counts)
  size_t short_len = 0;  // min(kShortLen, max_len)
  std::vector<std::vector<uint32_t>> by_len;  // [k]: bitset of the members of at most k characters
  TokenTrie rest;                             // every other token with bytes
  TokenTrie rest_short;                       // rest and the members longer than short_len
  // For positions that surely accept the members of up to k < short_len characters but not
  // every longer one: rest and the members longer than k, by increasing k (kLongerThan).
  static constexpr uint32_t kLongerThan[] = {4, 8, 12};
  std::vector<std::pair<uint32_t, TokenTrie>> rest_longer;
};

// The tokens an automaton position allows without looking below its own rule frame: `accepted`
// (as a bitset when large, else a list; plus the members of slice `slice` of at most `slice_len`
// characters when slice >= 0) and
// `uncertain` (sorted by bytes; they leave the rule mid-token, so the real stack decides).
struct PositionMask {
  std::vector<uint32_t> bits;
  std::vector<int32_t> accepted;
  std::vector<int32_t> uncertain;
  int32_t slice = -1;
  uint32_t slice_len = 0;
};

class TokenIndex {
 public:
  static constexpr size_t kMaskCacheEntries = size_t(1) << 17;
  static constexpr size_t kMaskCacheBytes = size_t(256) << 20;
  // eos ids must lie in [0, token_bytes.size()); their bytes are ignored.
  TokenIndex(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids);

  // Unique among all TokenIndexes of this process, never reused (the compiled-grammar cache's key).
  uint64_t id() const { return id_; }
  size_t vocab_size() const { return bytes_.size(); }
  size_t mask_words() const { return (bytes_.size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  const std::vector<int32_t>& eos_ids() const { return eos_; }
  bool is_eos(int32_t id) const;
  const TokenTrie& trie() const { return trie_; }
  const std::vector<TrieNode>& nodes() const { return trie_.nodes; }
  const std::vector<int32_t>& trie_tokens() const { return trie_.tokens; }
  size_t max_depth() const { return trie_.max_depth; }
  // Slices, largest language first: [0] JSON string text (printable ASCII but '"' and '\', and
  // well-formed UTF-8, possibly cut at the end), [1] its ASCII part.
  const std::vector<TokenSlice>& slices() const { return slices_; }

  // A cache shared by every grammar on this vocabulary: position masks of call-free automata,
  // keyed by a canonical serialization of the automaton from that position. Thread-safe. Bounded
  // (kMaskCacheBytes, kMaskCacheEntries; the table is sized for the entries up front, so an
  // insertion never rehashes it): past a bound the oldest entries go, a few at a time, so no
  // single call pays for rebuilding or freeing the whole cache.
  std::shared_ptr<const PositionMask> cached_mask(const std::string& key) const;
  void cache_mask(const std::string& key, std::shared_ptr<const PositionMask> mask) const;

 private:
  TokenTrie build_trie(std::vector<int32_t> ids) const;
  TokenSlice build_slice(std::vector<std::vector<SliceRange>> states) const;

  uint64_t id_;
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_;
  std::vector<uint8_t> is_eos_;
  TokenTrie trie_;
  std::vector<TokenSlice> slices_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const PositionMask>> cache_;
  mutable std::deque<std::pair<const std::string*, size_t>> cache_order_;  // oldest first: key, bytes
  mutable size_t cache_bytes_ = 0;
};

}  // namespace exl
