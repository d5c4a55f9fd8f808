#include "engine/generate/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "engine/tokenizer/detokenizer.h"
#include "engine/generate/device_sampling.h"
#include "engine/generate/draft_model.h"
#include "kernels/error.h"

namespace exl {

std::string to_string(FinishReason r) {
  switch (r) {
    case FinishReason::stop_token: return "stop_token";
    case FinishReason::stop_string: return "stop_string";
    case FinishReason::max_tokens: return "max_tokens";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::error: return "error";
  }
  return "?";
}

namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }
// A job's error for an exception out of the backend, the sampler or a mask hook. Every failure is
// caught as std::exception, not only exl::Error: another (std::bad_alloc from an allocation inside
// a forward pass) would end the stepping thread, and with it the process. exl::Error messages
// name their layer already; the others get the generator's.
std::string generator_failure_text(const std::exception& e) {
  if (dynamic_cast<const Error*>(&e)) return e.what();
  return cat("engine: generator: ", e.what());
}
}  // namespace

struct Generator::Active {
  uint64_t id = 0;
  GenerationJob job;
  Sampler sampler;
  Detokenizer detok;
  SeqId seq = 0;
  std::vector<int32_t> tokens;  // prompt + generated, in order
  int64_t n_done = 0;           // tokens whose K/V are in the cache
  std::string held;             // text held back for stop strings
  GenerationStats stats;
  Clock::time_point submitted, first_token;
  bool finished = false;
  std::vector<int32_t> draft;  // this step's speculated tokens after the pending ones
  std::vector<bool> guessed;   // per draft token: a prompt-lookup guess, else forced by the mask
  std::vector<int32_t> feed;   // the pending tokens, then the draft: the positions of the pass
  DraftLength draft_len;
  DraftModel::Slot draft_slot = 0;  // its K/V in the draft model, when it drafts with one

  Active(uint64_t id_, GenerationJob j, const Tokenizer& tok)
      : id(id_), job(std::move(j)), sampler(job.sampling), detok(tok, !has_text(tok, job.prompt), true) {}
  // Whether the prompt shows any text, so the first generated token continues it.
  static bool has_text(const Tokenizer& tok, const std::vector<int32_t>& prompt) {
    for (int32_t t : prompt)
      if (!tok.is_special(t)) return true;
    return false;
  }
  bool prefilling() const { return n_done < int64_t(job.prompt.size()); }
  bool speculates() const {  // job.speculate is resolved at admission
    return job.speculate == Speculation::ngram || job.speculate == Speculation::draft ||
           (job.speculate == Speculation::auto_ && job.sampling.temperature == 0.0f && job.top_logprobs < 0);
  }
};

Generator::Generator(Model& model, const Tokenizer& tokenizer, GeneratorOptions options)
    : model_(model), tok_(tokenizer), opts_(options) {
  EXL_CHECK(opts_.page_size > 0 && opts_.num_pages > 0 && opts_.max_batch_seqs > 0 && opts_.max_step_tokens > 0,
            "engine: generator: page_size, num_pages, max_batch_seqs and max_step_tokens must be positive");
  KvLayout layout = model.kv_layout(opts_.cache_format, opts_.page_size);
  pool_ = model.alloc_kv_pool(opts_.cache_format, opts_.page_size, opts_.num_pages);
  CacheConfig pc;
  pc.n_layers = layout.n_layers;
  pc.n_kv_heads = layout.n_kv_heads;
  pc.head_dim = layout.head_dim;
  pc.page_size = opts_.page_size;
  pc.n_pages = opts_.num_pages;
  pc.format = opts_.cache_format;
  pc.model_hash = std::hash<std::string>{}(model.identity());
  cache_ = std::make_unique<PageCache>(pc);
  device_sampler_ = opts_.device_sampling && model.can_sample_on_device();
  pipelined_ = device_sampler_ && opts_.pipelined && model.can_sample_deferred();
  cache_->set_copy_hook([this](PageId from, PageId to, int n) { model_.kv_copy(*pool_, from, to, n); });
  if (opts_.draft_model) {
    EXL_CHECK(opts_.draft_model->vocab_size() == model.vocab_size(), "engine: generator: the draft model's vocabulary has ",
              opts_.draft_model->vocab_size(), " tokens, the target's ", model.vocab_size());
    draft_ = std::make_unique<DraftModel>(*opts_.draft_model, opts_.draft_num_pages > 0 ? opts_.draft_num_pages : opts_.num_pages,
                                          opts_.page_size, opts_.cache_format);
  }
}

Generator::~Generator() {
  stop();
  if (!deferred_.empty()) {  // leave the backend without a pending sampling
    std::vector<int32_t> ids(deferred_.size());
    try {
      model_.collect_samples(ids);
    } catch (const std::exception&) {
    }
  }
}

uint64_t Generator::submit(GenerationJob job) {
  std::lock_guard lk(mu_);
  const uint64_t id = next_id_++;
  queue_.emplace_back(id, std::move(job));
  cv_.notify_one();
  return id;
}

void Generator::cancel(uint64_t job) {
  std::lock_guard lk(mu_);
  cancelled_.push_back(job);
  cv_.notify_one();
}

void Generator::unpin(uint64_t pin) {
  std::lock_guard lk(mu_);
  unpins_.push_back(pin);
  cv_.notify_one();
}

void Generator::pin_pages(Active& a) {
  const SeqId kept = cache_->fork(a.seq);
  for (auto it = pins_.begin(); it != pins_.end(); ++it)
    if (it->first == a.job.pin) {
      cache_->release(it->second);
      pins_.erase(it);
      break;
    }
  pins_.emplace_back(a.job.pin, kept);
}

