// A tokenizer.json "Split" pre-tokenizer pattern (written for Oniguruma) run through RE2.
//
// RE2 has no look-around and its \s is ASCII-only, so the pattern is translated:
//  - \s, \S, \d, \w (and their negations) become explicit Unicode classes as Oniguruma defines them;
//  - the GPT-2 idiom "\s+(?!\S)|\s+" ending the pattern becomes one captured "\s+" whose match is
//    shortened afterwards: a whitespace run followed by a non-space character gives that
//    character's neighbour back (the run minus its last character), unless the run is a single
//    character, which "\s+" then takes whole. Any other look-around is rejected.
// Immutable after construction; split is safe to call concurrently.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace re2 {
class RE2;
}

namespace exl {

class SplitRegex {
 public:
  // Throws exl::Error naming the pattern when it uses a construct that cannot be translated.
  explicit SplitRegex(std::string_view pattern);
  ~SplitRegex();
  SplitRegex(SplitRegex&&) noexcept;
  SplitRegex& operator=(SplitRegex&&) noexcept;

  // Appends the pieces of `text` in order: every match and every unmatched stretch between
  // matches ("Isolated" behaviour). The pieces concatenate to `text`.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

  // The RE2 pattern the Oniguruma pattern was translated to.
  const std::string& translated() const { return translated_; }

 private:
  std::string translated_;
  std::unique_ptr<re2::RE2> re_;
  bool lookahead_group_ = false;
};

}  // namespace exl
