// Paged KV cache with prefix reuse: a fixed pool of pages, a page table per sequence, and a prefix
// map through which a new sequence reuses the pages of an earlier one with the same token prefix.
// Engine thread only (no internal locking).
//
// Pages hold page_size consecutive tokens (default 64) of K and V for every layer and kv head, in
// the format and byte layout of kernels/kv_layout.h. The bytes live in the backend's KvPool; this
// class only decides which page holds what (page ids index the pool). 64 rather than ExLlamaV2's 256: our own
// attention kernels need no 256-token blocks, and smaller pages reuse more of a shared prefix
// (a chat turn shares up to its last 64-token boundary) and waste less in each sequence's tail.
//
// Prefix keys. Only FULL pages are keyed: key = hash(parent key, the page's token ids), where the
// first page's parent is a seed made of model_hash and the cache geometry and format; a key thus
// names the whole prefix up to the end of its page. Lookups also compare the stored tokens and
// parent key, so a 64-bit hash collision cannot attach foreign K/V. A partially filled last page
// is private to its sequence.
//
// Lifetime. ref_count = the number of sequences whose page table holds a page. At 0, a keyed page
// stays in the prefix map ("cached") on an LRU list; an unkeyed one is free. Allocation takes a
// free page, else evicts the least recently released cached page. release() drops a table from its
// last page to its first, so deeper pages age first and shared prefixes outlive their tails.
// Referenced pages are never evicted: when no free or cached page is left, reserve() returns false
// and changes nothing.
//
// Dedup. When a sequence's page fills and its key already names another page: an unreferenced
// duplicate is freed and the new page takes the key; a duplicate in use stays, and the new page
// stays private (unkeyed, freed on release). Page tables never change behind a sequence's back.
//
// Pinning between turns: fork() the sequence (its full pages gain a reference) and release the
// fork when done.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/kv_layout.h"

namespace exl {

using SeqId = uint32_t;
using PageId = int32_t;

struct CacheConfig {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int page_size = 64;
  int n_pages = 0;  // the budget
  KvFormat format = KvFormat::fp16;
  uint64_t model_hash = 0;  // identifies the weights: pages never match across models
};

struct CacheStats {
  int n_pages_total = 0;
  int n_pages_free = 0;    // no reusable content
  int n_pages_cached = 0;  // unreferenced, keyed, evictable
  int n_pages_in_use = 0;  // referenced by at least one sequence
  int n_sequences = 0;
  uint64_t n_pages_looked_up = 0;  // by match_prefix
  uint64_t n_pages_hit = 0;
  uint64_t n_tokens_hit = 0;
  uint64_t n_evictions = 0;
};

class PageCache {
 public:
  // Validates the config and allocates the pool. Throws exl::Error ("engine: page_cache: ...").
  explicit PageCache(const CacheConfig& cfg);

  const CacheConfig& config() const { return cfg_; }

  SeqId create_sequence();
  // Attaches the cached pages of the longest keyed prefix of `prompt` to an empty sequence and
  // records their tokens. Only pages lying wholly in prompt[0, n-1) can match: the last prompt
  // token is always left to compute, so its logits exist. Returns the tokens served from cache.
  int match_prefix(SeqId seq, std::span<const int32_t> prompt);
  // Grows the page table to hold n_tokens_total tokens. All or nothing: false (and no change) when
  // the pool has too few free and cached pages.
  [[nodiscard]] bool reserve(SeqId seq, int n_tokens_total);
  // Records tokens whose K/V have been written (at positions n_tokens(seq) onward); keys pages
  // that become full. Throws past the reserved capacity.
  void append_tokens(SeqId seq, std::span<const int32_t> tokens);
  // Forgets tokens from n_tokens on (rollback). Capacity is kept: pages past the end that other
  // sequences share are swapped for fresh ones, and a shared page holding the new end is copied
  // (copy on write). False (and no change) when those need more pages than are available.
  [[nodiscard]] bool truncate(SeqId seq, int n_tokens);
  // A new sequence sharing seq's full pages (tokens: the full-page prefix). Never allocates.
  SeqId fork(SeqId seq);
  void release(SeqId seq);

  std::span<const PageId> page_table(SeqId seq) const;
  std::span<const int32_t> tokens(SeqId seq) const;
  int n_tokens(SeqId seq) const { return int(tokens(seq).size()); }
  int capacity(SeqId seq) const { return int(page_table(seq).size()) * cfg_.page_size; }

  // Called by truncate() to copy the first n_rows token slots of a shared page into a fresh one
  // (copy on write); the owner of the K/V storage installs it.
  void set_copy_hook(std::function<void(PageId from, PageId to, int n_rows)> hook) { copy_hook_ = std::move(hook); }

  CacheStats stats() const;

 private:
  struct Page {
    int32_t ref_count = 0;
    bool keyed = false;
    uint64_t key = 0, parent_key = 0;
    uint64_t released_at = 0;  // LRU clock while cached
  };
  struct Sequence {
    std::vector<PageId> pages;
    std::vector<int32_t> tokens;
    std::vector<uint64_t> keys;  // chained key of each full page
  };

  Sequence& seq_ref(SeqId seq);
  const Sequence& seq_ref(SeqId seq) const;
  uint64_t parent_key(const Sequence& s, size_t page_index) const;
  PageId find_keyed(uint64_t key, uint64_t parent, std::span<const int32_t> toks) const;
  size_t n_available() const { return free_.size() + lru_.size(); }
  PageId take_page();
  void add_ref(PageId p);
  void drop_ref(PageId p);
  void set_key(PageId p, uint64_t key, uint64_t parent, std::span<const int32_t> toks);
  void clear_key(PageId p);
  void key_full_page(Sequence& s, size_t page_index);

  CacheConfig cfg_;
  uint64_t seed_key_ = 0;
  std::function<void(PageId, PageId, int)> copy_hook_;
  std::vector<Page> pages_;
  std::vector<int32_t> page_tokens_;  // [n_pages][page_size], tokens of keyed pages
  std::vector<PageId> free_;          // stack; pops the lowest id first
  std::set<std::pair<uint64_t, PageId>> lru_;  // cached pages by released_at
  std::unordered_map<uint64_t, PageId> prefix_;
  std::unordered_map<SeqId, Sequence> seqs_;
  SeqId next_seq_ = 1;
  uint64_t clock_ = 0;
  CacheStats counters_;
};

}  // namespace exl
