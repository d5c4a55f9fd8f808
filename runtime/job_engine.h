// What the job commands (extract, batch, run) share: one model directory loaded with its
// tokenizer, chat template and a continuous-batching Generator, and chat jobs submitted to it —
// messages rendered by the chat template, optionally constrained by a JSON Schema, collected
// into one JobOutcome per job. Jobs run when the caller steps the engine (step / run_until_idle),
// and outcome callbacks run on that thread, so the job commands need no locking.
// Not thread-safe: one thread owns a JobEngine.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/generate/generator.h"
#include "engine/tokenizer/tokenizer.h"
#include "grammar/matcher.h"
#include "runtime/model_host.h"
#include "sessions/chat_template.h"

namespace exl {

struct JobEngineOptions {
  std::string model_dir;
  std::string backend = "cpu";
  std::string gpu_split;         // a layer split (ModelHostOptions::gpu_split); empty = one device
  int tensor_parallel = 0;       // ranks (ModelHostOptions::tensor_parallel); 0 or 1 = off
  int cpu_threads = 0;           // 0 = all
  int max_batch_seqs = 16;       // jobs decoding at once
  Speculation speculate = Speculation::auto_;  // engine/generate/speculation.h
  int64_t max_context = 4096;    // tokens one job may hold (capped by the model's context)
  std::string chat_template;     // override name; empty = detect
  std::string draft_model;       // a draft model directory (ModelHostOptions::draft_model_dir); empty = none
};

struct ChatJobSpec {
  std::vector<ChatMessage> messages;
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // OpenAI tool objects, rendered
  std::optional<nlohmann::ordered_json> schema;  // reply must be JSON valid under it
  std::optional<int64_t> max_tokens;             // default: the rest of the context
  SamplerSettings sampling;
  std::vector<std::string> stop;
};

struct JobOutcome {
  bool ok = false;
  bool rejected = false;             // failed before generating: the spec itself is bad
  std::string error;                 // when !ok: why (names the layer and the cause)
  std::string text;                  // the reply text
  nlohmann::ordered_json json;       // the parsed reply when the job had a schema
  FinishReason reason = FinishReason::max_tokens;
  GenerationStats stats;
};

// A factory of fresh per-job mask hooks (engine/generate/grammar_constraint.h) that constrain output to the
// JSON texts `schema` validates, properties in schema order, with optional whitespace between
// tokens: models trained on json.dumps output (the demo model) write ", " and ": ", and forcing
// compact JSON on them wrecks their values (measured: 0 of 5 demo examples right compact, 5 of 5
// flexible). The cost: a weak model can emit whitespace until max_tokens, which is reported as a
// cut-off reply. The schema is compiled for the vocabulary once (the process-wide compiled-grammar
// cache, grammar/grammar_cache.h).
// Throws GrammarError / exl::Error for a schema the grammar engine cannot compile. The tokenizer
// must outlive the factory and its hooks.
std::function<std::shared_ptr<LogitsMaskHook>()> schema_hook_factory(const nlohmann::ordered_json& schema,
                                                                     const Tokenizer& tokenizer);

// A chat job built from its spec (rendered prompt tokens, grammar matcher, stops), or why it
// cannot run; JobEngine::prepare makes it, JobEngine::submit queues it.
struct PreparedJob {
  GenerationJob job;
  bool has_schema = false;
  std::optional<std::string> error;  // set: the spec is bad; submit delivers it as a rejected outcome
};

class JobEngine {
 public:
  // Loads the model; throws exl::Error naming what failed.
  explicit JobEngine(JobEngineOptions options);
  ~JobEngine();

  const Tokenizer& tokenizer() const { return host_->tokenizer(); }
  std::shared_ptr<const ChatTemplate> chat_template() const { return host_->chat_template(); }
  const std::string& model_id() const { return host_->model_id(); }
  int64_t context_length() const { return ctx_; }
  // The generator, for callers that run it on its own thread (start/stop) between job batches;
  // no job of this engine may be in flight meanwhile.
  Generator& generator() { return *gen_; }
  // A rendered conversation -> prompt tokens (tokenize_prompt: special tokens only from the
  // template's markup, BOS once).
  std::vector<int32_t> encode_prompt(const RenderedPrompt& prompt) const;

  // Throws exl::Error ("runtime: job: schema: ...") when the schema cannot be compiled.
  void check_schema(const nlohmann::ordered_json& schema);
  // Queues a job; `done` gets its outcome (also for jobs that fail before generating: a prompt
  // too long for the context, a bad schema) during a later step. Never throws for a bad spec.
  void submit(ChatJobSpec spec, std::function<void(JobOutcome)> done);
  // submit() in two halves, so that a caller can build the next job while the generator runs.
  // prepare() never throws for a bad spec; it reads only the loaded tokenizer and chat template
  // and the process-wide grammar cache besides the engine's record of failed schemas, so it may
  // run on another thread while the owner steps or submits, but not beside another prepare()
  // or check_schema().
  PreparedJob prepare(const ChatJobSpec& spec);
  void submit(PreparedJob prepared, std::function<void(JobOutcome)> done);
  // One scheduling step (delivers outcomes of jobs that failed before generating); false when idle.
  bool step();
  void run_until_idle();
  // Cancels every job in flight: each ends with the error "runtime: job: cancelled" during a
  // later step (at once for one still queued). Same thread as step().
  void cancel_all();
  int64_t in_flight() const { return in_flight_; }

 private:
  GenerationJob build_job(const ChatJobSpec& spec);
  // The schema's grammar (compiled once per vocabulary); throws as check_schema.
  std::shared_ptr<const CompiledGrammar> schema_grammar(const nlohmann::ordered_json& schema);

  JobEngineOptions opts_;
  std::unique_ptr<ModelHost> host_;
  std::unique_ptr<Generator> gen_;  // after host_: destroyed first
  int64_t ctx_ = 0;
  int64_t in_flight_ = 0;
  std::set<uint64_t> generating_;  // generator job ids of the jobs in flight
  // Schemas that failed to compile (by schema text): later jobs with one fail at once. Compiled
  // grammars live in the process-wide cache (grammar/grammar_cache.h).
  std::map<std::string, std::string> schema_errors_;
  std::vector<std::pair<std::function<void(JobOutcome)>, JobOutcome>> failed_;  // delivered by step()
};

}  // namespace exl
