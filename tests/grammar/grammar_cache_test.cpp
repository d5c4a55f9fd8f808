// The compiled-grammar cache (grammar/grammar_cache.h): hits, keys that must not meet, the entry
// and byte bounds (LRU), failures that must not be cached, and concurrent use.
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "grammar/grammar_budget.h"
#include "grammar/grammar_cache.h"
#include "grammar/regex.h"

namespace exl {
namespace grammar_cache_test {

std::shared_ptr<const TokenIndex> small_index() {
  return std::make_shared<const TokenIndex>(std::vector<std::string>{"a", "b", "ab", "", "c"}, std::vector<int32_t>{3});
}

// A compile function that counts its calls.
struct Counted {
  std::shared_ptr<const TokenIndex> index;
  std::string pattern;
  std::atomic<int>* calls;
  std::shared_ptr<const CompiledGrammar> operator()() const {
    ++*calls;
    return std::make_shared<const CompiledGrammar>(compile_regex_grammar(pattern), index);
  }
};

TEST(GrammarCache, SecondGetIsAHitAndReturnsTheSameGrammar) {
  GrammarCache cache;
  auto idx = small_index();
  std::atomic<int> calls = 0;
  const GrammarCacheKey key{idx->id(), "a+b", ""};
  auto g1 = cache.get(key, Counted{idx, "a+b", &calls});
  auto g2 = cache.get(key, Counted{idx, "a+b", &calls});
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(g1.get(), g2.get());
  EXPECT_EQ(cache.stats().hits, 1u);
  EXPECT_EQ(cache.stats().misses, 1u);
  EXPECT_EQ(cache.stats().entries, 1u);
}

TEST(GrammarCache, KeysDifferingInVocabularySourceOrOptionsDoNotMeet) {
  GrammarCache cache;
  auto idx1 = small_index(), idx2 = small_index();  // equal contents, distinct indexes
  ASSERT_NE(idx1->id(), idx2->id());
  std::atomic<int> calls = 0;
  auto a = cache.get({idx1->id(), "a+", ""}, Counted{idx1, "a+", &calls});
  auto b = cache.get({idx2->id(), "a+", ""}, Counted{idx2, "a+", &calls});
  auto c = cache.get({idx1->id(), "b+", ""}, Counted{idx1, "b+", &calls});
  auto d = cache.get({idx1->id(), "a+", "spaced"}, Counted{idx1, "a+", &calls});
  EXPECT_EQ(calls, 4);
  EXPECT_EQ(a->index(), idx1.get());
  EXPECT_EQ(b->index(), idx2.get());
  EXPECT_NE(a.get(), c.get());
  EXPECT_NE(a.get(), d.get());
  EXPECT_EQ(cache.stats().entries, 4u);
}

TEST(GrammarCache, TokenIndexIdsAreNeverReusedAfterFree) {
  uint64_t first = small_index()->id();  // freed at once
  auto second = small_index();           // may well live at the same address
  EXPECT_NE(first, second->id());
}

TEST(GrammarCache, EntryBoundEvictsTheLeastRecentlyUsed) {
  GrammarCache cache(GrammarCacheLimits{2, size_t(1) << 30});
  auto idx = small_index();
  std::atomic<int> calls = 0;
  cache.get({idx->id(), "a", ""}, Counted{idx, "a", &calls});
  cache.get({idx->id(), "b", ""}, Counted{idx, "b", &calls});
  cache.get({idx->id(), "a", ""}, Counted{idx, "a", &calls});  // a is now the most recent
  cache.get({idx->id(), "c", ""}, Counted{idx, "c", &calls});  // evicts b
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(cache.stats().entries, 2u);
  cache.get({idx->id(), "a", ""}, Counted{idx, "a", &calls});
  EXPECT_EQ(calls, 3);
  cache.get({idx->id(), "b", ""}, Counted{idx, "b", &calls});
  EXPECT_EQ(calls, 4);
}

TEST(GrammarCache, ByteBoundEvictsAndAGrammarLargerThanTheBoundIsNotKept) {
  auto idx = small_index();
  const size_t one = std::make_shared<const CompiledGrammar>(compile_regex_grammar("a"), idx)->memory_bytes();
  ASSERT_GT(one, 0u);
  // Room for about two small grammars with their keys, not three.
  GrammarCache cache(GrammarCacheLimits{100, 2 * one + 600});
  std::atomic<int> calls = 0;
  cache.get({idx->id(), "a", ""}, Counted{idx, "a", &calls});
  cache.get({idx->id(), "b", ""}, Counted{idx, "b", &calls});
  cache.get({idx->id(), "c", ""}, Counted{idx, "c", &calls});
  EXPECT_LE(cache.stats().entries, 2u);
  EXPECT_LE(cache.stats().bytes, 2 * one + 600);
  cache.get({idx->id(), "c", ""}, Counted{idx, "c", &calls});  // the newest was kept
  EXPECT_EQ(calls, 3);

  GrammarCache tiny(GrammarCacheLimits{100, 16});
  auto g = tiny.get({idx->id(), "a", ""}, Counted{idx, "a", &calls});
  EXPECT_NE(g, nullptr);
  EXPECT_EQ(tiny.stats().entries, 0u);
}

TEST(GrammarCache, MemoryBytesGrowAsMatchersFillTheCaches) {
  auto idx = small_index();
  auto g = std::make_shared<const CompiledGrammar>(compile_regex_grammar("(a|b)+c"), idx);
  const size_t before = g->memory_bytes();
  Matcher m(g);
  std::vector<uint32_t> mask(idx->mask_words());
  m.fill_mask(mask);
  EXPECT_GT(g->memory_bytes(), before);
}

TEST(GrammarCache, BudgetFailuresAndCancellationsAreNotCached) {
  GrammarCache cache;
  auto idx = small_index();
  int calls = 0;
  const GrammarCacheKey key{idx->id(), "x", ""};
  auto over_budget = [&]() -> std::shared_ptr<const CompiledGrammar> {
    ++calls;
    throw GrammarBudgetError("grammar: budget: test");
  };
  auto cancelled = [&]() -> std::shared_ptr<const CompiledGrammar> {
    ++calls;
    throw GrammarCancelled("grammar: compilation cancelled");
  };
  EXPECT_THROW(cache.get(key, over_budget), GrammarBudgetError);
  EXPECT_THROW(cache.get(key, cancelled), GrammarCancelled);
  EXPECT_EQ(cache.stats().entries, 0u);
  std::atomic<int> ok_calls = 0;
  auto g = cache.get(key, Counted{idx, "x", &ok_calls});
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(ok_calls, 1);
  EXPECT_NE(g, nullptr);
}

TEST(GrammarCache, PlainGrammarErrorUnderATrippedBudgetIsNotCached) {
  GrammarCache cache;
  auto idx = small_index();
  const GrammarCacheKey key{idx->id(), "y", ""};
  GrammarBudget b;
  b.max_states = 1;
  GrammarBudgetScope scope(b);
  // A compile that hits the budget and re-throws it as a plain GrammarError.
  auto swallowing = [&]() -> std::shared_ptr<const CompiledGrammar> {
    try {
      grammar_charge(100, 0);
    } catch (const GrammarError&) {
    }
    throw GrammarError("grammar: something else");
  };
  EXPECT_THROW(cache.get(key, swallowing), GrammarBudgetError);
  EXPECT_EQ(cache.stats().entries, 0u);
}

TEST(GrammarCache, DeterministicErrorsAreCachedAsErrors) {
  GrammarCache cache;
  auto idx = small_index();
  int calls = 0;
  const GrammarCacheKey key{idx->id(), "(", ""};
  auto bad = [&]() -> std::shared_ptr<const CompiledGrammar> {
    ++calls;
    return std::make_shared<const CompiledGrammar>(compile_regex_grammar("("), idx);
  };
  std::string first, second;
  try {
    cache.get(key, bad);
  } catch (const GrammarError& e) {
    first = e.what();
  }
  try {
    cache.get(key, bad);
  } catch (const GrammarError& e) {
    second = e.what();
  }
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(first.empty());
  EXPECT_EQ(first, second);
}

TEST(GrammarCache, OtherExceptionsAreNotCached) {
  GrammarCache cache;
  auto idx = small_index();
  int calls = 0;
  auto throws = [&]() -> std::shared_ptr<const CompiledGrammar> {
    ++calls;
    throw std::runtime_error("engine: something transient");
  };
  EXPECT_THROW(cache.get({idx->id(), "z", ""}, throws), std::runtime_error);
  EXPECT_THROW(cache.get({idx->id(), "z", ""}, throws), std::runtime_error);
  EXPECT_EQ(calls, 2);
}

TEST(GrammarCache, ConcurrentGetsOfOneKeyAllReturnTheKeptGrammar) {
  GrammarCache cache(GrammarCacheLimits{4, size_t(1) << 30});
  auto idx = small_index();
  std::atomic<int> calls = 0;
  constexpr int kThreads = 8, kRounds = 200;
  std::vector<std::vector<const CompiledGrammar*>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        seen[size_t(t)].push_back(cache.get({idx->id(), "a+b", ""}, Counted{idx, "a+b", &calls}).get());
        const std::string p = std::string(1, char('a' + (t + i) % 3));
        cache.get({idx->id(), p, ""}, Counted{idx, p, &calls});
      }
    });
  for (auto& th : threads) th.join();
  const CompiledGrammar* kept = cache.get({idx->id(), "a+b", ""}, Counted{idx, "a+b", &calls}).get();
  EXPECT_LE(cache.stats().entries, 4u);
  size_t same = 0;
  for (const auto& v : seen)
    for (const CompiledGrammar* g : v) same += g == kept;
  // Four keys fit, so nothing is evicted: a racing miss finds the first insertion and returns it.
  EXPECT_EQ(same, size_t(kThreads) * kRounds);
}

}  // namespace grammar_cache_test
}  // namespace exl
