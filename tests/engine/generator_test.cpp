// The generator: continuous batching gives each job exactly its solo tokens, prefix reuse is
// reported, eviction under a tiny page budget never corrupts running jobs, stop conditions and
// cancellation, and stories260K's llama2.c reference texts.
#include "engine/generate/generator.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "engine/generate/grammar_constraint.h"
#include "generation_harness.h"
#include "test_support.h"

namespace exl {
namespace generator_test {

using Result = test::GenerationRecord;
using Fixture = test::CpuModel;

GenerationJob greedy_job(std::vector<int32_t> prompt, int n, Result* r) {
  GenerationJob j;
  j.prompt = std::move(prompt);
  j.sampling.temperature = 0;
  j.max_new_tokens = n;
  j.on_event = test::record_events(r);
  return j;
}

std::vector<int32_t> prompt_ids(int seed, int n) {
  std::vector<int32_t> p{1};
  uint32_t s = uint32_t(seed) * 2654435761u + 7;
  for (int i = 1; i < n; ++i) {
    s ^= s << 13, s ^= s >> 17, s ^= s << 5;
    p.push_back(int32_t(3 + s % 500));
  }
  return p;
}

TEST(Generator, EightConcurrentGreedyJobsMatchTheirSoloRuns) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  Fixture f(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  GeneratorOptions o;
  o.page_size = 16;
  o.num_pages = 64;
  o.max_step_tokens = 40;  // forces prefill chunks to mix with decodes
  std::vector<Result> solo(8), batched(8);
  for (int i = 0; i < 8; ++i) {
    Generator g(*f.model, *f.tok, o);
    g.submit(greedy_job(prompt_ids(i, 5 + 9 * i), 12, &solo[size_t(i)]));
    g.run_until_idle();
  }
  Generator g(*f.model, *f.tok, o);
  for (int i = 0; i < 8; ++i) {
    g.submit(greedy_job(prompt_ids(i, 5 + 9 * i), 12, &batched[size_t(i)]));
    if (i == 3) g.step();  // later jobs join while earlier ones run
  }
  g.run_until_idle();
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(batched[size_t(i)].done);
    EXPECT_EQ(batched[size_t(i)].reason, FinishReason::max_tokens) << batched[size_t(i)].error;
    EXPECT_EQ(batched[size_t(i)].tokens.size(), 12u);
    EXPECT_EQ(batched[size_t(i)].tokens, solo[size_t(i)].tokens) << "job " << i;
  }
}

TEST(Generator, SharedPrefixIsServedFromTheCache) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  Fixture f(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  GeneratorOptions o;
  o.page_size = 16;
  o.num_pages = 32;
  Generator g(*f.model, *f.tok, o);
  auto shared = prompt_ids(1, 64);
  auto a = shared, b = shared;
  for (int i = 0; i < 10; ++i) a.push_back(10 + i), b.push_back(100 + i);
  Result ra, rb, rb_solo;
  g.submit(greedy_job(a, 4, &ra));
  g.run_until_idle();
  g.submit(greedy_job(b, 4, &rb));
  g.run_until_idle();
  EXPECT_EQ(ra.stats.n_cached_tokens, 0);
  EXPECT_GE(rb.stats.n_cached_tokens, 64);
  EXPECT_EQ(rb.stats.n_prompt_tokens, 74);
  Generator fresh(*f.model, *f.tok, o);
  fresh.submit(greedy_job(b, 4, &rb_solo));
  fresh.run_until_idle();
  EXPECT_EQ(rb.tokens, rb_solo.tokens);  // cached K/V give the same tokens
}

TEST(Generator, WarmUpLeavesNoCachedPrefixAndTheSameTokens) {
  // warm_up runs prefills over tokens 0, 1, 2, ... in a scratch sequence: a job starting with
  // those tokens finds nothing cached, every page is free again, and its tokens are a fresh
  // generator's.
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  Fixture f(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  GeneratorOptions o;
  o.page_size = 16;
  o.num_pages = 48;
  o.max_step_tokens = 100;
  Generator g(*f.model, *f.tok, o);
  g.warm_up(70);
  SeqId probe = g.cache().create_sequence();
  EXPECT_TRUE(g.cache().reserve(probe, o.num_pages * o.page_size));  // every page back
  g.cache().release(probe);
  std::vector<int32_t> prompt(40);
  std::iota(prompt.begin(), prompt.end(), 0);
  Result warmed, fresh_r;
  g.submit(greedy_job(prompt, 8, &warmed));
  g.run_until_idle();
  EXPECT_EQ(warmed.stats.n_cached_tokens, 0);
  Generator fresh(*f.model, *f.tok, o);
  fresh.submit(greedy_job(prompt, 8, &fresh_r));
  fresh.run_until_idle();
  ASSERT_EQ(warmed.tokens.size(), 8u);
  EXPECT_EQ(warmed.tokens, fresh_r.tokens);
}

TEST(Generator, EvictionWithATinyBudgetNeverCorruptsRunningJobs) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  Fixture f(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  GeneratorOptions o;
  o.page_size = 8;
  o.num_pages = 12;  // two jobs of 40 tokens need 10 pages: finished jobs' pages get evicted
  o.max_batch_seqs = 2;
  std::vector<Result> solo(6), run(6);
  for (int i = 0; i < 6; ++i) {
    Generator g(*f.model, *f.tok, o);
    g.submit(greedy_job(prompt_ids(i, 30), 10, &solo[size_t(i)]));
    g.run_until_idle();
  }
  Generator g(*f.model, *f.tok, o);
  for (int i = 0; i < 6; ++i) g.submit(greedy_job(prompt_ids(i, 30), 10, &run[size_t(i)]));
  g.run_until_idle();
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(run[size_t(i)].reason, FinishReason::max_tokens) << run[size_t(i)].error;
    EXPECT_EQ(run[size_t(i)].tokens, solo[size_t(i)].tokens) << "job " << i;
  }
  EXPECT_GT(g.cache().stats().n_evictions, 0u);
}

TEST(Generator, OutOfPagesIsAnErrorNotACrash) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  Fixture f(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  GeneratorOptions o;
  o.page_size = 8;
  o.num_pages = 2;
  Generator g(*f.model, *f.tok, o);
  Result r;
  g.submit(greedy_job(prompt_ids(0, 30), 4, &r));
  g.run_until_idle();
  EXPECT_EQ(r.reason, FinishReason::error);
  EXPECT_NE(r.error.find("out of KV cache pages"), std::string::npos) << r.error;
}

TEST(Generator, JobsThatAllWaitForPagesTakeTurnsInsteadOfFailing) {
  // Four jobs that each fit the cache alone but not together while they grow: the youngest gives
  // its pages back and recomputes later; every job still ends with exactly its solo tokens.
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  Fixture f(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  GeneratorOptions o;
  o.page_size = 8;
  o.num_pages = 8;  // 64 tokens: one job of 20 + 24 tokens at a time
  o.max_batch_seqs = 4;
  std::vector<Result> solo(4), run(4);
  for (int i = 0; i < 4; ++i) {
    Generator g(*f.model, *f.tok, o);
    g.submit(greedy_job(prompt_ids(20 + i, 20), 24, &solo[size_t(i)]));
    g.run_until_idle();
    ASSERT_EQ(solo[size_t(i)].reason, FinishReason::max_tokens) << solo[size_t(i)].error;
  }
  Generator g(*f.model, *f.tok, o);
  for (int i = 0; i < 4; ++i) g.submit(greedy_job(prompt_ids(20 + i, 20), 24, &run[size_t(i)]));
  g.run_until_idle();
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(run[size_t(i)].reason, FinishReason::max_tokens) << "job " << i << ": " << run[size_t(i)].error;
    EXPECT_EQ(run[size_t(i)].tokens, solo[size_t(i)].tokens) << "job " << i;
  }
  EXPECT_GT(g.n_preempted(), 0);
}

TEST(Generator, BadJobsGetErrorEvents) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  Fixture f(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  Generator g(*f.model, *f.tok, {});
  Result empty, range, bad_sampler;
  g.submit(greedy_job({}, 4, &empty));
  g.submit(greedy_job({1, 9999}, 4, &range));
  auto j = greedy_job({1, 5}, 4, &bad_sampler);
  j.sampling.top_p = 2;
  g.submit(std::move(j));
  g.run_until_idle();
  EXPECT_NE(empty.error.find("empty prompt"), std::string::npos);
  EXPECT_NE(range.error.find("out of range"), std::string::npos);
  EXPECT_NE(bad_sampler.error.find("top_p"), std::string::npos) << bad_sampler.error;
}

TEST(Generator, CancellationAndStopStrings) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Fixture f(test::shared_dir() / "models/stories260K-hf");
  Generator g(*f.model, *f.tok, {});
  Result full, stopped, cancelled;
  g.submit(greedy_job({1}, 40, &full));
  g.run_until_idle();
  auto j = greedy_job({1}, 40, &stopped);
  j.stop_strings = {"little girl"};
  g.submit(std::move(j));
  g.run_until_idle();
  EXPECT_EQ(stopped.reason, FinishReason::stop_string);
  EXPECT_EQ(stopped.text, full.text.substr(0, full.text.find("little girl")));
  const uint64_t id = g.submit(greedy_job({1}, 40, &cancelled));
  g.step();
  g.step();
  g.cancel(id);
  g.run_until_idle();
  EXPECT_EQ(cancelled.reason, FinishReason::cancelled);
  EXPECT_LT(cancelled.tokens.size(), 40u);
}

