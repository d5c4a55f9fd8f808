// The generator's device-sampling path (Generator::step → Model::forward_device/sample_device →
// Backend::sample_rows) on the CPU: a backend that forwards every op to the CPU backend and
// implements sample_rows with the host reference (engine/generate/device_sampling.h) must produce exactly
// the tokens of the plain CPU backend's host sampling, for batched jobs with seeds, penalties,
// biases, grammar masks and forced tokens; a job the device cannot sample (typical_p) sends the
// whole step to the host; GeneratorOptions::device_sampling = false never calls sample_rows.
// With deferred sampling (Backend::sample_rows_deferred, embedding_of_samples) the generator
// pipelines its decode steps (GeneratorOptions::pipelined): the same tokens and finish reasons,
// with stop tokens, a job that arrives mid-run and a cancellation.
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "engine/generate/device_sampling.h"
#include "engine/generate/generator.h"
#include "engine/generate/grammar_constraint.h"
#include "cpu_forwarding_backend.h"
#include "test_support.h"

namespace exl {
namespace generator_device_sampling_test {

// The CPU backend plus sample_rows (counted) and, when `deferring`, deferred sampling: the ids
// are sampled at once and kept for embedding_of_samples and collect_samples.
class SamplingCpuBackend final : public test::CpuForwardingBackend {
 public:
  explicit SamplingCpuBackend(bool deferring = false) : CpuForwardingBackend(2), deferring_(deferring) {}
  int calls = 0, rows_sampled = 0, deferred_calls = 0, fed_steps = 0;
  int64_t max_rows_masked = 0;  // most masked rows in one sample_rows call
  // Layer 0's attention calls of a single sequence with several positions: (end, positions).
  std::vector<std::pair<int64_t, int64_t>> multi_passes;

  std::vector<bool> recording_at_once;  // record_steps_at_once's calls
  int64_t passes_at_once = 0;           // multi-position passes while it was on

  void record_steps_at_once(bool on) override { recording_at_once.push_back(on); }
  void attention(const KvPool& p, int layer, const float* q, float* out, std::span<const SeqAttn> seqs, int nh,
                 float scale, int window) override {
    if (layer == 0 && seqs.size() == 1 && seqs[0].n_tokens > 1) {
      multi_passes.emplace_back(seqs[0].pos_start + seqs[0].n_tokens, seqs[0].n_tokens);
      passes_at_once += !recording_at_once.empty() && recording_at_once.back();
    }
    CpuForwardingBackend::attention(p, layer, q, out, seqs, nh, scale, window);
  }

  std::string name() const override { return "sampling " + cpu().name(); }
  BackendCapabilities capabilities() const override {
    return {.sample_rows = true, .sample_rows_deferred = deferring_};
  }
  bool sample_rows(const float* logits, int64_t vocab, std::span<const RowSampling> rows,
                   std::span<int32_t> out) override {
    if (rows.empty()) return true;
    ++calls;
    max_rows_masked = std::max(max_rows_masked, int64_t(std::count_if(rows.begin(), rows.end(), [](const RowSampling& r) {
                                                   return !r.mask.empty();
                                                 })));
    std::vector<float> row(static_cast<size_t>(vocab));
    for (size_t i = 0; i < rows.size(); ++i) {
      download(row.data(), logits + rows[i].row * vocab, row.size() * 4);
      out[i] = reference_sample_row(row, rows[i]);
      ++rows_sampled;
    }
    return true;
  }
  bool sample_rows_deferred(const float* logits, int64_t vocab, std::span<const RowSampling> rows) override {
    if (!deferring_ || rows.empty()) return deferring_;
    EXL_CHECK(!pending_, "test backend: a deferred sampling is not collected");
    ids_.assign(rows.size(), -1);
    sample_rows(logits, vocab, rows, ids_);
    ++deferred_calls;
    pending_ = true;
    return true;
  }
  void collect_samples(std::span<int32_t> out) override {
    EXL_CHECK(pending_ && out.size() == ids_.size(), "test backend: nothing to collect");
    std::copy(ids_.begin(), ids_.end(), out.begin());
    pending_ = false;
  }
  void embedding_of_samples(const PreparedEmbedding& e, int64_t n, float* out) override {
    EXL_CHECK(n <= int64_t(ids_.size()), "test backend: ", n, " fed tokens, ", ids_.size(), " sampled");
    ++fed_steps;
    cpu().embedding(e, std::span<const int32_t>(ids_).first(size_t(n)), out);
  }

