#include "engine/tokenizer/detokenizer.h"

#include "engine/tokenizer/utf8.h"

namespace exl {

Detokenizer::Detokenizer(const Tokenizer& tokenizer, bool sequence_start, bool skip_special)
    : tok_(tokenizer), skip_special_(skip_special) {
  if (!sequence_start) state_ = DecodeState{false, false};
}

std::string Detokenizer::push(int32_t id) {
  tok_.append_token_bytes(state_, id, skip_special_, pending_);
  std::string out;
  size_t used = utf8::append_lossy(out, pending_, false);
  pending_.erase(0, used);
  return out;
}

std::string Detokenizer::flush() {
  std::string out;
  utf8::append_lossy(out, pending_, true);
  pending_.clear();
  return out;
}

}  // namespace exl
