// Added tokens: vocabulary entries matched literally in the input before any normalization or
// model runs (special tokens such as "<|eot_id|>", and plain added ones such as Qwen's "<think>").
// The splitter cuts text into literal-token pieces and the text between them, matching the
// leftmost, then longest, token as Hugging Face's added vocabulary does, and honours lstrip and
// rstrip (the token swallows the whitespace beside it) and single_word (the token only matches
// between non-word characters). Tokens marked `normalized` are matched against the raw text too.
// A prompt split (split with special ranges) recognises special tokens only inside the ranges its
// caller vouches for (a chat template's own markup), so text from users and tools can never turn
// into a special token.
// Immutable after construction; split is safe to call concurrently.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace re2 {
class RE2;
}

namespace exl {

// A byte range [begin, end) of a text.
struct TextRange {
  size_t begin = 0;
  size_t end = 0;
};

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

class AddedTokenSplitter {
 public:
  explicit AddedTokenSplitter(std::vector<AddedToken> tokens);
  ~AddedTokenSplitter();
  AddedTokenSplitter(AddedTokenSplitter&&) noexcept;
  AddedTokenSplitter& operator=(AddedTokenSplitter&&) noexcept;

  struct Piece {
    std::string_view text;  // the text piece, or the matched token text (with stripped spaces)
    int32_t id = -1;        // the added token's id; -1 for text to be tokenized
    size_t offset = 0;      // where the piece starts in the input
  };
  // Splits `text`; with_special=false ignores special tokens (their text stays plain text).
  // Empty text pieces are left out.
  std::vector<Piece> split(std::string_view text, bool with_special) const;
  // Splits `text` recognising a special token only where its text lies wholly inside one of
  // `special_ranges` (sorted by begin, not overlapping); a special token's text anywhere else
  // stays plain text, and the search goes on inside it (a non-special token may start there).
  // Non-special tokens are recognised everywhere. With one range covering the whole text this is
  // split(text, true).
  std::vector<Piece> split(std::string_view text, std::span<const TextRange> special_ranges) const;

  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  std::vector<Piece> split_impl(std::string_view text, bool with_special,
                                const std::span<const TextRange>* special_ranges) const;

  std::vector<AddedToken> tokens_;
  std::unordered_map<std::string, size_t> by_content_;
  std::unique_ptr<re2::RE2> all_, plain_;  // every token / the non-special ones
};

}  // namespace exl