TEST(Generator, BackgroundThreadServesConcurrentSubmitters) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Fixture f(test::shared_dir() / "models/stories260K-hf");
  Generator g(*f.model, *f.tok, {});
  g.start();
  std::vector<Result> r(4);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  std::vector<std::thread> th;
  for (int i = 0; i < 4; ++i)
    th.emplace_back([&, i] {
      auto j = greedy_job({1}, 20 + i, &r[size_t(i)]);
      auto inner = j.on_event;
      j.on_event = [&, inner](const GenerationEvent& e) {
        inner(e);
        if (e.type == GenerationEvent::Type::done) {
          std::lock_guard lk(mu);
          ++done;
          cv.notify_all();
        }
      };
      g.submit(std::move(j));
    });
  for (auto& t : th) t.join();
  std::unique_lock lk(mu);
  ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(60), [&] { return done == 4; }));
  lk.unlock();
  g.stop();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r[size_t(i)].tokens.size(), size_t(20 + i));
  EXPECT_EQ(std::vector<int32_t>(r[3].tokens.begin(), r[3].tokens.begin() + 20), r[0].tokens);
}

TEST(Generator, Stories260kReproducesLlama2cTexts) {
  EXL_REQUIRE_SHARED("models/stories260K/reference/reference.json");
  Fixture f(test::shared_dir() / "models/stories260K-hf");
  auto ref = nlohmann::json::parse(test::read_file(test::shared_dir() / "models/stories260K/reference/reference.json"));
  Generator g(*f.model, *f.tok, {});
  Result greedy, seeded;
  g.submit(greedy_job({1}, 200, &greedy));
  auto j = greedy_job({1}, 256, &seeded);
  j.sampling.mode = SamplerMode::llama2c;
  j.sampling.temperature = 1.0f;
  j.sampling.top_p = 0.9f;
  j.sampling.seed = 133742;
  g.submit(std::move(j));
  g.run_until_idle();
  EXPECT_EQ(greedy.text, test::read_file(test::shared_dir() / "models/stories260K/reference/expected_greedy_200.txt"));
  EXPECT_EQ(greedy.tokens, ref["cases"][0]["output_ids"].get<std::vector<int32_t>>());
  EXPECT_EQ(seeded.text, ref["cases"][2]["text"].get<std::string>());
  EXPECT_EQ(seeded.tokens, ref["cases"][2]["output_ids"].get<std::vector<int32_t>>());
}