 private:
  bool deferring_ = false, pending_ = false;
  std::vector<int32_t> ids_;
};

// Even tokens only; every fifth generated token is forced to 13.
struct EvenHook : LogitsMaskHook {
  void fill_mask(std::span<uint32_t> mask) override {
    for (uint32_t& w : mask) w = 0x55555555u;
  }
  void accept(int32_t) override {}
  std::vector<int32_t> forced_tokens(std::span<const int32_t> generated) override {
    if (generated.size() % 5 == 4) return {13};
    return {};
  }
};

std::vector<GenerationJob> jobs(bool with_typical) {
  std::vector<GenerationJob> out;
  auto job = [&](auto edit) {
    GenerationJob j;
    j.prompt = {1, 400, 300};
    j.max_new_tokens = 40;
    j.sampling.seed = 99 + out.size();
    edit(j);
    out.push_back(std::move(j));
  };
  job([](GenerationJob& j) { j.sampling.temperature = 0.9f, j.sampling.top_k = 20, j.sampling.top_p = 0.9f; });
  job([](GenerationJob& j) { j.sampling.temperature = 0; });
  job([](GenerationJob& j) {
    j.sampling.repetition_penalty = 1.2f, j.sampling.frequency_penalty = 0.3f, j.sampling.presence_penalty = 0.2f;
    j.sampling.min_p = 0.05f, j.sampling.logit_bias = {{13, 2.0f}, {300, -INFINITY}};
    j.prompt = {1, 300, 300, 13};
  });
  job([](GenerationJob& j) {
    j.sampling.temperature = 1.2f;
    j.mask = std::make_shared<EvenHook>();
  });
  if (with_typical) job([](GenerationJob& j) { j.sampling.typical_p = 0.8f; });
  return out;
}

std::vector<std::vector<int32_t>> generate(Backend& be, bool with_typical, bool device_sampling = true) {
  ModelDir dir(test::shared_dir() / "models/stories260K-hf");
  auto tok = load_tokenizer(dir.path());
  Model m(dir, be);
  GeneratorOptions o;
  o.device_sampling = device_sampling;
  Generator g(m, *tok, o);
  auto js = jobs(with_typical);
  std::vector<std::vector<int32_t>> tokens(js.size());
  for (size_t i = 0; i < js.size(); ++i) {
    js[i].on_event = [&tokens, i](const GenerationEvent& e) {
      if (e.type == GenerationEvent::Type::token) tokens[i].push_back(e.token);
      else EXPECT_NE(e.reason, FinishReason::error) << e.error;
    };
    g.submit(std::move(js[i]));
  }
  g.run_until_idle();
  return tokens;
}

TEST(GeneratorDeviceSampling, SameTokensAsHostSamplingInABatch) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  auto cpu = make_cpu_backend(2);
  const auto want = generate(*cpu, false);
  SamplingCpuBackend dev;
  const auto got = generate(dev, false);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "job " << i;
    EXPECT_EQ(want[i].size(), 40u) << "job " << i;
  }
  EXPECT_GT(dev.calls, 0);
  EXPECT_GE(dev.rows_sampled, 3 * 40);
  EXPECT_NE(want[0], want[2]);
  for (size_t k = 0; k < want[3].size(); ++k)
    EXPECT_TRUE(want[3][k] % 2 == 0 || (k % 5 == 4 && want[3][k] == 13)) << "masked job token " << k;
}

// Speculating jobs: greedy ones verify their drafts on the device (each row of a pass under the
// grammar's mask of its position, one sample_rows call per pass), a job with history penalties
// on the host; all keep the tokens of plain host decoding without speculation, alone or batched.
std::vector<std::vector<int32_t>> speculating(Backend& be, bool batched, Speculation sp, std::vector<GenerationStats>* stats) {
  ModelDir dir(test::shared_dir() / "models/stories260K-hf");
  auto tok = load_tokenizer(dir.path());
  Model m(dir, be);
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She loved to play in the park. "
      "One day, Lily went to the park with her mom. Once upon a time, there was a little";
  const char* pattern = "( there was a (little|big) (girl|boy|dog) named [A-Z][a-z]{2,8}\\.){3}";
  std::vector<GenerationJob> js(3);
  for (size_t i = 0; i < js.size(); ++i) {
    js[i].prompt = tok->encode(story, true);
    js[i].sampling.temperature = 0;
    js[i].max_new_tokens = 90;
    js[i].speculate = sp;
  }
  js[0].mask = make_grammar_constraint(compile_regex_for(pattern, *tok), *tok);
  js[2].sampling.repetition_penalty = 1.1f;
  js[2].sampling.logit_bias = {{13, -1.0f}};
  std::vector<std::vector<int32_t>> tokens(js.size());
  stats->assign(js.size(), {});
  std::unique_ptr<Generator> g;
  for (size_t i = 0; i < js.size(); ++i) {
    js[i].on_event = [&tokens, stats, i](const GenerationEvent& e) {
      if (e.type == GenerationEvent::Type::token) tokens[i].push_back(e.token);
      else {
        EXPECT_NE(e.reason, FinishReason::error) << e.error;
        (*stats)[i] = e.stats;
      }
    };
    if (!g || !batched) g = std::make_unique<Generator>(m, *tok, GeneratorOptions{});
    g->submit(std::move(js[i]));
    if (!batched) g->run_until_idle();
  }
  g->run_until_idle();
  return tokens;
}

