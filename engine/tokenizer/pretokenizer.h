// A tokenizer.json "pre_tokenizer": cuts normalized text into the words BPE runs on. Supported:
// null (the whole text is one word), Sequence, Split (Isolated, not inverted; see SplitRegex),
// ByteLevel (with or without its GPT-2 regex; it must come last, and marks the words as bytes to
// be written in the byte-level alphabet) and Metaspace (spaces -> "▁", prepend scheme, split).
// Immutable after construction; run is safe to call concurrently.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/split_regex.h"

namespace exl {

class PreTokenizer {
 public:
  PreTokenizer() = default;  // one word per text
  // Throws exl::Error naming `where` for unsupported types or options.
  static PreTokenizer from_json(const nlohmann::json& j, std::string_view where);

  // Cuts `text` (a normalized piece of input that starts at byte `offset` of the whole input)
  // into words. Words view `text` or `storage`, which must outlive them.
  void run(std::string_view text, size_t offset, std::string& storage, std::vector<std::string_view>& words) const;

  // Whether BPE sees the words' bytes through the byte-level alphabet.
  bool byte_level() const { return byte_level_; }

  // Whether the words of a text prefix are settled as PrefixEncodeMemo assumes: byte-level, no
  // prefix space or Metaspace (the words view the text itself), and only split patterns known to
  // end words on the first character that cannot extend them (GPT-2's, Llama 3's, Qwen2's).
  bool settles_at_word_ends() const { return settles_ && byte_level_ && !metaspace_; }

  enum class Prepend { never, first, always };
  // The Metaspace prepend scheme (never when there is no Metaspace step).
  Prepend metaspace_prepend() const { return metaspace_ ? prepend_ : Prepend::never; }

 private:
  void add(const nlohmann::json& j, std::string_view where, bool last);
  std::vector<SplitRegex> splits_;
  bool byte_level_ = false;
  bool settles_ = false;
  bool byte_level_prefix_space_ = false;
  bool metaspace_ = false;
  bool metaspace_split_ = false;
  std::string replacement_;
  Prepend prepend_ = Prepend::never;
};

}  // namespace exl
