#include "engine/generate/page_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "engine/generate/rng.h"
#include "kernels/error.h"

namespace exl {

namespace {

constexpr uint64_t k_golden = 0x9e3779b97f4a7c15ull;

uint64_t chain_step(uint64_t h, uint64_t v) { return mix64(h + k_golden + v); }

uint64_t chain_key(uint64_t parent, std::span<const int32_t> toks) {
  uint64_t h = chain_step(parent, 0);
  for (int32_t t : toks) h = chain_step(h, uint32_t(t));
  return h;
}

}  // namespace

PageCache::PageCache(const CacheConfig& cfg) : cfg_(cfg) {
  const char* p = "engine: page_cache: ";
  EXL_CHECK(cfg.n_layers > 0 && cfg.n_kv_heads > 0 && cfg.head_dim > 0, p,
            "n_layers, n_kv_heads and head_dim must be positive, got ", cfg.n_layers, ", ",
            cfg.n_kv_heads, ", ", cfg.head_dim);
  EXL_CHECK(cfg.page_size > 0, p, "page_size must be positive, got ", cfg.page_size);
  EXL_CHECK(cfg.n_pages > 0, p, "n_pages must be positive, got ", cfg.n_pages);
  EXL_CHECK(int64_t(cfg.n_pages) * cfg.page_size <= std::numeric_limits<int32_t>::max(), p,
            cfg.n_pages, " pages of ", cfg.page_size, " tokens exceed 2^31 tokens");
  uint64_t h = chain_step(cfg.model_hash, 0);
  for (int v : {int(cfg.format), cfg.page_size, cfg.n_layers, cfg.n_kv_heads, cfg.head_dim})
    h = chain_step(h, uint64_t(v));
  seed_key_ = h;
  pages_.resize(size_t(cfg.n_pages));
  page_tokens_.assign(size_t(cfg.n_pages) * size_t(cfg.page_size), 0);
  for (PageId i = cfg.n_pages - 1; i >= 0; --i) free_.push_back(i);
}

SeqId PageCache::create_sequence() {
  const SeqId id = next_seq_++;
  seqs_.emplace(id, Sequence{});
  return id;
}

PageCache::Sequence& PageCache::seq_ref(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("engine: page_cache: unknown sequence ", seq);
  return it->second;
}

const PageCache::Sequence& PageCache::seq_ref(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) fail("engine: page_cache: unknown sequence ", seq);
  return it->second;
}

uint64_t PageCache::parent_key(const Sequence& s, size_t page_index) const {
  return page_index == 0 ? seed_key_ : s.keys[page_index - 1];
}

PageId PageCache::find_keyed(uint64_t key, uint64_t parent, std::span<const int32_t> toks) const {
  auto it = prefix_.find(key);
  if (it == prefix_.end()) return -1;
  const PageId p = it->second;
  if (pages_[size_t(p)].parent_key != parent) return -1;
  const int32_t* stored = page_tokens_.data() + size_t(p) * size_t(cfg_.page_size);
  if (!std::equal(toks.begin(), toks.end(), stored)) return -1;
  return p;
}

PageId PageCache::take_page() {
  PageId p;
  if (!free_.empty()) {
    p = free_.back();
    free_.pop_back();
  } else {
    EXL_DCHECK(!lru_.empty());
    p = lru_.begin()->second;
    lru_.erase(lru_.begin());
    clear_key(p);
    ++counters_.n_evictions;
  }
  pages_[size_t(p)].ref_count = 1;
  return p;
}

void PageCache::add_ref(PageId p) {
  Page& pg = pages_[size_t(p)];
  if (pg.ref_count == 0) {
    EXL_DCHECK(pg.keyed);
    lru_.erase({pg.released_at, p});
  }
  ++pg.ref_count;
}

void PageCache::drop_ref(PageId p) {
  Page& pg = pages_[size_t(p)];
  EXL_DCHECK(pg.ref_count > 0);
  if (--pg.ref_count > 0) return;
  if (pg.keyed) {
    pg.released_at = ++clock_;
    lru_.insert({pg.released_at, p});
  } else {
    free_.push_back(p);
  }
}

void PageCache::set_key(PageId p, uint64_t key, uint64_t parent, std::span<const int32_t> toks) {
  Page& pg = pages_[size_t(p)];
  pg.keyed = true;
  pg.key = key;
  pg.parent_key = parent;
  std::copy(toks.begin(), toks.end(), page_tokens_.begin() + std::ptrdiff_t(size_t(p) * size_t(cfg_.page_size)));
  prefix_[key] = p;
}

void PageCache::clear_key(PageId p) {
  Page& pg = pages_[size_t(p)];
  if (!pg.keyed) return;
  auto it = prefix_.find(pg.key);
  if (it != prefix_.end() && it->second == p) prefix_.erase(it);
  pg.keyed = false;
}

int PageCache::match_prefix(SeqId seq, std::span<const int32_t> prompt) {
  Sequence& s = seq_ref(seq);
  EXL_CHECK(s.pages.empty() && s.tokens.empty(), "engine: page_cache: match_prefix needs an empty sequence; sequence ",
            seq, " holds ", s.tokens.size(), " tokens in ", s.pages.size(), " pages");
  const size_t ps = size_t(cfg_.page_size);
  const size_t n_full = prompt.empty() ? 0 : (prompt.size() - 1) / ps;
  uint64_t parent = seed_key_;
  for (size_t i = 0; i < n_full; ++i) {
    const auto toks = prompt.subspan(i * ps, ps);
    const uint64_t key = chain_key(parent, toks);
    ++counters_.n_pages_looked_up;
    const PageId p = find_keyed(key, parent, toks);
    if (p < 0) break;
    add_ref(p);
    s.pages.push_back(p);
    s.tokens.insert(s.tokens.end(), toks.begin(), toks.end());
    s.keys.push_back(key);
    parent = key;
    ++counters_.n_pages_hit;
  }
  counters_.n_tokens_hit += s.tokens.size();
  return int(s.tokens.size());
}

