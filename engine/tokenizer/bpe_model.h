// The "BPE" model of a tokenizer.json: a vocabulary, ranked merges, and the encoding of one
// pre-tokenized word. A word starts as one symbol per character (per byte, in the byte-level
// alphabet, for byte-level tokenizers); characters missing from the vocabulary become their
// "<0xXX>" byte tokens (byte_fallback) or the unknown token. Then the adjacent pair with the lowest
// merge rank (leftmost on ties) is merged until no pair has a merge, as Hugging Face does.
// With ignore_merges (Llama 3) a word that is itself in the vocabulary is one token.
// Words are cached; encode_word is safe to call concurrently.
#pragma once
#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

namespace exl {

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using StringIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  // Parses the "model" object; throws exl::Error naming `where` on anything malformed.
  BpeModel(const nlohmann::json& model, std::string_view where);

  // Appends the ids of `word`. byte_level: the word's raw bytes are spelled in the byte-level
  // alphabet.
  void encode_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;

  const StringIdMap& vocab() const { return vocab_; }
  std::optional<int32_t> find(std::string_view piece) const;
  bool byte_fallback() const { return byte_fallback_; }
  size_t n_merges() const { return merges_.size(); }

 private:
  struct Merge {
    uint32_t rank;
    int32_t id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  void initial_symbols(std::string_view word, bool byte_level, std::vector<int32_t>& syms) const;
  void merge(std::vector<int32_t>& syms) const;

  StringIdMap vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  std::array<int32_t, 256> byte_ids_{};      // byte-level alphabet character -> id (-1: none)
  std::array<int32_t, 256> fallback_ids_{};  // "<0xXX>" -> id (-1: none)
  std::optional<int32_t> unk_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;

  static constexpr size_t kCacheWords = 1 << 16;
  static constexpr size_t kCacheMaxWordBytes = 256;
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace exl