TEST(GeneratorDeviceSampling, SpeculativeVerifyPassesSampleOnTheDeviceWithTheSameTokens) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  auto cpu = make_cpu_backend(2);
  std::vector<GenerationStats> plain_stats, stats;
  const auto want = speculating(*cpu, false, Speculation::none, &plain_stats);
  EXPECT_LT(want[0].size(), 90u) << "the grammar completes before max_new_tokens";
  for (bool batched : {false, true}) {
    SamplingCpuBackend dev;
    const auto got = speculating(dev, batched, Speculation::ngram, &stats);
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i], want[i]) << "job " << i << (batched ? " batched" : " alone");
      EXPECT_GT(stats[i].n_accepted, 0) << "job " << i;
      EXPECT_LT(stats[i].n_decode_passes, int64_t(got[i].size())) << "job " << i;
    }
    EXPECT_GT(dev.rows_sampled, dev.calls + 20) << "verify passes sample several rows per call";
  }
}

// warm_up with device sampling also runs a job's verify-pass shapes, each once while the backend
// records steps at once: 2..16 positions with the logits of every position and 2..8 with the
// last's, ending at every power-of-two context from 256 up to the model's 512 positions (the
// cache holds 1,024), after a 32-position pass and one sampling of 16 masked rows. Every page
// comes back and a speculating job's tokens are a fresh generator's.
TEST(GeneratorDeviceSampling, WarmUpRunsVerifyPassShapesAndKeepsTheTokens) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  ModelDir dir(test::shared_dir() / "models/stories260K-hf");
  auto tok = load_tokenizer(dir.path());
  SamplingCpuBackend dev;
  Model m(dir, dev);
  GeneratorOptions o;
  o.page_size = 16;
  o.num_pages = 64;
  o.speculate = Speculation::ngram;
  const auto story = tok->encode("Once upon a time, there was a little girl named Lily. Once upon a time, there", true);
  auto run = [&](Generator& g) {
    std::vector<int32_t> out;
    GenerationJob j;
    j.prompt = story;
    j.sampling.temperature = 0;
    j.max_new_tokens = 40;
    j.on_event = [&](const GenerationEvent& e) {
      if (e.type == GenerationEvent::Type::token) out.push_back(e.token);
    };
    g.submit(std::move(j));
    g.run_until_idle();
    return out;
  };
  Generator fresh(m, *tok, o);
  const auto want = run(fresh);
  dev.multi_passes.clear();
  dev.max_rows_masked = 0;
  Generator g(m, *tok, o);
  g.warm_up(64);
  std::map<std::pair<int64_t, int64_t>, int> seen;
  for (const auto& p : dev.multi_passes)
    if (p.second <= Generator::k_warm_verify_rows) ++seen[p];
  for (int64_t end : {256, 512})
    for (int64_t n = 2; n <= Generator::k_warm_verify_rows; ++n)
      EXPECT_EQ(seen[std::make_pair(end, n)], n <= Generator::k_warm_forced_rows ? 2 : 1)
          << n << " positions ending at " << end;
  for (const auto& [p, count] : seen) EXPECT_LE(p.first, 512) << "past the model's positions";
  EXPECT_EQ(dev.max_rows_masked, Generator::k_warm_verify_rows);
  EXPECT_EQ(dev.recording_at_once, (std::vector<bool>{true, false}));
  EXPECT_EQ(dev.passes_at_once, 2 * (15 + 7));
  SeqId probe = g.cache().create_sequence();
  EXPECT_TRUE(g.cache().reserve(probe, o.num_pages * o.page_size));
  g.cache().release(probe);
  EXPECT_EQ(run(g), want);
  EXPECT_GT(want.size(), 10u);
}

TEST(GeneratorDeviceSampling, HostOnlySettingsOrTheOptionKeepTheHostPath) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  auto cpu = make_cpu_backend(2);
  const auto want = generate(*cpu, true);
  SamplingCpuBackend dev;
  const auto got = generate(dev, true);
  EXPECT_EQ(got, want);
  // The typical_p job runs 40 tokens alongside the others: every step with it is on the host.
  EXPECT_EQ(dev.calls, 0);
  SamplingCpuBackend off;
  EXPECT_EQ(generate(off, false, false), generate(*cpu, false));
  EXPECT_EQ(off.calls, 0);
}

