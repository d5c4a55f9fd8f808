#include "engine/generate/speculation.h"

#include <algorithm>

namespace exl {

std::string_view to_string(Speculation s) {
  switch (s) {
    case Speculation::none: return "none";
    case Speculation::ngram: return "ngram";
    case Speculation::auto_: return "auto";
  }
  return "?";
}

std::optional<Speculation> parse_speculation(std::string_view text) {
  if (text == "none") return Speculation::none;
  if (text == "ngram") return Speculation::ngram;
  if (text == "auto") return Speculation::auto_;
  return std::nullopt;
}

std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int max_draft, int max_ngram, int min_ngram) {
  const int64_t len = int64_t(tokens.size());
  if (max_draft <= 0) return {};
  for (int n = std::min<int64_t>(max_ngram, len - 1); n >= std::max(1, min_ngram); --n) {
    const auto tail = tokens.subspan(size_t(len - n));
    // Latest start s < len - n with tokens[s, s + n) == tail; what follows it is the draft.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (!std::equal(tail.begin(), tail.end(), tokens.begin() + s)) continue;
      const int64_t from = s + n, to = std::min<int64_t>(len, from + max_draft);
      return {tokens.begin() + from, tokens.begin() + to};
    }
  }
  return {};
}

void DraftLength::update(int drafted, int accepted) {
  if (drafted <= 0) return;
  if (accepted >= drafted) cur = std::min(max, cur + 1);
  else if (accepted == 0) cur = std::max(1, cur / 2);
}

}  // namespace exl