bool PageCache::reserve(SeqId seq, int n_tokens_total) {
  Sequence& s = seq_ref(seq);
  EXL_CHECK(n_tokens_total >= 0, "engine: page_cache: sequence ", seq, ": cannot reserve ",
            n_tokens_total, " tokens");
  const size_t want = (size_t(n_tokens_total) + size_t(cfg_.page_size) - 1) / size_t(cfg_.page_size);
  if (want <= s.pages.size()) return true;
  if (want - s.pages.size() > n_available()) return false;
  while (s.pages.size() < want) s.pages.push_back(take_page());
  return true;
}

void PageCache::append_tokens(SeqId seq, std::span<const int32_t> tokens) {
  Sequence& s = seq_ref(seq);
  const size_t cap = s.pages.size() * size_t(cfg_.page_size);
  EXL_CHECK(s.tokens.size() + tokens.size() <= cap, "engine: page_cache: sequence ", seq,
            ": appending ", tokens.size(), " tokens to ", s.tokens.size(),
            " exceeds the reserved capacity of ", cap);
  s.tokens.insert(s.tokens.end(), tokens.begin(), tokens.end());
  while (s.keys.size() < s.tokens.size() / size_t(cfg_.page_size)) key_full_page(s, s.keys.size());
}

void PageCache::key_full_page(Sequence& s, size_t page_index) {
  const size_t ps = size_t(cfg_.page_size);
  const uint64_t parent = parent_key(s, page_index);
  const auto toks = std::span<const int32_t>(s.tokens).subspan(page_index * ps, ps);
  const uint64_t key = chain_key(parent, toks);
  s.keys.push_back(key);
  const PageId p = s.pages[page_index];
  EXL_DCHECK(pages_[size_t(p)].ref_count == 1 && !pages_[size_t(p)].keyed);
  auto it = prefix_.find(key);
  if (it != prefix_.end()) {
    const PageId q = it->second;
    // A duplicate in use elsewhere keeps the key; this page stays private.
    if (pages_[size_t(q)].ref_count > 0) return;
    lru_.erase({pages_[size_t(q)].released_at, q});
    clear_key(q);
    free_.push_back(q);
  }
  set_key(p, key, parent, toks);
}

bool PageCache::truncate(SeqId seq, int n_tokens) {
  Sequence& s = seq_ref(seq);
  EXL_CHECK(n_tokens >= 0 && size_t(n_tokens) <= s.tokens.size(), "engine: page_cache: sequence ",
            seq, ": cannot truncate to ", n_tokens, " tokens, it holds ", s.tokens.size());
  const size_t ps = size_t(cfg_.page_size);
  const size_t first = size_t(n_tokens) / ps;  // the first page with stale rows
  size_t n_shared = 0;
  for (size_t i = first; i < s.pages.size(); ++i)
    if (pages_[size_t(s.pages[i])].ref_count > 1) ++n_shared;
  if (n_shared > n_available()) return false;
  for (size_t i = first; i < s.pages.size(); ++i) {
    const PageId p = s.pages[i];
    if (pages_[size_t(p)].ref_count > 1) {
      const PageId q = take_page();
      const int keep_rows = i == first ? n_tokens % cfg_.page_size : 0;
      if (keep_rows > 0 && copy_hook_) copy_hook_(p, q, keep_rows);
      s.pages[i] = q;
      drop_ref(p);
    } else {
      clear_key(p);
    }
  }
  s.tokens.resize(size_t(n_tokens));
  s.keys.resize(first);
  return true;
}

SeqId PageCache::fork(SeqId seq) {
  const Sequence& src = seq_ref(seq);
  const size_t full = src.keys.size();
  Sequence s;
  s.pages.assign(src.pages.begin(), src.pages.begin() + std::ptrdiff_t(full));
  s.tokens.assign(src.tokens.begin(), src.tokens.begin() + std::ptrdiff_t(full * size_t(cfg_.page_size)));
  s.keys = src.keys;
  for (PageId p : s.pages) add_ref(p);
  const SeqId id = next_seq_++;
  seqs_.emplace(id, std::move(s));
  return id;
}

void PageCache::release(SeqId seq) {
  Sequence& s = seq_ref(seq);
  for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) drop_ref(*it);
  seqs_.erase(seq);
}

std::span<const PageId> PageCache::page_table(SeqId seq) const { return seq_ref(seq).pages; }

std::span<const int32_t> PageCache::tokens(SeqId seq) const { return seq_ref(seq).tokens; }

CacheStats PageCache::stats() const {
  CacheStats st = counters_;
  st.n_pages_total = cfg_.n_pages;
  st.n_pages_free = int(free_.size());
  st.n_pages_cached = int(lru_.size());
  st.n_pages_in_use = st.n_pages_total - st.n_pages_free - st.n_pages_cached;
  st.n_sequences = int(seqs_.size());
  return st;
}

}  // namespace exl