bool Generator::release_oldest_pin() {
  if (pins_.empty()) return false;
  cache_->release(pins_.front().second);
  pins_.erase(pins_.begin());
  return true;
}

void Generator::finish(Active& a, FinishReason r, std::string error) {
  if (a.finished) return;
  a.finished = true;
  if (r != FinishReason::stop_string && r != FinishReason::error && !a.held.empty()) {
    GenerationEvent t;
    t.type = GenerationEvent::Type::token;
    t.job = a.id;
    t.text = std::move(a.held);
    a.held.clear();
    if (a.job.on_event) a.job.on_event(t);
  }
  if (a.job.pin && r != FinishReason::error) pin_pages(a);
  cache_->release(a.seq);
  if (draft_ && a.draft_slot) draft_->close(a.draft_slot);
  a.draft_slot = 0;
  GenerationEvent e;
  e.type = GenerationEvent::Type::done;
  e.job = a.id;
  e.reason = r;
  e.error = std::move(error);
  e.stats = a.stats;
  if (a.job.on_event) a.job.on_event(e);
}

void Generator::emit_token(Active& a, int32_t token, std::optional<TokenLogprobs> logprobs) {
  StepProfile::Scope t(prof_, "emit_token");
  if (a.job.mask) a.job.mask->accept(token);
  const auto now = Clock::now();
  if (a.stats.n_generated == 0) {
    a.first_token = now;
    a.stats.ttft_s = seconds(a.submitted, now);
  }
  ++a.stats.n_generated;
  a.stats.decode_s = seconds(a.first_token, now);
  a.tokens.push_back(token);
  a.sampler.accept(token);

  const bool is_stop = std::find(a.job.stop_tokens.begin(), a.job.stop_tokens.end(), token) != a.job.stop_tokens.end();
  std::string text = (is_stop && !a.job.include_stop_token_text) ? a.detok.flush() : a.detok.push(token);
  if (is_stop && a.job.include_stop_token_text) text += a.detok.flush();
  a.held += text;

  // Stop strings: cut at the first full match; hold back a suffix that may start one.
  size_t cut = std::string::npos;
  for (const auto& s : a.job.stop_strings)
    if (!s.empty())
      if (size_t p = a.held.find(s); p != std::string::npos) cut = std::min(cut, p);
  GenerationEvent ev;
  ev.type = GenerationEvent::Type::token;
  ev.job = a.id;
  ev.token = token;
  ev.logprobs = std::move(logprobs);
  if (cut != std::string::npos) {
    ev.text = a.held.substr(0, cut);
    a.held.clear();
    if (a.job.on_event) a.job.on_event(ev);
    finish(a, FinishReason::stop_string);
    return;
  }
  size_t keep = 0;
  for (const auto& s : a.job.stop_strings)
    for (size_t k = std::min(s.size() - 1, a.held.size()); k > keep; --k)
      if (a.held.compare(a.held.size() - k, k, s, 0, k) == 0) {
        keep = k;
        break;
      }
  ev.text = a.held.substr(0, a.held.size() - keep);
  a.held.erase(0, a.held.size() - keep);
  if (a.job.on_event) a.job.on_event(ev);
  if (is_stop || (a.job.mask && a.job.mask->terminated())) finish(a, FinishReason::stop_token);
  else if (a.stats.n_generated >= a.job.max_new_tokens) finish(a, FinishReason::max_tokens);
}

bool Generator::emit_forced(Active& a) {
  const auto generated = std::span<const int32_t>(a.tokens).subspan(a.job.prompt.size());
  std::vector<int32_t> forced;
  {
    StepProfile::Scope t(prof_, "grammar: forced_tokens");
    forced = a.job.mask->forced_tokens(generated);
  }
  for (int32_t t : forced) {
    if (a.finished) break;
    EXL_CHECK(t >= 0 && t < model_.vocab_size(), "engine: generator: job ", a.id, ": forced token ", t,
              " out of range [0, ", model_.vocab_size(), ")");
    emit_token(a, t);
  }
  return !forced.empty();
}

bool Generator::prepare_sample(Active& a, std::vector<uint32_t>& mask) {
  mask.clear();
  if (!a.job.mask) return true;
  if (a.job.top_logprobs < 0 && emit_forced(a)) return false;  // their logits come with the next forward pass
  mask.assign(mask_words(size_t(model_.vocab_size())), 0u);
  {
    StepProfile::Scope t(prof_, "grammar: fill_mask");
    a.job.mask->fill_mask(mask);
  }
  if (std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; })) {
    finish_stuck(a);
    return false;
  }
  return true;
}

void Generator::finish_stuck(Active& a) {
  finish(a, FinishReason::error,
         cat("engine: generator: job ", a.id, ": the output constraint allows no token after ", a.stats.n_generated,
             " generated tokens (the grammar is stuck)"));
}

void Generator::emit_sampled(Active& a, int32_t token, std::optional<TokenLogprobs> logprobs) {
  emit_token(a, token, std::move(logprobs));
  if (a.job.mask && !a.finished && a.job.top_logprobs < 0) emit_forced(a);
}

