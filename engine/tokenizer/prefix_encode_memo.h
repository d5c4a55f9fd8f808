// Token ids of recently encoded long text pieces, kept so that a piece sharing a long prefix with
// one of them (the next turn of a conversation, the same document with a new question) is split
// and run through BPE only from where the shared prefix stops settling the words.
//
// For the split-regex pre-tokenizers of byte-level BPE (GPT-2, Llama 3, Qwen): every pattern
// alternative there ends a word on the first character that cannot extend it, except whitespace
// runs, whose end depends on the whole run. So the words before a word end b are the same in any
// text that agrees with the stored one on [0, b + 8) when the byte before b is an ASCII letter or
// digit (no whitespace run reaches b, and b + 8 covers the character that ended the word). Words
// are encoded independently, so their ids are too; a new split started at b continues the old one
// (the patterns use no look-behind, ^ or \b).
//
// Thread-safe: reuse and store lock one mutex.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace exl {

class PrefixEncodeMemo {
 public:
  // Pieces shorter than this are not stored (their encoding is cheap) and not looked up.
  static constexpr size_t kMinBytes = 1024;
  // Longer pieces are not stored (bounds the memo at a few times kEntries · kMaxBytes).
  static constexpr size_t kMaxBytes = size_t(4) << 20;
  static constexpr size_t kEntries = 8;

  // A piece's encoding as its words left it: word k ends at byte word_end[k], and the ids of words
  // 0..k are ids[0, id_end[k]).
  struct Words {
    std::vector<uint32_t> word_end;
    std::vector<uint32_t> id_end;
    std::vector<int32_t> ids;
  };

  // The longest settled prefix of `text` among the stored pieces: its length in bytes (0 when
  // none) and its words (empty when none).
  size_t reuse(std::string_view text, Words& out) const;
  // Stores `text` with its words (replacing the least recently used entry).
  void store(std::string_view text, Words words);

  // Lookups that reused a prefix, for tests and statistics.
  uint64_t hits() const;

 private:
  struct Entry {
    std::string text;
    Words words;
    uint64_t used = 0;
  };
  mutable std::mutex mu_;
  mutable std::vector<Entry> entries_;
  mutable uint64_t clock_ = 0;
  mutable uint64_t hits_ = 0;
};

}  // namespace exl
