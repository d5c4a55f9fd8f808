// A tokenizer.json "normalizer": the text rewrite applied to each piece of input text (between
// added tokens) before pre-tokenization. Supported: null, Sequence, Prepend, Replace (String or
// Regex pattern through RE2) and NFC.
//
// NFC is applied as the identity. Hugging Face composes canonically equivalent sequences first
// (e.g. "e" + U+0301 -> "é"); text that is already in NFC, which is what keyboards, the web and
// every conformance vector here produce, is unaffected. Decomposed input (macOS file names, some
// PDFs) may tokenize differently from Hugging Face until composition is implemented.
// Immutable after construction; apply is safe to call concurrently.
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace re2 {
class RE2;
}

namespace exl {

class TextNormalizer {
 public:
  TextNormalizer() = default;  // the identity
  // Parses a "normalizer" value; throws exl::Error naming `where` and the unsupported type.
  static TextNormalizer from_json(const nlohmann::json& j, std::string_view where);

  std::string apply(std::string_view text) const;
  bool is_identity() const { return steps_.empty(); }
  // Whether a Prepend step puts a SentencePiece "▁" in front of every piece.
  bool prepends_metaspace() const;

 private:
  enum class Kind { prepend, replace_string, replace_regex };
  struct Step {
    Kind kind;
    std::string text;     // the prepended text, the pattern string, or the replacement
    std::string content;  // the replacement for replace_*
    std::shared_ptr<re2::RE2> re;
  };
  void add(const nlohmann::json& j, std::string_view where);
  std::vector<Step> steps_;
};

}  // namespace exl