namespace {

// log-softmax of raw logits (in double) at `token`, and the n most likely tokens.
TokenLogprobs token_logprobs(std::span<const float> raw, int32_t token, int32_t n) {
  const float mx = *std::max_element(raw.begin(), raw.end());
  double sum = 0;
  for (float x : raw) sum += std::exp(double(x) - double(mx));
  const double lse = double(mx) + std::log(sum);
  TokenLogprobs lp;
  lp.logprob = float(double(raw[size_t(token)]) - lse);
  std::vector<int32_t> ids(raw.size());
  std::iota(ids.begin(), ids.end(), 0);
  const size_t k = std::min(size_t(n), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(), [&](int32_t x, int32_t y) {
    return raw[size_t(x)] > raw[size_t(y)] || (raw[size_t(x)] == raw[size_t(y)] && x < y);
  });
  for (size_t i = 0; i < k; ++i) lp.top.emplace_back(ids[i], float(double(raw[size_t(ids[i])]) - lse));
  return lp;
}

}  // namespace

void Generator::sample_next(Active& a, std::span<float> logits, std::vector<uint32_t>& mask) {
  if (!prepare_sample(a, mask)) return;
  if (a.job.top_logprobs < 0) {
    int32_t token;
    {
      StepProfile::Scope t(prof_, "host sampler");
      token = a.sampler.sample(logits, mask);
    }
    return emit_sampled(a, token);
  }
  const std::vector<float> raw(logits.begin(), logits.end());  // the sampler changes logits in place
  const int32_t token = a.sampler.sample(logits, mask);
  emit_sampled(a, token, token_logprobs(raw, token, a.job.top_logprobs));
}

namespace {

// A draft being built for one job: guesses (prompt lookup or a draft model) and, under a mask
// hook that can draft, the walk of the constraint over them (see build_draft). rollback() must
// be called once the draft is complete.
struct DraftWalk {
  std::vector<int32_t>& draft;
  std::vector<bool>& guessed;
  LogitsMaskHook* hook;  // null: guesses are not checked
  std::vector<int32_t> ctx;
  size_t gen0;
  int64_t room;
  int guesses;
  size_t walked = 0;

  std::span<const int32_t> generated() const { return std::span<const int32_t>(ctx).subspan(gen0); }
  bool take(int32_t t, bool guess) {
    if (int64_t(draft.size()) >= room) return false;
    if (hook && (hook->terminated() || !hook->try_accept(t))) return false;
    if (hook) ++walked;
    draft.push_back(t);
    guessed.push_back(guess);
    ctx.push_back(t);
    if (guess) --guesses;
    return true;
  }
  // Appends what the constraint forces, then the tokens it makes likely (not counted as
  // guesses), until it has neither; false when the draft cannot grow further.
  bool extend() {
    if (!hook) return guesses > 0 && int64_t(draft.size()) < room;
    for (;;) {
      if (const std::vector<int32_t> forced = hook->forced_tokens(generated()); !forced.empty()) {
        for (int32_t t : forced)
          if (!take(t, false)) return false;
        continue;
      }
      if (const std::vector<int32_t> likely = hook->likely_tokens(generated()); !likely.empty()) {
        for (int32_t t : likely) {
          if (!take(t, true)) return false;
          ++guesses;
        }
        continue;
      }
      return guesses > 0 && int64_t(draft.size()) < room && !hook->terminated();
    }
  }
  void rollback() {
    if (hook) hook->rollback(walked);
    walked = 0;
  }
  void abandon() {
    rollback();
    draft.clear();
    guessed.clear();
  }
};

}  // namespace

void Generator::build_draft(Active& a, int64_t room) {
  // Guesses come from prompt lookup; under a hook that can draft, each is kept only while the
  // constraint allows it, and the tokens the constraint forces after it join the draft as the
  // job would emit them (forced_tokens asked until it has none, as sample_next does), so they
  // cost no guess and are accepted whenever the guess before them is.
  a.draft.clear();
  a.guessed.clear();
  if (lookup_classes_.empty()) lookup_classes_ = lookup_classes(tok_);
  LogitsMaskHook* hook = a.job.mask && a.job.mask->can_draft() ? a.job.mask.get() : nullptr;
  DraftWalk w{a.draft, a.guessed, hook, a.tokens, a.job.prompt.size(), room, int(std::min<int64_t>(a.draft_len.cur, room))};
  try {
    while (w.extend()) {
      bool more = false;
      for (int32_t t : ngram_draft(w.ctx, w.guesses, 3, 1, lookup_classes_)) {
        if (!w.take(t, true)) break;
        if (hook && !hook->forced_tokens(w.generated()).empty()) {
          more = true;
          break;
        }
      }
      if (!more) break;
    }
  } catch (const std::exception&) {
    w.abandon();
    return;
  }
  w.rollback();
}

void Generator::build_model_drafts(std::span<Active* const> jobs, std::span<const int64_t> rooms) {
  // One round per guessed position: the draft model's forward for every job still drafting, then
  // its most likely token the constraint allows. The walk is build_draft's.
  std::vector<DraftWalk> walks;
  walks.reserve(jobs.size());
  std::vector<bool> open(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    Active& a = *jobs[i];
    a.draft.clear();
    a.guessed.clear();
    LogitsMaskHook* hook = a.job.mask && a.job.mask->can_draft() ? a.job.mask.get() : nullptr;
    walks.push_back({a.draft, a.guessed, hook, a.tokens, a.job.prompt.size(), rooms[i],
                     int(std::min<int64_t>(a.draft_len.cur, rooms[i]))});
  }
  const int64_t V = model_.vocab_size();
  std::vector<uint32_t> mask;
  try {
    for (size_t i = 0; i < jobs.size(); ++i) open[i] = walks[i].extend();
    for (;;) {
      std::vector<DraftModel::Slot> slots;
      std::vector<std::span<const int32_t>> ctxs;
      std::vector<size_t> which;
      for (size_t i = 0; i < jobs.size(); ++i)
        if (open[i]) {
          slots.push_back(jobs[i]->draft_slot);
          ctxs.push_back(walks[i].ctx);
          which.push_back(i);
        }
      if (slots.empty()) break;
      const DraftModel::Logits out = draft_->next_logits(slots, ctxs, opts_.max_step_tokens);
      for (size_t j = 0; j < which.size(); ++j) {
        const size_t i = which[j];
        DraftWalk& w = walks[i];
        open[i] = false;
        if (!out.ready[j]) continue;
        const float* row = out.rows.data() + j * size_t(V);
        if (w.hook) {
          mask.assign(mask_words(size_t(V)), 0u);
          w.hook->fill_mask(mask);
        }
        int32_t best = -1;
        for (int32_t t = 0; t < int32_t(V); ++t)
          if ((!w.hook || (mask[size_t(t) / 32] >> (t % 32) & 1u)) && (best < 0 || row[t] > row[best])) best = t;
        open[i] = best >= 0 && w.take(best, true) && w.extend();
      }
    }
  } catch (const std::exception&) {
    for (auto& w : walks) w.abandon();
    return;
  }
  for (auto& w : walks) w.rollback();
}

