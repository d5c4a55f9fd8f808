#include "grammar/token_index.h"

#include <algorithm>
#include <atomic>

#include "grammar/grammar_error.h"

namespace exl {

namespace {

// JSON string text: printable ASCII except '"' and '\', plus well-formed UTF-8 (no overlongs,
// no surrogates), a token may end inside a character.
std::vector<std::vector<SliceRange>> json_text_language(bool utf8) {
  enum : uint8_t { B, C1, C2, C3, E0, ED, F0, F4 };
  std::vector<std::vector<SliceRange>> s(utf8 ? 8 : 1);
  s[B] = {{0x20, 0x21, B}, {0x23, 0x5B, B}, {0x5D, 0x7E, B}};
  if (!utf8) return s;
  s[B].insert(s[B].end(), {{0xC2, 0xDF, C1}, {0xE0, 0xE0, E0}, {0xE1, 0xEC, C2}, {0xED, 0xED, ED},
                           {0xEE, 0xEF, C2}, {0xF0, 0xF0, F0}, {0xF1, 0xF3, C3}, {0xF4, 0xF4, F4}});
  s[C1] = {{0x80, 0xBF, B}};
  s[C2] = {{0x80, 0xBF, C1}};
  s[C3] = {{0x80, 0xBF, C2}};
  s[E0] = {{0xA0, 0xBF, C1}};
  s[ED] = {{0x80, 0x9F, C1}};
  s[F0] = {{0x90, 0xBF, C2}};
  s[F4] = {{0x80, 0x8F, C2}};
  return s;
}

bool in_language(const std::vector<std::vector<SliceRange>>& lang, const std::string& s) {
  uint8_t st = 0;
  for (char c : s) {
    auto b = uint8_t(c);
    bool found = false;
    for (const SliceRange& r : lang[st])
      if (b >= r.lo && b <= r.hi) {
        st = r.next;
        found = true;
        break;
      }
    if (!found) return false;
  }
  return true;
}

}  // namespace

namespace {
std::atomic<uint64_t> g_next_token_index_id{1};
}  // namespace

TokenIndex::TokenIndex(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids)
    : id_(g_next_token_index_id.fetch_add(1, std::memory_order_relaxed)),
      bytes_(std::move(token_bytes)),
      eos_(std::move(eos_ids)),
      is_eos_(bytes_.size(), 0) {
  for (int32_t e : eos_) {
    if (e < 0 || size_t(e) >= bytes_.size()) grammar_fail("grammar: token index: eos id ", e, " out of range");
    is_eos_[size_t(e)] = 1;
  }
  cache_.reserve(kMaskCacheEntries);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < bytes_.size(); ++i)
    if (!is_eos_[i] && !bytes_[i].empty()) {
      if (bytes_[i].size() > 60000) grammar_fail("grammar: token index: token ", i, " is too long");
      ids.push_back(int32_t(i));
    }
  trie_ = build_trie(std::move(ids));
  slices_.push_back(build_slice(json_text_language(true)));
  slices_.push_back(build_slice(json_text_language(false)));
}

