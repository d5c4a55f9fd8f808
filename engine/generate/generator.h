// Continuous-batching generation on one Model: jobs in, events out. Each step admits queued
// jobs (reusing cached prefix pages), builds one batch of decode tokens and prefill chunks, runs
// the forward pass, samples, and reports tokens and text.
//
// KV pages: a job that cannot get pages waits while others run. When every planned job waits,
// the youngest gives its pages back and later recomputes its tokens (prompt and what it has
// emitted; nothing is emitted twice), so the oldest always progresses; only a job that does not
// fit the cache alone ends with the error "out of KV cache pages".
//
// Failures: any exception out of the backend (a device error, a failed allocation), a sampler or
// a mask hook ends the jobs it concerns (a forward pass: its whole batch) with reason error and
// its message; their pages and batch slots are freed and the generator goes on.
//
// Threads: submit() and cancel() may be called from any thread. step() runs on one thread at a
// time — either the caller's (tests, single-shot CLIs) or the generator's own after start().
// Event callbacks run on the stepping thread and must not block or call back into step().
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "engine/model.h"
#include "engine/generate/page_cache.h"
#include "engine/generate/sampler.h"
#include "engine/generate/speculation.h"
#include "engine/generate/step_profile.h"
#include "engine/tokenizer/tokenizer.h"