void Generator::verify_draft(Active& a, std::span<float> logits, int64_t first_row, std::vector<uint32_t>& mask) {
  const int64_t V = model_.vocab_size();
  verify_draft(a, [&](size_t row) {
    sample_next(a, logits.subspan(size_t((first_row + int64_t(row)) * V), size_t(V)), mask);
  });
}

void Generator::verify_draft(Active& a, const std::function<void(size_t row)>& sample_row) {
  // The pass fed the m pending tokens, then the draft: row m - 1 + j holds the logits after the
  // pending tokens and draft[0, j), usable while what the job has emitted since is exactly that
  // much of the draft. Positions are committed to the cache before each sampling, as without
  // speculation (a job that ends keeps, and may pin, the same pages).
  const int64_t k = int64_t(a.draft.size());
  const size_t m = a.feed.size() - a.draft.size();
  const size_t base = a.tokens.size();
  size_t committed = 0;
  ++a.stats.n_decode_passes;
  while (!a.finished) {
    const size_t n_new = a.tokens.size() - base;
    if (int64_t(n_new) > k || !std::equal(a.tokens.begin() + ptrdiff_t(base), a.tokens.end(), a.draft.begin())) break;
    cache_->append_tokens(a.seq, std::span<const int32_t>(a.feed).subspan(committed, m + n_new - committed));
    a.n_done += int64_t(m + n_new - committed);
    committed = m + n_new;
    try {
      sample_row(m - 1 + n_new);
    } catch (const std::exception& e) {
      finish(a, FinishReason::error, generator_failure_text(e));
    }
  }
  const size_t accepted = committed - m;
  const auto n_guessed = std::count(a.guessed.begin(), a.guessed.end(), true);
  const auto n_hit = std::count(a.guessed.begin(), a.guessed.begin() + ptrdiff_t(accepted), true);
  a.stats.n_drafted += n_guessed;
  a.stats.n_accepted += n_hit;
  a.draft_len.update(int(n_guessed), int(n_hit));
}

bool Generator::verifies_on_device(const Active& a) const {
  const SamplerSettings& s = a.job.sampling;
  const bool penalties = s.penalty_last_n != 0 && (s.repetition_penalty != 1.0f || s.frequency_penalty != 0.0f ||
                                                   s.presence_penalty != 0.0f);
  return device_sampler_ && device_samplable(s) && s.temperature == 0.0f && !penalties && a.job.top_logprobs < 0 &&
         (!a.job.mask || a.job.mask->can_draft());
}

void Generator::sample_on_device(std::span<Active* const> sampling, std::span<const int64_t> sample_rows,
                                 std::span<Active* const> verifying, std::span<const int64_t> first_rows) {
  const int64_t V = model_.vocab_size();
  struct Verify {
    Active* a;
    size_t first;              // its first entry of `inputs`: the row after its last pending token
    std::vector<bool> stuck;   // per row: the constraint allows nothing there
  };
  std::vector<DeviceRow> inputs;
  std::vector<Verify> vs;
  std::vector<uint32_t> mask;
  for (size_t i = 0; i < verifying.size(); ++i) {
    Active& a = *verifying[i];
    if (a.finished) continue;
    const size_t m = a.feed.size() - a.draft.size(), n_rows = a.draft.size() + 1;
    Verify v{&a, inputs.size(), std::vector<bool>(n_rows, false)};
    LogitsMaskHook* hook = a.job.mask.get();
    size_t walked = 0;
    try {
      // Row j follows the pending tokens and draft[0, j); the job samples from it only while it has
      // emitted exactly those, so its mask is the constraint's after them. Past a draft token the
      // constraint refuses, no row is reached (all tokens allowed: never used).
      bool reachable = true;
      for (size_t j = 0; j < n_rows; ++j) {
        mask.clear();
        if (hook && reachable) {
          StepProfile::Scope t(prof_, "grammar: fill_mask");
          mask.assign(mask_words(size_t(V)), 0u);
          hook->fill_mask(mask);
          v.stuck[j] = std::all_of(mask.begin(), mask.end(), [](uint32_t w) { return w == 0; });
        }
        inputs.push_back(make_device_row(a.sampler, V, first_rows[i] + int64_t(m - 1 + j), mask));
        if (hook && reachable && j + 1 < n_rows) {
          if (hook->terminated() || !hook->try_accept(a.draft[j])) reachable = false;
          else ++walked;
        }
      }
      if (hook) hook->rollback(walked);
    } catch (const std::exception& e) {
      if (hook) hook->rollback(walked);
      inputs.resize(v.first);
      finish(a, FinishReason::error, generator_failure_text(e));
      continue;
    }
    vs.push_back(std::move(v));
  }
  std::vector<std::pair<Active*, size_t>> jobs;  // sampling jobs with their entry of `inputs`
  for (size_t i = 0; i < sampling.size(); ++i) {
    Active& a = *sampling[i];
    try {
      if (!prepare_sample(a, mask)) continue;
      jobs.emplace_back(&a, inputs.size());
      inputs.push_back(make_device_row(a.sampler, V, sample_rows[i], mask));
    } catch (const std::exception& e) {
      finish(a, FinishReason::error, generator_failure_text(e));
    }
  }
  std::vector<int32_t> ids(inputs.size());
  if (!inputs.empty()) {
    std::vector<RowSampling> params;
    for (const DeviceRow& d : inputs) params.push_back(d.view());
    try {
      EXL_CHECK(model_.sample_device(params, ids), "engine: generator: the backend cannot sample on the device");
    } catch (const std::exception& e) {
      for (auto& [a, at] : jobs) finish(*a, FinishReason::error, generator_failure_text(e));
      for (Verify& v : vs) finish(*v.a, FinishReason::error, generator_failure_text(e));
      return;
    }
  }
  for (auto& [a, at] : jobs) {
    try {
      emit_sampled(*a, checked_sampled_token(ids[at], V));
    } catch (const std::exception& e) {
      finish(*a, FinishReason::error, generator_failure_text(e));
    }
  }
  for (Verify& v : vs) {
    Active& a = *v.a;
    const size_t m = a.feed.size() - a.draft.size();
    verify_draft(a, [&](size_t row) {
      const size_t j = row - (m - 1);
      if (a.job.mask && emit_forced(a)) return;  // as prepare_sample: forced tokens take no logits
      if (v.stuck[j]) return finish_stuck(a);
      emit_sampled(a, checked_sampled_token(ids[v.first + j], V));
    });
    a.draft.clear();
  }
}