// Four jobs without mask hooks (so that every step may be pipelined): seeded top-k/top-p,
// greedy with a stop token, penalties and biases cancelled at its 12th token, and a seeded job
// submitted when job 0 has five tokens. Returns each job's tokens and finish reason.
struct Run {
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::error;
  bool operator==(const Run&) const = default;
};
std::vector<Run> pipeline_jobs(Backend& be, bool pipelined, int32_t stop_token) {
  ModelDir dir(test::shared_dir() / "models/stories260K-hf");
  auto tok = load_tokenizer(dir.path());
  Model m(dir, be);
  GeneratorOptions o;
  o.pipelined = pipelined;
  o.page_size = 16;
  Generator g(m, *tok, o);
  std::vector<Run> runs(4);
  std::vector<uint64_t> ids(4);
  std::function<void(int, GenerationJob)> submit = [&](int i, GenerationJob j) {
    j.on_event = [&, i](const GenerationEvent& e) {
      Run& r = runs[size_t(i)];
      if (e.type != GenerationEvent::Type::token) {
        r.reason = e.reason;
        return;
      }
      r.tokens.push_back(e.token);
      if (i == 0 && r.tokens.size() == 5) {
        GenerationJob late;
        late.prompt = {1, 320, 471};
        late.sampling.temperature = 0.7f, late.sampling.seed = 5;
        late.max_new_tokens = 30;
        submit(3, std::move(late));
      }
      if (i == 2 && r.tokens.size() == 12) g.cancel(ids[2]);
    };
    ids[size_t(i)] = g.submit(std::move(j));
  };
  GenerationJob a, b, c;
  a.prompt = {1};
  a.max_new_tokens = 50;
  a.sampling.temperature = 0.9f, a.sampling.top_k = 20, a.sampling.top_p = 0.9f, a.sampling.seed = 7;
  b.prompt = {1, 400, 300};
  b.max_new_tokens = 60;
  b.sampling.temperature = 0;
  b.stop_tokens = {stop_token};
  c.prompt = {1, 300, 300, 13};
  c.max_new_tokens = 40;
  c.sampling.repetition_penalty = 1.2f, c.sampling.presence_penalty = 0.2f, c.sampling.seed = 8;
  c.sampling.logit_bias = {{13, 2.0f}};
  submit(0, std::move(a));
  submit(1, std::move(b));
  submit(2, std::move(c));
  g.run_until_idle();
  return runs;
}

TEST(GeneratorDeviceSampling, PipelinedDecodingGivesTheSameTokens) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  auto cpu = make_cpu_backend(2);
  // The stop token: the greedy job's 15th token when it runs without one.
  const auto free_run = pipeline_jobs(*cpu, false, -1);
  ASSERT_GE(free_run[1].tokens.size(), 15u);
  const int32_t stop = free_run[1].tokens[14];
  const auto want = pipeline_jobs(*cpu, false, stop);
  SamplingCpuBackend dev(true);
  const auto got = pipeline_jobs(dev, true, stop);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "job " << i;
    EXPECT_EQ(got[i].reason, want[i].reason) << "job " << i;
  }
  EXPECT_EQ(want[0].tokens.size(), 50u);
  EXPECT_EQ(want[1].reason, FinishReason::stop_token);
  EXPECT_LE(want[1].tokens.size(), 15u);
  EXPECT_EQ(want[2].reason, FinishReason::cancelled);
  EXPECT_EQ(want[3].tokens.size(), 30u);
  // Job 0's 50 tokens take ~50 steps: all were fed on the device but the first (the prefill),
  // the late job's arrival and prefill, and each job's last token (47 when this was written).
  EXPECT_GE(dev.fed_steps, 40);
  EXPECT_GE(dev.deferred_calls, dev.fed_steps);
  SamplingCpuBackend step_by_step(true);
  EXPECT_EQ(pipeline_jobs(step_by_step, false, stop), want);
  EXPECT_EQ(step_by_step.deferred_calls, 0);
}

// The model asks the backend what it can do (Backend::capabilities) and samples nothing to find out.
TEST(GeneratorDeviceSampling, TheModelReadsTheBackendsCapabilities) {
  EXL_REQUIRE_SHARED("models/stories260K-hf");
  ModelDir dir(test::shared_dir() / "models/stories260K-hf");
  auto cpu = make_cpu_backend(2);
  const Model on_cpu(dir, *cpu);
  EXPECT_FALSE(on_cpu.can_sample_on_device());
  EXPECT_FALSE(on_cpu.can_sample_deferred());
  SamplingCpuBackend now, deferring(true);
  const Model on_now(dir, now), on_deferring(dir, deferring);
  EXPECT_TRUE(on_now.can_sample_on_device());
  EXPECT_FALSE(on_now.can_sample_deferred());
  EXPECT_TRUE(on_deferring.can_sample_on_device());
  EXPECT_TRUE(on_deferring.can_sample_deferred());
  EXPECT_EQ(now.calls + deferring.calls + deferring.deferred_calls, 0);
}

}  // namespace generator_device_sampling_test
}  // namespace exl
