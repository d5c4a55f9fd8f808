#include "grammar/token_index.h"

#include <algorithm>

#include "grammar/grammar_error.h"

namespace exl {

TokenIndex::TokenIndex(std::vector<std::string> token_bytes, std::vector<int32_t> eos_ids)
    : bytes_(std::move(token_bytes)), eos_(std::move(eos_ids)), is_eos_(bytes_.size(), 0) {
  for (int32_t e : eos_) {
    if (e < 0 || size_t(e) >= bytes_.size()) grammar_fail("grammar: token index: eos id ", e, " out of range");
    is_eos_[size_t(e)] = 1;
  }
  std::vector<int32_t> order;
  for (size_t i = 0; i < bytes_.size(); ++i)
    if (!is_eos_[i] && !bytes_[i].empty()) {
      if (bytes_[i].size() > 60000) grammar_fail("grammar: token index: token ", i, " is too long");
      order.push_back(int32_t(i));
    }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return bytes_[size_t(a)] != bytes_[size_t(b)] ? bytes_[size_t(a)] < bytes_[size_t(b)] : a < b;
  });
  nodes_.push_back({});
  std::vector<uint32_t> path{0};  // path[d] = node at depth d
  std::string prev;
  auto close_to = [&](size_t depth) {
    while (path.size() > depth + 1) {
      nodes_[path.back()].subtree_end = uint32_t(nodes_.size());
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
      n.tok_begin = n.tok_end = uint32_t(trie_tokens_.size());
      path.push_back(uint32_t(nodes_.size()));
      nodes_.push_back(n);
    }
    TrieNode& leaf = nodes_[path.back()];
    if (leaf.tok_end != trie_tokens_.size()) leaf.tok_begin = leaf.tok_end = uint32_t(trie_tokens_.size());
    trie_tokens_.push_back(id);
    leaf.tok_end = uint32_t(trie_tokens_.size());
    prev = s;
  }
  close_to(0);
  nodes_[0].subtree_end = uint32_t(nodes_.size());
}

std::shared_ptr<const PositionMask> TokenIndex::cached_mask(const std::string& key) const {
  std::lock_guard lock(cache_mu_);
  auto it = cache_.find(key);
  return it == cache_.end() ? nullptr : it->second;
}

void TokenIndex::cache_mask(const std::string& key, std::shared_ptr<const PositionMask> mask) const {
  constexpr size_t kMaxCacheBytes = size_t(256) << 20;
  std::lock_guard lock(cache_mu_);
  size_t bytes = key.size() + mask->bits.size() * 4 + (mask->accepted.size() + mask->uncertain.size()) * 4;
  if (cache_bytes_ + bytes > kMaxCacheBytes) cache_.clear(), cache_bytes_ = 0;
  if (cache_.emplace(key, std::move(mask)).second) cache_bytes_ += bytes;
}

bool TokenIndex::is_eos(int32_t id) const { return id >= 0 && size_t(id) < is_eos_.size() && is_eos_[size_t(id)]; }

}  // namespace exl