bool Generator::use_device_sampling(std::span<Active* const> sampling) const {
  if (!device_sampler_ || sampling.empty()) return false;
  return std::all_of(sampling.begin(), sampling.end(), [](const Active* a) {
    return device_samplable(a->job.sampling) && a->job.top_logprobs < 0;
  });
}

bool Generator::sample_deferred_and_feed(std::span<Active* const> sampling, std::span<const int64_t> rows) {
  // Only when these jobs are all there is to run next: the fed step decodes exactly them.
  const auto running = std::count_if(active_.begin(), active_.end(), [](const auto& a) { return !a->finished; });
  if (!pipelined_ || int64_t(sampling.size()) != int64_t(running)) return false;
  for (const Active* a : sampling)
    if (a->finished || a->job.mask || a->speculates() || a->stats.n_generated + 1 >= a->job.max_new_tokens ||
        int64_t(a->tokens.size()) != a->n_done)
      return false;
  const int64_t V = model_.vocab_size();
  std::vector<DeviceRow> inputs;
  std::vector<RowSampling> params;
  try {
    for (size_t i = 0; i < sampling.size(); ++i) inputs.push_back(make_device_row(sampling[i]->sampler, V, rows[i], {}));
    for (const DeviceRow& d : inputs) params.push_back(d.view());
    EXL_CHECK(model_.sample_device_deferred(params), "engine: generator: the backend cannot sample deferred");
  } catch (const std::exception& e) {
    for (Active* a : sampling) finish(*a, FinishReason::error, generator_failure_text(e));
    return true;
  }
  deferred_.assign(sampling.begin(), sampling.end());
  // The next step, fed by these samples: each job's next position, pages reserved for it.
  std::vector<ForwardSeq> batch;
  const int32_t placeholder = 0;
  for (Active* a : deferred_) {
    if (!cache_->reserve(a->seq, a->n_done + 1)) return true;  // collected and run as usual next step
    batch.push_back({std::span<const int32_t>(&placeholder, 1), a->n_done, {}, false});
  }
  for (size_t i = 0; i < batch.size(); ++i) batch[i].page_table = cache_->page_table(deferred_[i]->seq);
  try {
    model_.forward_device_fed(batch, *pool_);
    fed_ = deferred_;
  } catch (const std::exception&) {
    collect_deferred();  // the samples stand; the next step runs (and reports) the forward as usual
  }
  return true;
}

void Generator::collect_deferred() {
  if (deferred_.empty()) return;
  std::vector<Active*> jobs;
  jobs.swap(deferred_);
  std::vector<int32_t> ids(jobs.size());
  try {
    model_.collect_samples(ids);
  } catch (const std::exception& e) {
    for (Active* a : jobs) finish(*a, FinishReason::error, generator_failure_text(e));
    fed_.clear();
    return;
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    try {
      emit_sampled(*jobs[i], checked_sampled_token(ids[i], model_.vocab_size()));
    } catch (const std::exception& e) {
      finish(*jobs[i], FinishReason::error, generator_failure_text(e));
    }
  }
}

// The queued fed step, for the jobs that took the token it was fed (the others ended: their
// rows are discarded). Returns false when there is none.
bool Generator::step_fed() {
  if (fed_.empty()) return false;
  std::vector<Active*> jobs;
  std::vector<int64_t> rows;
  for (size_t i = 0; i < fed_.size(); ++i) {
    Active& a = *fed_[i];
    if (a.finished || int64_t(a.tokens.size()) != a.n_done + 1) continue;
    cache_->append_tokens(a.seq, std::span<const int32_t>(a.tokens).subspan(size_t(a.n_done), 1));
    ++a.n_done;
    ++a.stats.n_decode_passes;
    jobs.push_back(&a);
    rows.push_back(int64_t(i));
  }
  fed_.clear();
  if (jobs.empty()) return false;
  if (!sample_deferred_and_feed(jobs, rows)) sample_on_device(jobs, rows);
  return true;
}