// log-softmax (in double) of every row of the model's logits for `ids`, computed from scratch.
std::vector<std::vector<double>> reference_logprobs(Model& m, Backend& be, const std::vector<int32_t>& ids) {
  auto pool = be.alloc_kv_pool(m.kv_layout(KvFormat::f32, 16), int(ids.size() + 15) / 16);
  std::vector<int32_t> table;
  for (int i = 0; i < pool->num_pages; ++i) table.push_back(i);
  ForwardSeq s{ids, 0, table, true};
  const std::vector<float> logits = m.forward(std::span<const ForwardSeq>(&s, 1), *pool);
  const size_t V = size_t(m.vocab_size());
  std::vector<std::vector<double>> out;
  for (size_t r = 0; r < ids.size(); ++r) {
    std::span<const float> row(logits.data() + r * V, V);
    double mx = -1e300, sum = 0;
    for (float x : row) mx = std::max(mx, double(x));
    for (float x : row) sum += std::exp(double(x) - mx);
    std::vector<double> lp(V);
    for (size_t t = 0; t < V; ++t) lp[t] = double(row[t]) - mx - std::log(sum);
    out.push_back(std::move(lp));
  }
  return out;
}

TEST(Generator, LogprobsAreTheLogSoftmaxOfTheRawLogits) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  Fixture f(test::shared_dir() / "models/stories260K-hf");
  const std::vector<int32_t> prompt = f.tok->encode("Once upon a time", true);
  struct Run {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> lps;
    int events = 0;
    bool done = false;
  };
  auto job = [&](Run* r, float temperature, std::shared_ptr<LogitsMaskHook> mask) {
    GenerationJob j;
    j.prompt = prompt;
    j.sampling.temperature = temperature;
    j.sampling.seed = 7;
    j.max_new_tokens = 16;
    j.top_logprobs = 3;
    j.mask = std::move(mask);
    j.on_event = [r](const GenerationEvent& e) {
      if (e.type == GenerationEvent::Type::done) {
        r->done = true;
        return;
      }
      ++r->events;
      r->tokens.push_back(e.token);
      if (e.logprobs) r->lps.push_back(*e.logprobs);
    };
    return j;
  };
  Generator g(*f.model, *f.tok, {});
  Run greedy, sampled, masked;
  GenerationJob biased = job(&greedy, 0, nullptr);
  biased.sampling.logit_bias[5] = 50;  // the values stay the model's: bias is not in them
  g.submit(std::move(biased));
  g.submit(job(&sampled, 1, nullptr));
  // A grammar with long forced stretches: with logprobs its forced tokens are sampled too.
  auto grammar = compile_regex_for(" there was a little girl[a-z ]{1,12}", *f.tok);
  g.submit(job(&masked, 1, make_grammar_constraint(std::move(grammar), *f.tok)));
  g.run_until_idle();
  for (Run* r : {&greedy, &sampled, &masked}) {
    ASSERT_TRUE(r->done);
    ASSERT_FALSE(r->tokens.empty());
    ASSERT_EQ(r->lps.size(), r->tokens.size()) << "every token event carries its logprobs";
    std::vector<int32_t> ids = prompt;
    ids.insert(ids.end(), r->tokens.begin(), r->tokens.end());
    const auto ref = reference_logprobs(*f.model, *f.be, ids);
    for (size_t i = 0; i < r->tokens.size(); ++i) {
      const auto& row = ref[prompt.size() - 1 + i];
      EXPECT_NEAR(r->lps[i].logprob, row[size_t(r->tokens[i])], 1e-4) << "token " << i;
      ASSERT_EQ(r->lps[i].top.size(), 3u);
      std::vector<size_t> order(row.size());
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + 3, order.end(),
                        [&](size_t a, size_t b) { return row[a] > row[b]; });
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(r->lps[i].top[k].first, int32_t(order[k])) << "token " << i << " rank " << k;
        EXPECT_NEAR(r->lps[i].top[k].second, row[order[k]], 1e-4);
      }
    }
  }
  EXPECT_EQ(greedy.tokens.front(), 5) << "greedy follows the biased logits";
  EXPECT_LT(greedy.lps.front().logprob, greedy.lps.front().top[0].second + 1e-6);
}

}  // namespace generator_test
}  // namespace exl