namespace exl {

class DraftModel;

// Constrains sampling for one job (the grammar engine implements it: engine/generate/grammar_constraint.h).
// fill_mask sets the bit of every token allowed next (mask has mask_words(vocab) words, all bits
// clear on entry); accept is told every token the job emits, sampled or forced, and throws
// exl::Error for a token it cannot take. forced_tokens (asked before each sampling and after each
// sampled token) returns tokens to append without sampling, given the tokens generated so far;
// the generator emits them like sampled ones (events, stats, max_new_tokens). Once terminated()
// the job ends with reason stop_token. A mask that allows no token ends the job with an error.
//
// Drafting (engine/generate/speculation.h) walks the constraint ahead of the job: a hook whose
// can_draft() is true answers try_accept (advance over the token and return true when it is
// allowed next; return false and change nothing otherwise) and rollback(n) (undo the last n
// successful try_accepts), and its forced_tokens and terminated answer for the state so reached;
// likely_tokens (asked where nothing is forced) may name tokens it expects next without forcing
// them (the draft guesses them).
// The generator always rolls a walk back before it calls fill_mask or accept again. Drafts of
// jobs whose hook cannot draft are not checked against it (the target still samples under
// fill_mask, so the output is the same; only the draft is longer than it could be).
class LogitsMaskHook {
 public:
  virtual ~LogitsMaskHook() = default;
  virtual void fill_mask(std::span<uint32_t> mask) = 0;
  virtual void accept(int32_t token) = 0;
  virtual std::vector<int32_t> forced_tokens(std::span<const int32_t> /*generated*/) { return {}; }
  virtual bool terminated() const { return false; }
  virtual bool can_draft() const { return false; }
  virtual std::vector<int32_t> likely_tokens(std::span<const int32_t> /*generated*/) { return {}; }
  virtual bool try_accept(int32_t /*token*/) { return false; }
  virtual void rollback(size_t /*n*/) {}
};

enum class FinishReason : uint8_t { stop_token, stop_string, max_tokens, cancelled, error };
std::string to_string(FinishReason r);

struct GenerationStats {
  int64_t n_prompt_tokens = 0;
  int64_t n_cached_tokens = 0;  // prompt tokens served from the prefix cache
  int64_t n_generated = 0;
  double ttft_s = 0;            // submit → first sampled token
  double decode_s = 0;          // first → last token
  int64_t n_decode_passes = 0;  // forward passes that gave this job logits to sample from
  int64_t n_drafted = 0;        // speculated tokens checked by the target (engine/generate/speculation.h)
  int64_t n_accepted = 0;       // of those, emitted as drafted
  double tokens_per_pass() const { return n_decode_passes > 0 ? double(n_generated) / double(n_decode_passes) : 0; }
  double tokens_per_s() const { return decode_s > 0 && n_generated > 1 ? double(n_generated - 1) / decode_s : 0; }
};

// The log-probabilities of one emitted token: log-softmax of the model's raw logits at that
// position (before logit_bias, penalties, temperature, top-k/p and the mask).
struct TokenLogprobs {
  float logprob = 0;                           // of the emitted token
  std::vector<std::pair<int32_t, float>> top;  // the most likely tokens and theirs, most likely first
};

struct GenerationEvent {
  enum class Type : uint8_t { token, done };
  Type type = Type::token;
  uint64_t job = 0;
  int32_t token = -1;  // token events
  std::string text;    // token events: newly complete text (may be empty while held back)
  std::optional<TokenLogprobs> logprobs;  // token events of jobs with top_logprobs >= 0
  FinishReason reason = FinishReason::max_tokens;  // done events
  std::string error;   // done events with reason error
  GenerationStats stats;
};

struct GenerationJob {
  std::vector<int32_t> prompt;  // must be non-empty
  SamplerSettings sampling;
  int32_t max_new_tokens = 256;
  std::vector<int32_t> stop_tokens;       // generation ends after emitting one of these
  std::vector<std::string> stop_strings;  // text ends before the first match
  bool include_stop_token_text = false;   // emit the stop token's text
  std::shared_ptr<LogitsMaskHook> mask;
  // >= 0: every token event carries TokenLogprobs with this many top alternatives. Such a job is
  // sampled on the host from downloaded logits, and its mask's forced tokens are sampled (the
  // mask allows only them) rather than appended, so that each has its logits.
  int32_t top_logprobs = -1;
  // Speculative decoding (engine/generate/speculation.h): the same tokens either way, decoded
  // several per forward pass where drafts are accepted. Such a job samples on the host and is not
  // pipelined. Unset: GeneratorOptions::speculate.
  std::optional<Speculation> speculate;
  std::function<void(const GenerationEvent&)> on_event;
  // Nonzero: when the job ends (not in error) its full KV pages stay referenced under this key,
  // replacing the key's earlier pin, so the next turn of a session is a prefix-cache hit. Pins are
  // released by unpin() and, oldest first, whenever the cache runs short of pages.
  uint64_t pin = 0;
};

struct GeneratorOptions {
  KvFormat cache_format = KvFormat::f32;
  int page_size = 64;
  int num_pages = 512;          // cache budget
  int max_batch_seqs = 16;      // jobs decoding at once
  int max_step_tokens = 512;    // tokens per forward pass (prefill chunk budget)
  // Sample on the backend (Backend::sample_rows) when it can and every job sampled in the step
  // allows it (engine/generate/device_sampling.h); same tokens as the host sampler. false: always host.
  bool device_sampling = true;
  // Pipelined decoding (Model::forward_device_fed): while every active job decodes, samples on
  // the device and has no mask hook, the next step is queued, fed by the sampled ids on the
  // device, before the host collects and emits them; the device then never waits for the host
  // between steps. The same tokens as without. A job that ends on the collected token leaves
  // one step of work discarded.
  bool pipelined = true;
  // Speculative decoding for jobs that do not choose (GenerationJob::speculate).
  Speculation speculate = Speculation::none;
  // `auto` drafts only in steps where at most this many jobs decode: a pass of several positions
  // per job costs about one position's time only while the pass is not compute-bound (CPU,
  // demo model: faster at 1-2 jobs, slower from 4; BENCHMARKS.md session 17). `auto` never
  // drafts for jobs that pipelined decoding would serve (no mask hook, device sampling).
  int speculate_max_seqs = 2;
  // A draft model for Speculation::draft (and `auto`, which then drafts with it): a smaller
  // model of the same vocabulary (check_same_vocabulary, engine/generate/draft_model.h) on the
  // same backend, outliving the Generator; its K/V in draft_num_pages pages (0: num_pages) of
  // page_size tokens in cache_format.
  Model* draft_model = nullptr;
  int draft_num_pages = 0;
};

class Generator {
 public:
  Generator(Model& model, const Tokenizer& tokenizer, GeneratorOptions options);
  ~Generator();

  uint64_t submit(GenerationJob job);
  void cancel(uint64_t job);
  // Releases the pages pinned under `pin` (see GenerationJob::pin); any thread.
  void unpin(uint64_t pin);
  // One scheduling step; returns false when there was nothing to do.
  bool step();
  // Runs until every submitted job is done (on the calling thread).
  void run_until_idle();
  // Runs the kernels a first request would load and record (GPU libraries load lazily, CUDA
  // graphs are captured at first use): prefills of a few lengths up to `max_prefill` tokens (and
  // max_step_tokens) and a one-token decode step sampled as jobs are, in a scratch sequence whose
  // pages go back unkeyed (the prefix cache gains nothing). With device sampling (a GPU) also the
  // shapes of one job's speculative verify passes (2..k_warm_verify_rows positions, logits of
  // every one) and forced-token passes (2..k_warm_forced_rows, the last's), each run once under
  // Model::record_steps_at_once, ending at each power-of-two context from
  // k_warm_verify_min_context up to the smaller of the model's positions, the cache and
  // k_warm_verify_max_context; before them a pass of twice as many positions and a sampling of
  // k_warm_verify_rows masked rows, so that the buffers a verify pass needs grow here, not under
  // the first jobs (where every growth drops the recorded graphs). Call before start() or step();
  // the output of later jobs does not depend on it.
  void warm_up(int64_t max_prefill = 512);
  static constexpr int64_t k_warm_verify_rows = 16;
  static constexpr int64_t k_warm_forced_rows = 8;
  static constexpr int64_t k_warm_verify_min_context = 256;
  static constexpr int64_t k_warm_verify_max_context = 2048;
  // Background stepping thread.
  void start();
  void stop();

