#include "engine/generate/page_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/error.h"

namespace exl {
namespace page_cache_test {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

CacheConfig small_config(int n_pages, KvFormat format = KvFormat::fp16) {
  return {.n_layers = 2, .n_kv_heads = 2, .head_dim = 8, .page_size = 4, .n_pages = n_pages,
          .format = format, .model_hash = 0x1234};
}

std::vector<int32_t> seq_of(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<int32_t> run(int32_t first, int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), first);
  return v;
}

// A PageCache with host K/V storage behind it, written and read through the CPU kernels, the way
// the generator drives a backend's KvPool.
class TestCache : public PageCache {
 public:
  explicit TestCache(const CacheConfig& cfg)
      : PageCache(cfg),
        layout_{cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.page_size, cfg.format},
        pool_(layout_.page_bytes() * size_t(cfg.n_pages)) {
    set_copy_hook([this](PageId from, PageId to, int n) { cpu::kv_copy_rows(layout_, pool_.data(), from, to, n); });
  }
  void write_kv(SeqId s, int layer, int pos, const float* k, const float* v) {
    const int ps = config().page_size;
    const int32_t slot = page_table(s)[size_t(pos / ps)] * ps + pos % ps;
    cpu::kv_write(layout_, pool_.data(), layer, k, v, std::span<const int32_t>(&slot, 1));
  }
  void read_kv(SeqId s, int layer, int head, int n, float* k, float* v) const {
    cpu::kv_read(layout_, pool_.data(), layer, 0, head, page_table(s), n, k);
    cpu::kv_read(layout_, pool_.data(), layer, 1, head, page_table(s), n, v);
  }