TokenSlice TokenIndex::build_slice(std::vector<std::vector<SliceRange>> states) const {
  TokenSlice sl;
  std::vector<int32_t> rest, members;
  for (size_t i = 0; i < bytes_.size(); ++i) {
    if (is_eos_[i] || bytes_[i].empty()) continue;
    if (in_language(states, bytes_[i])) {
      members.push_back(int32_t(i));
      sl.max_len = std::max(sl.max_len, bytes_[i].size());
    } else {
      rest.push_back(int32_t(i));
    }
  }
  auto chars = [&](int32_t t) {
    size_t n = 0;
    for (char c : bytes_[size_t(t)]) n += (uint8_t(c) & 0xC0) != 0x80;
    return n;
  };
  sl.max_len = 0;
  for (int32_t t : members) sl.max_len = std::max(sl.max_len, chars(t));
  std::vector<std::vector<int32_t>> exact(sl.max_len + 1);
  for (int32_t t : members) exact[chars(t)].push_back(t);
  std::vector<uint32_t> cur(mask_words(), 0);
  for (size_t k = 0; k <= sl.max_len; ++k) {
    for (int32_t t : exact[k]) cur[size_t(t) / 32] |= 1u << (t % 32);
    sl.by_len.push_back(cur);
  }
  sl.states = std::move(states);
  sl.short_len = std::min(TokenSlice::kShortLen, sl.max_len);
  std::vector<int32_t> rest_short = rest;
  for (size_t k = sl.short_len + 1; k <= sl.max_len; ++k) rest_short.insert(rest_short.end(), exact[k].begin(), exact[k].end());
  for (uint32_t k : TokenSlice::kLongerThan) {
    if (k >= sl.short_len) break;
    std::vector<int32_t> longer = rest;
    for (size_t j = k + 1; j <= sl.max_len; ++j) longer.insert(longer.end(), exact[j].begin(), exact[j].end());
    sl.rest_longer.emplace_back(k, build_trie(std::move(longer)));
  }
  sl.rest = build_trie(std::move(rest));
  sl.rest_short = build_trie(std::move(rest_short));
  return sl;
}

TokenTrie TokenIndex::build_trie(std::vector<int32_t> order) const {
  TokenTrie t;
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
  });
  auto& nodes = t.nodes;
  nodes.push_back({});
  std::vector<uint32_t> path{0};  // path[d] = node at depth d
  std::string prev;
  auto close_to = [&](size_t depth) {
    while (path.size() > depth + 1) {
      nodes[path.back()].subtree_end = uint32_t(nodes.size());
      path.pop_back();
    }
  };
  for (int32_t id : order) {
    const std::string& s = bytes_[size_t(id)];
    size_t lcp = 0;
    while (lcp < s.size() && lcp < prev.size() && s[lcp] == prev[lcp]) ++lcp;
    lcp = std::min(lcp, path.size() - 1);
    close_to(lcp);
    for (size_t d = lcp; d < s.size(); ++d) {
      TrieNode n;
      n.byte = uint8_t(s[d]);
      n.depth = uint16_t(d + 1);
      n.tok_begin = n.tok_end = uint32_t(t.tokens.size());
      path.push_back(uint32_t(nodes.size()));
      nodes.push_back(n);
    }
    TrieNode& leaf = nodes[path.back()];
    if (leaf.tok_end != t.tokens.size()) leaf.tok_begin = leaf.tok_end = uint32_t(t.tokens.size());
    t.tokens.push_back(id);
    leaf.tok_end = uint32_t(t.tokens.size());
    t.max_depth = std::max(t.max_depth, s.size());
    prev = s;
  }
  close_to(0);
  nodes[0].subtree_end = uint32_t(nodes.size());
  return t;
}

std::shared_ptr<const PositionMask> TokenIndex::cached_mask(const std::string& key) const {
  std::lock_guard lock(cache_mu_);
  auto it = cache_.find(key);
  return it == cache_.end() ? nullptr : it->second;
}

void TokenIndex::cache_mask(const std::string& key, std::shared_ptr<const PositionMask> mask) const {
  std::lock_guard lock(cache_mu_);
  size_t bytes = key.size() + mask->bits.size() * 4 + (mask->accepted.size() + mask->uncertain.size()) * 4;
  auto [it, fresh] = cache_.emplace(key, std::move(mask));
  if (!fresh) return;
  cache_bytes_ += bytes;
  cache_order_.push_back({&it->first, bytes});
  while ((cache_bytes_ > kMaskCacheBytes || cache_.size() > kMaskCacheEntries) && cache_order_.size() > 1) {
    auto [old, old_bytes] = cache_order_.front();
    cache_order_.pop_front();
    cache_bytes_ -= old_bytes;
    cache_.erase(*old);
  }
}

bool TokenIndex::is_eos(int32_t id) const { return id >= 0 && size_t(id) < is_eos_.size() && is_eos_[size_t(id)]; }

}  // namespace exl
