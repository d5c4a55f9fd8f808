#include "engine/tokenizer/prefix_encode_memo.h"

#include <algorithm>

namespace exl {

namespace {

constexpr size_t kSettle = 8;

bool ascii_alnum(char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

size_t common_prefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace

size_t PrefixEncodeMemo::reuse(std::string_view text, Words& out) const {
  out = {};
  if (text.size() < kMinBytes) return 0;
  std::lock_guard lock(mu_);
  Entry* best = nullptr;
  size_t best_words = 0, best_bytes = 0;
  for (Entry& e : entries_) {
    const size_t lcp = common_prefix(text, e.text);
    if (lcp < kSettle + 1) continue;
    const std::vector<uint32_t>& ends = e.words.word_end;
    // Words ending at or before lcp − kSettle, then back to one whose last byte is alphanumeric.
    size_t k = size_t(std::upper_bound(ends.begin(), ends.end(), uint32_t(lcp - kSettle)) - ends.begin());
    while (k > 0 && !ascii_alnum(text[ends[k - 1] - 1])) --k;
    if (k > 0 && ends[k - 1] > best_bytes) {
      best = &e;
      best_words = k;
      best_bytes = ends[k - 1];
    }
  }
  if (!best) return 0;
  best->used = ++clock_;
  ++hits_;
  out.word_end.assign(best->words.word_end.begin(), best->words.word_end.begin() + best_words);
  out.id_end.assign(best->words.id_end.begin(), best->words.id_end.begin() + best_words);
  out.ids.assign(best->words.ids.begin(), best->words.ids.begin() + best->words.id_end[best_words - 1]);
  return best_bytes;
}

void PrefixEncodeMemo::store(std::string_view text, Words words) {
  if (text.size() < kMinBytes || text.size() > kMaxBytes) return;
  std::lock_guard lock(mu_);
  for (Entry& e : entries_)
    if (e.text == text) {
      e.used = ++clock_;
      return;
    }
  if (entries_.size() < kEntries) {
    entries_.push_back({std::string(text), std::move(words), ++clock_});
    return;
  }
  Entry& lru = *std::min_element(entries_.begin(), entries_.end(),
                                 [](const Entry& a, const Entry& b) { return a.used < b.used; });
  lru = {std::string(text), std::move(words), ++clock_};
}

uint64_t PrefixEncodeMemo::hits() const {
  std::lock_guard lock(mu_);
  return hits_;
}

}  // namespace exl