 private:
  KvLayout layout_;
  std::vector<std::byte> pool_;
};

// A non-zero value identifying (token, position, layer, K|V, head, element); exact in fp16.
float kv_value(int32_t token, int pos, int layer, int kv, int head, int e) {
  const int h = (token * 31 + pos * 17 + layer * 7 + kv * 3 + head * 5 + e) % 97;
  return float(h + 1) / 64.0f * ((e & 1) ? -1.0f : 1.0f);
}

// Writes K/V for tokens at positions n_tokens(seq).. and appends them (reserving as needed).
void compute(TestCache& c, SeqId s, std::span<const int32_t> toks) {
  const int start = c.n_tokens(s);
  ASSERT_TRUE(c.reserve(s, start + int(toks.size())));
  const auto& cfg = c.config();
  std::vector<float> k(size_t(cfg.n_kv_heads * cfg.head_dim)), v(k.size());
  for (size_t i = 0; i < toks.size(); ++i) {
    const int pos = start + int(i);
    for (int layer = 0; layer < cfg.n_layers; ++layer) {
      for (int head = 0; head < cfg.n_kv_heads; ++head)
        for (int e = 0; e < cfg.head_dim; ++e) {
          k[size_t(head * cfg.head_dim + e)] = kv_value(toks[i], pos, layer, 0, head, e);
          v[size_t(head * cfg.head_dim + e)] = kv_value(toks[i], pos, layer, 1, head, e);
        }
      c.write_kv(s, layer, pos, k.data(), v.data());
    }
  }
  c.append_tokens(s, toks);
}

// Checks that positions [0, n) of seq hold the K/V that compute() wrote for `toks`.
void expect_kv(const TestCache& c, SeqId s, const std::vector<int32_t>& toks, int n) {
  const auto& cfg = c.config();
  std::vector<float> k(size_t(n * cfg.head_dim)), v(k.size());
  for (int layer = 0; layer < cfg.n_layers; ++layer)
    for (int head = 0; head < cfg.n_kv_heads; ++head) {
      c.read_kv(s, layer, head, n, k.data(), v.data());
      for (int pos = 0; pos < n; ++pos)
        for (int e = 0; e < cfg.head_dim; ++e) {
          const size_t i = size_t(pos * cfg.head_dim + e);
          ASSERT_EQ(k[i], kv_value(toks[size_t(pos)], pos, layer, 0, head, e)) << pos;
          ASSERT_EQ(v[i], kv_value(toks[size_t(pos)], pos, layer, 1, head, e)) << pos;
        }
    }
}

void expect_consistent(const PageCache& c) {
  const CacheStats st = c.stats();
  EXPECT_EQ(st.n_pages_free + st.n_pages_cached + st.n_pages_in_use, st.n_pages_total);
  EXPECT_GE(st.n_pages_in_use, 0);
}

TEST(PageCache, SequencesSharingTwoAndAHalfPagesReuseExactlyTwo) {
  TestCache c(small_config(16));
  const auto shared = run(100, 10);  // 2.5 pages of 4
  const auto a_prompt = seq_of({shared, {1, 2, 3}});
  const auto b_prompt = seq_of({shared, {7, 8, 9, 10, 11}});
  const SeqId a = c.create_sequence();
  EXPECT_EQ(c.match_prefix(a, a_prompt), 0);
  compute(c, a, a_prompt);
  const SeqId b = c.create_sequence();
  EXPECT_EQ(c.match_prefix(b, b_prompt), 8);
  EXPECT_THAT(c.tokens(b), ElementsAre(100, 101, 102, 103, 104, 105, 106, 107));
  ASSERT_EQ(c.page_table(b).size(), 2u);
  EXPECT_EQ(c.page_table(b)[0], c.page_table(a)[0]);
  EXPECT_EQ(c.page_table(b)[1], c.page_table(a)[1]);
  expect_kv(c, b, a_prompt, 8);
  const CacheStats st = c.stats();
  // a: page 0 missed (empty cache); b: pages 0, 1 hit, page 2 (tokens 8-11) differs.
  EXPECT_EQ(st.n_pages_looked_up, 4u);
  EXPECT_EQ(st.n_pages_hit, 2u);
  EXPECT_EQ(st.n_tokens_hit, 8u);
  compute(c, b, std::span(b_prompt).subspan(8));
  expect_kv(c, b, b_prompt, int(b_prompt.size()));
  expect_kv(c, a, a_prompt, int(a_prompt.size()));  // b's writes did not touch a's pages
  expect_consistent(c);
}

TEST(PageCache, TheLastPromptTokenIsNeverServedFromCache) {
  TestCache c(small_config(16));
  const auto prompt = run(1, 9);
  const SeqId a = c.create_sequence();
  compute(c, a, prompt);
  const SeqId b = c.create_sequence();
  EXPECT_EQ(c.match_prefix(b, run(1, 8)), 4);  // 8 tokens: page 1 would hold the last one
  const SeqId d = c.create_sequence();
  EXPECT_EQ(c.match_prefix(d, run(1, 9)), 8);
  const SeqId e = c.create_sequence();
  EXPECT_EQ(c.match_prefix(e, {}), 0);
}

TEST(PageCache, ChainedKeysDoNotMatchTheSamePageAfterAnotherPrefix) {
  TestCache c(small_config(16));
  const std::vector<int32_t> pa = {1, 2, 3, 4}, pb = {5, 6, 7, 8}, pc = {9, 10, 11, 12},
                             pd = {13, 14, 15, 16};
  const SeqId a = c.create_sequence();
  compute(c, a, seq_of({pa, pb, {0}}));
  const SeqId x = c.create_sequence();
  compute(c, x, seq_of({pc, pd, {0}}));
  // Page 0 = pc matches x; page 1 = pb has a's tokens but a different parent.
  const SeqId b = c.create_sequence();
  EXPECT_EQ(c.match_prefix(b, seq_of({pc, pb, {0}})), 4);
  EXPECT_EQ(c.page_table(b)[0], c.page_table(x)[0]);
  // And a page never matches at another depth.
  const SeqId d = c.create_sequence();
  EXPECT_EQ(c.match_prefix(d, seq_of({pb, {0}})), 0);
}

TEST(PageCache, EvictionTakesFreePagesFirstThenLeastRecentlyReleasedDeepestFirst) {
  TestCache c(small_config(4));
  const auto a_prompt = seq_of({run(10, 8), {1}});
  const auto b_prompt = seq_of({run(20, 8), {2}});
  const SeqId a = c.create_sequence();
  compute(c, a, a_prompt);  // pages: a0, a1 (keyed), partial
  c.release(a);             // partial -> free; a1 then a0 cached (a1 older)
  CacheStats st = c.stats();
  EXPECT_EQ(st.n_pages_free, 2);
  EXPECT_EQ(st.n_pages_cached, 2);
  EXPECT_EQ(st.n_pages_in_use, 0);

  const SeqId b = c.create_sequence();
  EXPECT_EQ(c.match_prefix(b, b_prompt), 0);
  compute(c, b, b_prompt);  // 3 pages: the 2 free ones, then evicts a1
  EXPECT_EQ(c.stats().n_evictions, 1u);
  c.release(b);  // cached now: a0, b1, b0 (b1 older than b0)

  const SeqId a2 = c.create_sequence();
  EXPECT_EQ(c.match_prefix(a2, a_prompt), 4);  // a0 survived, a1 was evicted
  ASSERT_TRUE(c.reserve(a2, 9));               // 2 more: the free page, then evicts b1
  EXPECT_EQ(c.stats().n_evictions, 2u);
  const SeqId b2 = c.create_sequence();
  EXPECT_EQ(c.match_prefix(b2, b_prompt), 4);  // b0 kept, b1 gone
  expect_kv(c, b2, b_prompt, 4);
  expect_kv(c, a2, a_prompt, 4);
  expect_consistent(c);
}

TEST(PageCache, ReferencedPagesAreNeverEvictedAllocationFailsInstead) {
  TestCache c(small_config(3));
  const auto prompt = run(1, 12);
  const SeqId a = c.create_sequence();
  compute(c, a, prompt);  // all 3 pages, all full and keyed, all referenced
  const SeqId b = c.create_sequence();
  EXPECT_FALSE(c.reserve(b, 1));
  EXPECT_TRUE(c.page_table(b).empty());
  EXPECT_EQ(c.stats().n_evictions, 0u);
  expect_kv(c, a, prompt, 12);
  c.release(a);
  EXPECT_TRUE(c.reserve(b, 1));  // evicts a's deepest page
  const SeqId d = c.create_sequence();
  EXPECT_EQ(c.match_prefix(d, seq_of({prompt, {0}})), 8);
  expect_kv(c, d, prompt, 8);

  // All or nothing: 1 page left, asking for 2 changes nothing.
  PageCache e(small_config(3));
  const SeqId x = e.create_sequence();
  ASSERT_TRUE(e.reserve(x, 8));
  const SeqId y = e.create_sequence();
  EXPECT_FALSE(e.reserve(y, 8));
  EXPECT_TRUE(e.page_table(y).empty());
  EXPECT_EQ(e.stats().n_pages_free, 1);
  EXPECT_TRUE(e.reserve(y, 4));
  EXPECT_TRUE(e.reserve(y, 3));  // already held
}

TEST(PageCache, ForkPinsFullPagesAcrossARelease) {
  TestCache c(small_config(3));
  const auto prompt = run(40, 9);
  const SeqId a = c.create_sequence();
  compute(c, a, prompt);
  const SeqId pin = c.fork(a);
  EXPECT_EQ(c.n_tokens(pin), 8);
  c.release(a);
  CacheStats st = c.stats();
  EXPECT_EQ(st.n_pages_in_use, 2);  // the pin holds both full pages
  EXPECT_EQ(st.n_pages_free, 1);
  const SeqId other = c.create_sequence();
  EXPECT_FALSE(c.reserve(other, 8));  // cannot evict pinned pages
  const SeqId next_turn = c.create_sequence();
  EXPECT_EQ(c.match_prefix(next_turn, seq_of({prompt, {7, 7}})), 8);
  c.release(pin);
  EXPECT_EQ(c.stats().n_pages_in_use, 2);  // still held by next_turn
  c.release(next_turn);
  EXPECT_EQ(c.stats().n_pages_cached, 2);
}

TEST(PageCache, TruncateUnkeysPrivatePagesAndKeepsCapacity) {
  TestCache c(small_config(8));
  const auto prompt = run(60, 10);
  const SeqId a = c.create_sequence();
  compute(c, a, prompt);
  ASSERT_EQ(c.capacity(a), 12);
  ASSERT_TRUE(c.truncate(a, 6));
  EXPECT_EQ(c.n_tokens(a), 6);
  EXPECT_EQ(c.capacity(a), 12);
  const SeqId b = c.create_sequence();
  EXPECT_EQ(c.match_prefix(b, prompt), 4);  // page 1 no longer holds tokens 4-7
  c.release(b);
  // Regenerate positions 6.. with other tokens; page 1 is keyed again with the new content.
  const auto redo = seq_of({run(60, 6), {1, 2, 3, 4}});
  compute(c, a, std::span(redo).subspan(6));
  expect_kv(c, a, redo, 10);
  const SeqId d = c.create_sequence();
  EXPECT_EQ(c.match_prefix(d, redo), 8);
  EXPECT_THROW((void)c.truncate(a, 11), Error);
}

TEST(PageCache, TruncateCopiesASharedPageOnWrite) {
  TestCache c(small_config(4));
  const auto prompt = run(80, 9);
  const SeqId a = c.create_sequence();
  compute(c, a, prompt);  // 3 pages
  const SeqId f = c.fork(a);
  ASSERT_TRUE(c.truncate(f, 6));  // page 1 is shared: f gets a copy of its first 2 rows
  EXPECT_EQ(c.page_table(f)[0], c.page_table(a)[0]);
  EXPECT_NE(c.page_table(f)[1], c.page_table(a)[1]);
  expect_kv(c, f, prompt, 6);
  compute(c, f, std::vector<int32_t>{5, 5});  // now writable
  expect_kv(c, f, seq_of({run(80, 6), {5, 5}}), 8);
  expect_kv(c, a, prompt, 9);
  const SeqId g = c.create_sequence();
  EXPECT_EQ(c.match_prefix(g, prompt), 8);  // a's page 1 is still cached under its key
  EXPECT_EQ(c.page_table(g)[1], c.page_table(a)[1]);
  // No page left for another copy: truncate fails and changes nothing.
  const SeqId h = c.fork(a);
  EXPECT_EQ(c.stats().n_pages_free + c.stats().n_pages_cached, 0);
  EXPECT_FALSE(c.truncate(h, 5));
  EXPECT_EQ(c.n_tokens(h), 8);
  EXPECT_EQ(c.page_table(h)[1], c.page_table(a)[1]);
  expect_consistent(c);
}

TEST(PageCache, DuplicateFullPagesKeepOneKey) {
  TestCache c(small_config(8));
  const auto prompt = run(5, 5);
  const SeqId a = c.create_sequence(), b = c.create_sequence();
  EXPECT_EQ(c.match_prefix(a, prompt), 0);
  EXPECT_EQ(c.match_prefix(b, prompt), 0);
  compute(c, a, prompt);
  compute(c, b, prompt);  // identical page 0, while a's is in use: b's stays private
  c.release(b);
  EXPECT_EQ(c.stats().n_pages_cached, 0);
  EXPECT_EQ(c.stats().n_pages_free, 6);
  const PageId a0 = c.page_table(a)[0];
  c.release(a);
  EXPECT_EQ(c.stats().n_pages_cached, 1);
  // Recomputed after a's copy went unreferenced: the old copy is freed, the new one is keyed.
  const SeqId d = c.create_sequence();
  compute(c, d, prompt);
  EXPECT_EQ(c.stats().n_pages_cached, 0);
  const SeqId e = c.create_sequence();
  EXPECT_EQ(c.match_prefix(e, prompt), 4);
  EXPECT_EQ(c.page_table(e)[0], c.page_table(d)[0]);
  EXPECT_NE(c.page_table(e)[0], a0);
  expect_consistent(c);
}

TEST(PageCache, StatsCountPagesAndSequences) {
  TestCache c(small_config(6));
  CacheStats st = c.stats();
  EXPECT_EQ(st.n_pages_total, 6);
  EXPECT_EQ(st.n_pages_free, 6);
  const SeqId a = c.create_sequence();
  compute(c, a, run(1, 6));
  ASSERT_TRUE(c.reserve(a, 13));
  st = c.stats();
  EXPECT_EQ(st.n_sequences, 1);
  EXPECT_EQ(st.n_pages_in_use, 4);
  EXPECT_EQ(st.n_pages_free, 2);
  c.release(a);
  st = c.stats();
  EXPECT_EQ(st.n_sequences, 0);
  EXPECT_EQ(st.n_pages_cached, 1);
  EXPECT_EQ(st.n_pages_free, 5);
}

TEST(PageCache, BadInputsThrowNamedErrors) {
  EXPECT_THROW(PageCache(small_config(0)), Error);
  CacheConfig bad = small_config(4);
  bad.head_dim = 0;
  EXPECT_THROW(PageCache{bad}, Error);
  TestCache c(small_config(4));
  EXPECT_THROW(c.page_table(99), Error);
  const SeqId a = c.create_sequence();
  ASSERT_TRUE(c.reserve(a, 5));
  EXPECT_THROW((void)c.reserve(a, -1), Error);
  try {
    c.append_tokens(a, run(0, 9));
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("engine: page_cache: sequence"));
    EXPECT_THAT(e.what(), HasSubstr("capacity of 8"));
  }
  c.append_tokens(a, run(0, 2));
  EXPECT_THROW(c.match_prefix(a, run(0, 9)), Error);
  c.release(a);
  EXPECT_THROW(c.release(a), Error);
}

}  // namespace page_cache_test
}  // namespace exl
