#include "engine/generate/speculation.h"

#include <algorithm>
#include <string>
#include <unordered_map>

namespace exl {

std::string_view to_string(Speculation s) {
  switch (s) {
    case Speculation::none: return "none";
    case Speculation::ngram: return "ngram";
    case Speculation::draft: return "draft";
    case Speculation::auto_: return "auto";
  }
  return "?";
}

std::optional<Speculation> parse_speculation(std::string_view text) {
  if (text == "none") return Speculation::none;
  if (text == "ngram") return Speculation::ngram;
  if (text == "draft") return Speculation::draft;
  if (text == "auto") return Speculation::auto_;
  return std::nullopt;
}

std::vector<int32_t> ngram_draft(std::span<const int32_t> tokens, int max_draft, int max_ngram, int min_ngram,
                                 std::span<const int32_t> classes) {
  const int64_t len = int64_t(tokens.size());
  if (max_draft <= 0) return {};
  auto cls = [&](int32_t t) { return t >= 0 && size_t(t) < classes.size() ? classes[size_t(t)] : t; };
  for (int n = std::min<int64_t>(max_ngram, len - 1); n >= std::max(1, min_ngram); --n) {
    const auto tail = tokens.subspan(size_t(len - n));
    // Latest start s < len - n with tokens[s, s + n) == tail; what follows it is the draft.
    for (int64_t s = len - n - 1; s >= 0; --s) {
      if (!std::equal(tail.begin(), tail.end(), tokens.begin() + s,
                      [&](int32_t x, int32_t y) { return cls(x) == cls(y); }))
        continue;
      const int64_t from = s + n, to = std::min<int64_t>(len, from + max_draft);
      return {tokens.begin() + from, tokens.begin() + to};
    }
  }
  return {};
}

std::vector<int32_t> lookup_classes(const Tokenizer& tokenizer) {
  const int32_t n = int32_t(tokenizer.vocab_size());
  std::unordered_map<std::string_view, int32_t> by_bytes;
  by_bytes.reserve(size_t(n));
  for (int32_t t = 0; t < n; ++t)
    if (!tokenizer.is_special(t)) by_bytes.emplace(tokenizer.token_bytes(t), t);
  std::vector<int32_t> classes(static_cast<size_t>(n));
  for (int32_t t = 0; t < n; ++t) {
    classes[size_t(t)] = t;
    const std::string& b = tokenizer.token_bytes(t);
    if (b.size() < 2 || b[0] != ' ' || tokenizer.is_special(t)) continue;
    if (auto it = by_bytes.find(std::string_view(b).substr(1)); it != by_bytes.end()) classes[size_t(t)] = it->second;
  }
  return classes;
}

void DraftLength::update(int drafted, int accepted) {
  if (drafted <= 0) return;
  if (accepted >= drafted) cur = std::min(max, cur + 1);
  else if (accepted == 0) cur = std::max(1, cur / 2);
}

}  // namespace exl