void Generator::admit() {
  std::vector<std::pair<uint64_t, GenerationJob>> fresh;
  std::vector<uint64_t> cancels, unpins;
  {
    std::lock_guard lk(mu_);
    unpins.swap(unpins_);
    while (!queue_.empty() && int(active_.size() + fresh.size()) < opts_.max_batch_seqs) {
      fresh.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    cancels.swap(cancelled_);
  }
  for (uint64_t u : unpins)
    std::erase_if(pins_, [&](const auto& p) {
      if (p.first != u) return false;
      cache_->release(p.second);
      return true;
    });
  for (auto& [id, job] : fresh) {
    auto submitted = Clock::now();
    std::unique_ptr<Active> a;
    try {
      EXL_CHECK(!job.prompt.empty(), "engine: generator: job ", id, " has an empty prompt");
      for (int32_t t : job.prompt)
        EXL_CHECK(t >= 0 && t < model_.vocab_size(), "engine: generator: job ", id, ": prompt token ", t,
                  " out of range [0, ", model_.vocab_size(), ")");
      EXL_CHECK(job.max_new_tokens > 0, "engine: generator: job ", id, ": max_new_tokens must be positive");
      validate(job.sampling, model_.vocab_size());
      a = std::make_unique<Active>(id, std::move(job), tok_);
    } catch (const std::exception& e) {
      GenerationEvent ev;
      ev.type = GenerationEvent::Type::done;
      ev.job = id;
      ev.reason = FinishReason::error;
      ev.error = generator_failure_text(e);
      if (job.on_event) job.on_event(ev);
      continue;
    }
    a->submitted = submitted;
    if (!a->job.speculate) a->job.speculate = opts_.speculate;
    // auto leaves alone the jobs that pipelined decoding serves (no mask hook, device sampling):
    // drafting would give that up for little (H200, demo model: slower at every concurrency).
    if (a->job.speculate == Speculation::auto_ && pipelined_ && !a->job.mask) a->job.speculate = Speculation::none;
    if (a->job.speculate == Speculation::draft && !draft_) {
      a->finished = true;
      GenerationEvent ev;
      ev.type = GenerationEvent::Type::done;
      ev.job = id;
      ev.reason = FinishReason::error;
      ev.error = cat("engine: generator: job ", id, ": speculate 'draft' needs a draft model, and none is loaded");
      if (a->job.on_event) a->job.on_event(ev);
      continue;
    }
    if (draft_ && a->speculates() && a->job.speculate != Speculation::ngram) a->draft_slot = draft_->open();
    a->tokens = a->job.prompt;
    a->sampler.accept(a->job.prompt);
    a->seq = cache_->create_sequence();
    a->n_done = cache_->match_prefix(a->seq, a->job.prompt);
    a->stats.n_prompt_tokens = int64_t(a->job.prompt.size());
    a->stats.n_cached_tokens = a->n_done;
    active_.push_back(std::move(a));
  }
  for (uint64_t c : cancels)
    for (auto& a : active_)
      if (a->id == c) finish(*a, FinishReason::cancelled);
}

bool Generator::step() {
  StepProfile::Scope whole(prof_, "step (all)");
  {
    StepProfile::Scope t(prof_, "collect deferred");
    collect_deferred();
  }
  {
    StepProfile::Scope t(prof_, "admit");
    admit();
  }
  bool fed;
  {
    StepProfile::Scope t(prof_, "fed step");
    fed = step_fed();
  }
  std::erase_if(active_, [](const auto& a) { return a->finished; });
  if (fed) return true;
  if (active_.empty()) return false;

  // Decodes first (one token each), then prefill chunks within the token budget.
  struct Planned {
    Active* a;
    int64_t n;
  };
  std::vector<Planned> plan;
  int64_t budget = opts_.max_step_tokens;
  const auto decoding = std::count_if(active_.begin(), active_.end(), [](const auto& a) { return !a->prefilling(); });
  const bool auto_drafts = decoding <= opts_.speculate_max_seqs;
  std::vector<Active*> model_drafting;
  std::vector<int64_t> model_rooms;
  std::vector<size_t> model_plan;
  for (auto& a : active_)
    if (!a->prefilling() && budget > 0) {
      const int64_t pending = int64_t(a->tokens.size()) - a->n_done;
      int64_t n = std::min<int64_t>(budget, pending);
      a->draft.clear();
      if (n == pending && a->speculates() && (auto_drafts || a->job.speculate != Speculation::auto_)) {
        const int64_t room = std::min<int64_t>(budget - n, int64_t(a->job.max_new_tokens) - a->stats.n_generated - 1);
        if (a->draft_slot) {  // drafted below, with the model, in one batch; its room reserved meanwhile
          model_drafting.push_back(a.get());
          model_rooms.push_back(std::min<int64_t>(room, k_max_model_draft));
          model_plan.push_back(plan.size());
          n += model_rooms.back();
        } else {
          StepProfile::Scope t(prof_, "draft (lookup)");
          build_draft(*a, room);
          n += int64_t(a->draft.size());
        }
      }
      plan.push_back({a.get(), n});
      budget -= n;
    }
  if (!model_drafting.empty()) {
    StepProfile::Scope t(prof_, "draft (model)");
    build_model_drafts(model_drafting, model_rooms);
    for (size_t i = 0; i < model_drafting.size(); ++i) {
      const int64_t unused = model_rooms[i] - int64_t(model_drafting[i]->draft.size());
      plan[model_plan[i]].n -= unused;
      budget += unused;
    }
  }
  for (auto& a : active_)
    if (a->prefilling() && budget > 0) {
      const int64_t n = std::min<int64_t>(budget, int64_t(a->job.prompt.size()) - a->n_done);
      plan.push_back({a.get(), n});
      budget -= n;
    }
  // Reserve cache pages; a job that cannot get pages waits, unless nothing else can run.
  std::vector<Planned> ready;
  for (auto& p : plan) {
    bool ok = cache_->reserve(p.a->seq, p.a->n_done + p.n);
    if (!ok && !p.a->draft.empty()) {  // speculate another time rather than wait for pages
      p.n -= int64_t(p.a->draft.size());
      p.a->draft.clear();
      ok = cache_->reserve(p.a->seq, p.a->n_done + p.n);
    }
    while (!ok && release_oldest_pin()) ok = cache_->reserve(p.a->seq, p.a->n_done + p.n);
    if (ok) ready.push_back(p);
  }
  if (ready.empty()) {
    // Every job waits for pages. The youngest job holding pages, unless it is the oldest job,
    // gives them back and starts over from its tokens later (what it emitted stays emitted), so
    // the older ones go on; when only the oldest holds pages it does not fit the cache alone.
    Active* oldest = plan.front().a;
    for (auto& p : plan)
      if (p.a->id < oldest->id) oldest = p.a;
    Active* victim = nullptr;
    for (auto& p : plan)
      if (p.a != oldest && !cache_->page_table(p.a->seq).empty() && (!victim || p.a->id > victim->id)) victim = p.a;
    if (victim) {
      cache_->release(victim->seq);
      victim->seq = cache_->create_sequence();
      victim->n_done = 0;
      ++n_preempted_;
      return true;
    }
    finish(*oldest, FinishReason::error,
           cat("engine: generator: out of KV cache pages (", opts_.num_pages, " pages of ", opts_.page_size,
               " tokens); raise the cache budget"));
    return true;
  }

  std::vector<ForwardSeq> batch;
  bool speculating = false;
  for (auto& p : ready) {
    ForwardSeq s;
    s.tokens = std::span<const int32_t>(p.a->tokens).subspan(size_t(p.a->n_done), size_t(p.n));
    if (!p.a->draft.empty()) {
      p.a->feed.assign(p.a->tokens.begin() + p.a->n_done, p.a->tokens.end());
      p.a->feed.insert(p.a->feed.end(), p.a->draft.begin(), p.a->draft.end());
      s.tokens = p.a->feed;
      s.all_logits = true;
      speculating = true;
    }
    s.pos_start = p.a->n_done;
    s.page_table = cache_->page_table(p.a->seq);
    batch.push_back(s);
  }
  // The jobs whose last prompt or pending token is in this step sample from its logits.
  std::vector<Active*> sampling;
  std::vector<int64_t> sample_rows;
  for (size_t i = 0; i < ready.size(); ++i)
    if (!ready[i].a->finished && ready[i].a->n_done + ready[i].n == int64_t(ready[i].a->tokens.size())) {
      sampling.push_back(ready[i].a);
      sample_rows.push_back(int64_t(i));
    }
  const bool on_device = !speculating && use_device_sampling(sampling);
  bool verify_on_device = speculating && device_sampler_ && (sampling.empty() || use_device_sampling(sampling));
  for (const Planned& p : ready)
    if (!p.a->draft.empty() && !verifies_on_device(*p.a)) verify_on_device = false;
  std::vector<float> logits;
  const bool prefill = std::any_of(ready.begin(), ready.end(), [](const Planned& p) { return p.a->prefilling(); });
  try {
    StepProfile::Scope t(prof_, verify_on_device ? (prefill ? "forward_device: verify + prefill" : "forward_device: verify")
                                : speculating ? (prefill ? "forward: verify + prefill" : "forward: verify")
                                : on_device   ? (prefill ? "forward_device: prefill" : "forward_device: decode")
                                              : (prefill ? "forward: prefill" : "forward: decode"));
    if (on_device || verify_on_device) model_.forward_device(batch, *pool_);
    else logits = model_.forward(batch, *pool_);
  } catch (const std::exception& e) {
    for (auto& p : ready) finish(*p.a, FinishReason::error, generator_failure_text(e));
    return true;
  }
  const int64_t V = model_.vocab_size();
  std::vector<uint32_t> mask;
  int64_t next_row = 0;
  std::optional<StepProfile::Scope> host_sampling;
  host_sampling.emplace(prof_, "host sample / verify");
  std::vector<Active*> verifying, device_sampling;
  std::vector<int64_t> verify_rows, device_rows;
  for (size_t i = 0; i < ready.size(); ++i) {
    Active& a = *ready[i].a;
    const int64_t first_row = next_row;
    next_row += a.draft.empty() ? 1 : ready[i].n;
    if (!a.draft.empty()) {
      if (verify_on_device) {
        verifying.push_back(&a);
        verify_rows.push_back(first_row);
        continue;
      }
      if (!a.finished) verify_draft(a, logits, first_row, mask);
      a.draft.clear();
      continue;
    }
    cache_->append_tokens(a.seq, std::span<const int32_t>(a.tokens).subspan(size_t(a.n_done), size_t(ready[i].n)));
    a.n_done += ready[i].n;
    if (a.n_done < int64_t(a.tokens.size()) || a.finished) continue;
    ++a.stats.n_decode_passes;
    if (verify_on_device) {
      device_sampling.push_back(&a);
      device_rows.push_back(first_row);
      continue;
    }
    if (on_device) continue;
    std::span<float> row(logits.data() + first_row * V, size_t(V));
    try {
      sample_next(a, row, mask);
    } catch (const std::exception& e) {
      finish(a, FinishReason::error, generator_failure_text(e));
    }
  }
  host_sampling.reset();
  if (verify_on_device) {
    StepProfile::Scope t(prof_, "device sample / verify");
    sample_on_device(device_sampling, device_rows, verifying, verify_rows);
  }
  if (on_device) {
    StepProfile::Scope t(prof_, "device sample");
    if (!sample_deferred_and_feed(sampling, sample_rows)) sample_on_device(sampling, sample_rows);
  }
  std::erase_if(active_, [](const auto& a) { return a->finished; });
  return true;
}

void Generator::warm_up(int64_t max_prefill) {
  const int64_t capacity = int64_t(opts_.num_pages) * opts_.page_size;
  const int64_t longest = std::min<int64_t>({max_prefill, opts_.max_step_tokens, capacity - 1});
  if (longest < 1) return;
  // Verify passes: contexts from the largest bucket down (buffers that grow do so first, and a
  // growth would drop the graphs recorded before it).
  const int64_t verify_rows = device_sampler_ ? std::min<int64_t>(k_warm_verify_rows, opts_.max_step_tokens) : 0;
  const int64_t max_ctx = model_.config().max_position_embeddings > 0
                              ? std::min(k_warm_verify_max_context, model_.config().max_position_embeddings)
                              : k_warm_verify_max_context;
  std::vector<int64_t> contexts;
  if (verify_rows >= 2)
    for (int64_t c = k_warm_verify_max_context; c >= k_warm_verify_min_context; c /= 2)
      if (c <= std::min(capacity, max_ctx)) contexts.push_back(c);
  const int64_t need = std::max(longest + 1, contexts.empty() ? int64_t(0) : contexts.front());
  std::vector<int32_t> toks(static_cast<size_t>(need));
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t(int64_t(i) % model_.vocab_size());
  const SeqId seq = cache_->create_sequence();
  try {
    if (cache_->reserve(seq, int(need))) {
      const auto table = cache_->page_table(seq);
      int64_t done = 0;
      for (int64_t n : {int64_t(16), int64_t(64), int64_t(128), int64_t(256), int64_t(512), longest}) {
        if (n > longest) continue;
        const ForwardSeq f{std::span<const int32_t>(toks).first(size_t(n)), 0, table, false};
        model_.forward(std::span(&f, 1), *pool_);
        done = n;
      }
      const ForwardSeq d{std::span<const int32_t>(toks).subspan(size_t(done), 1), done, table, false};
      if (device_sampler_) {
        RowSampling greedy;
        greedy.temperature = 0.0f;
        int32_t id = 0;
        model_.forward_device(std::span(&d, 1), *pool_);
        model_.sample_device(std::span(&greedy, 1), std::span(&id, 1));
      } else {
        model_.forward(std::span(&d, 1), *pool_);
      }
      if (!contexts.empty()) warm_up_verify(toks, table, contexts, verify_rows);
    }
  } catch (...) {
    cache_->release(seq);
    throw;
  }
  cache_->release(seq);
}

void Generator::warm_up_verify(std::span<const int32_t> toks, std::span<const int32_t> table,
                               std::span<const int64_t> contexts, int64_t rows) {
  auto pass = [&](int64_t end, int64_t n, bool all_logits = true) {
    const ForwardSeq f{toks.subspan(size_t(end - n), size_t(n)), end - n, table, all_logits};
    model_.forward_device(std::span(&f, 1), *pool_);
  };
  // A pass of twice as many positions grows the logits rows for the occasional longer draft;
  // then rows of it sampled as a grammar job's verify pass is (a mask per row).
  pass(contexts.front(), std::min<int64_t>({2 * rows, opts_.max_step_tokens, contexts.front()}));
  const std::vector<uint32_t> all(mask_words(size_t(model_.vocab_size())), ~0u);
  std::vector<RowSampling> params(static_cast<size_t>(rows));
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].row = int64_t(i);
    params[i].temperature = 0.0f;
    params[i].mask = all;
  }
  std::vector<int32_t> ids(params.size());
  model_.sample_device(params, ids);
  // Each shape once, recorded at once; a pass of forced tokens alone (a key, punctuation) wants
  // the last row's logits only and is short.
  struct Recording {
    Model& m;
    explicit Recording(Model& model) : m(model) { m.record_steps_at_once(true); }
    ~Recording() { m.record_steps_at_once(false); }
  } recording(model_);
  for (int64_t c : contexts)
    for (int64_t n = 2; n <= rows; ++n) {
      pass(c, n);
      if (n <= k_warm_forced_rows) pass(c, n, false);
    }
  model_.sample_device(std::span(params).first(1), std::span(ids).first(1));
}

void Generator::run_until_idle() {
  for (;;) {
    if (step()) continue;
    std::lock_guard lk(mu_);
    if (queue_.empty()) return;
  }
}

void Generator::start() {
  if (running_.exchange(true)) return;
  thread_ = std::thread([this] {
    while (running_) {
      if (step()) continue;
      std::unique_lock lk(mu_);
      cv_.wait_for(lk, std::chrono::milliseconds(50),
                   [&] { return !running_ || !queue_.empty() || !cancelled_.empty() || !unpins_.empty(); });
    }
  });
}

void Generator::stop() {
  if (!running_.exchange(false)) return;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace exl
