// The vocabulary of one tokenizer as a byte trie, built once and shared by every grammar compiled
// for that tokenizer. Input: each token's exact byte string (byte-fallback tokens as their byte,
// SentencePiece "▁" as a space, byte-level BPE characters mapped back to bytes) and the ids that end
// a generation. Tokens with empty bytes (special tokens other than EOS, holes) are never allowed
// by a grammar; EOS ids are allowed exactly where the grammar accepts.
// Immutable after construction apart from an internal, locked mask cache; safe to share between
// threads.
#pragma once
#include <cstdint>
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
  uint32_t tok_begin = 0, tok_end = 0;  // tokens ending exactly here: trie_tokens[tok_begin, tok_end)
};

// The tokens an automaton position allows without looking below its own rule frame: `accepted`
// (as a bitset when large, else a list) and `uncertain` (sorted by bytes; they leave the rule
// mid-token, so the real stack decides).
struct PositionMask {
  std::vector<uint32_t> bits;
  std::vector<int32_t> accepted;
  std::vector<int32_t> uncertain;
};

class TokenIndex {
 public:
  // eos ids must lie in [0, token_bytes.size()); their bytes are ignored.
  TokenIndex(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids);

  size_t vocab_size() const { return bytes_.size(); }
  size_t mask_words() const { return (bytes_.size() + 31) / 32; }
  const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
  const std::vector<int32_t>& eos_ids() const { return eos_; }
  bool is_eos(int32_t id) const;
  const std::vector<TrieNode>& nodes() const { return nodes_; }  // nodes()[0] is the root
  const std::vector<int32_t>& trie_tokens() const { return trie_tokens_; }

  // A cache shared by every grammar on this vocabulary: position masks of call-free automata,
  // keyed by a canonical serialization of the automaton from that position. Thread-safe.
  std::shared_ptr<const PositionMask> cached_mask(const std::string& key) const;
  void cache_mask(const std::string& key, std::shared_ptr<const PositionMask> mask) const;

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_;
  std::vector<uint8_t> is_eos_;
  std::vector<TrieNode> nodes_;
  std::vector<int32_t> trie_tokens_;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const PositionMask>> cache_;
  mutable size_t cache_bytes_ = 0;
};

}  // namespace exl