  PageCache& cache() { return *cache_; }
  // Jobs that gave their pages back so that older ones could go on (stepping thread).
  int64_t n_preempted() const { return n_preempted_; }
  const GeneratorOptions& options() const { return opts_; }

 private:
  struct Active;
  void admit();
  void finish(Active& a, FinishReason r, std::string error = {});
  void emit_token(Active& a, int32_t token, std::optional<TokenLogprobs> logprobs = {});
  bool emit_forced(Active& a);
  void sample_next(Active& a, std::span<float> logits, std::vector<uint32_t>& mask);
  bool prepare_sample(Active& a, std::vector<uint32_t>& mask);
  void emit_sampled(Active& a, int32_t token, std::optional<TokenLogprobs> logprobs = {});
  void build_draft(Active& a, int64_t room);
  void build_model_drafts(std::span<Active* const> jobs, std::span<const int64_t> rooms);
  void warm_up_verify(std::span<const int32_t> toks, std::span<const int32_t> table, std::span<const int64_t> contexts,
                      int64_t rows);
  static constexpr int64_t k_max_model_draft = 32;  // tokens a model draft may hold, forced ones included
  void verify_draft(Active& a, std::span<float> logits, int64_t first_row, std::vector<uint32_t>& mask);
  // The acceptance loop of a verify pass; sample_row(r) samples the job's next token from row r of
  // its pass (0 = after the first pending token), as sample_next does.
  void verify_draft(Active& a, const std::function<void(size_t row)>& sample_row);
  // Whether a drafting job's verify rows can be sampled on the device: greedy, no history
  // penalties, no log-probabilities, and a constraint (if any) that can be walked ahead.
  bool verifies_on_device(const Active& a) const;

  void finish_stuck(Active& a);
  bool use_device_sampling(std::span<Active* const> sampling) const;
  // Samples the last forward_device()'s rows on the device, one sample_device call: `sampling`
  // jobs from their rows (under their usual masks), and verify passes: each `verifying` job's
  // rows from first_rows[i] on get the constraint's mask of their position (walked on the host
  // while the device runs the pass), then its acceptance loop runs over the ids.
  void sample_on_device(std::span<Active* const> sampling, std::span<const int64_t> sample_rows,
                        std::span<Active* const> verifying = {}, std::span<const int64_t> first_rows = {});
  bool sample_deferred_and_feed(std::span<Active* const> sampling, std::span<const int64_t> rows);
  void collect_deferred();
  bool step_fed();
  void pin_pages(Active& a);
  bool release_oldest_pin();

  Model& model_;
  const Tokenizer& tok_;
  GeneratorOptions opts_;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<PageCache> cache_;
  bool device_sampler_ = false;  // options allow it and the backend can
  bool pipelined_ = false;       // likewise for pipelined decoding
  int64_t n_preempted_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<uint64_t, GenerationJob>> queue_;  // guarded by mu_
  std::vector<uint64_t> cancelled_;                       // guarded by mu_
  std::vector<uint64_t> unpins_;                          // guarded by mu_
  uint64_t next_id_ = 1;                                  // guarded by mu_
  std::atomic<bool> running_{false};
  std::thread thread_;

  std::vector<std::unique_ptr<Active>> active_;  // stepping thread only
  std::vector<std::pair<uint64_t, SeqId>> pins_;  // stepping thread only; oldest first
  std::vector<int32_t> lookup_classes_;           // stepping thread only; built at the first draft
  std::unique_ptr<DraftModel> draft_;             // with options.draft_model
  // Pipelining (stepping thread only): the jobs of the deferred sampling not collected yet, in
  // entry order, and of the fed step queued after it (batch order = entry order; empty: none).
  std::vector<Active*> deferred_, fed_;
  StepProfile prof_;  // stepping thread only
};

}  // namespace exl
