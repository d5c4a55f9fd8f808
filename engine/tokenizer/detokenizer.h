// Incremental detokenization for streaming: push token ids one at a time and get back the text
// they complete. Output never ends inside a UTF-8 character: bytes of an incomplete character
// (a byte-fallback or byte-level token carrying part of one) are held until the character is
// complete, or shown as U+FFFD once it can no longer become valid. For a detokenizer started at
// the sequence start, the concatenation of every push() and the final flush() equals
// tokenizer.decode(ids) for the same ids, including the dummy-prefix rule.
// Not thread-safe; one per stream. The tokenizer must outlive it.
#pragma once
#include <cstdint>
#include <string>

#include "engine/tokenizer/tokenizer.h"

namespace exl {

class Detokenizer {
 public:
  // sequence_start=false continues text already shown (a generation after its prompt): no
  // dummy-prefix space is dropped from the first token.
  explicit Detokenizer(const Tokenizer& tokenizer, bool sequence_start = true, bool skip_special = false);

  // The text token `id` completes (possibly empty). Throws exl::Error for an id out of range.
  std::string push(int32_t id);
  // Whatever is held back, with an incomplete character as U+FFFD; the stream can go on.
  std::string flush();
  // Bytes held back waiting for the rest of a character.
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tok_;
  DecodeState state_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace exl
