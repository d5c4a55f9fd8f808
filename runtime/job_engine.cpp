#include "runtime/job_engine.h"

#include <algorithm>

#include "engine/generate/grammar_constraint.h"
#include "grammar/json_schema.h"
#include "kernels/error.h"

namespace exl {

namespace {

JsonSchemaOptions job_schema_options() {
  JsonSchemaOptions o;
  o.whitespace = JsonSchemaOptions::Whitespace::spaced;
  return o;
}

}  // namespace

std::function<std::shared_ptr<LogitsMaskHook>()> schema_hook_factory(const nlohmann::ordered_json& schema,
                                                                     const Tokenizer& tokenizer) {
  auto grammar = cached_json_schema_for(schema, tokenizer, job_schema_options());
  return [grammar, &tokenizer] { return make_grammar_constraint(grammar, tokenizer); };
}

JobEngine::JobEngine(JobEngineOptions options) : opts_(std::move(options)) {
  EXL_CHECK(opts_.max_batch_seqs > 0, "runtime: job: the number of jobs in flight must be positive");
  EXL_CHECK(opts_.max_context > 0, "runtime: job: the context length must be positive");
  host_ = std::make_unique<ModelHost>(
      ModelHostOptions{opts_.model_dir, opts_.backend, opts_.cpu_threads, std::nullopt, true, opts_.chat_template,
                       opts_.draft_model, opts_.gpu_split, opts_.tensor_parallel});
  const int64_t model_ctx = host_->max_position_embeddings();
  ctx_ = model_ctx > 0 ? std::min(model_ctx, opts_.max_context) : opts_.max_context;
  GeneratorOptions go;
  go.page_size = 64;
  go.max_batch_seqs = opts_.max_batch_seqs;
  go.speculate = opts_.speculate;
  // On a GPU a pass of a few positions per job costs about one's: grammar jobs gained at every
  // concurrency on the H200 (BENCHMARKS.md session 17).
  if (opts_.backend == "cuda") go.speculate_max_seqs = go.max_batch_seqs;
  go.num_pages = int(int64_t(opts_.max_batch_seqs) * ((ctx_ + go.page_size - 1) / go.page_size) + 1);
  gen_ = host_->load_generator(go, ctx_);
}

JobEngine::~JobEngine() = default;

void JobEngine::check_schema(const nlohmann::ordered_json& schema) { schema_grammar(schema); }

std::shared_ptr<const CompiledGrammar> JobEngine::schema_grammar(const nlohmann::ordered_json& schema) {
  const std::string key = schema.dump();
  if (auto it = schema_errors_.find(key); it != schema_errors_.end()) fail(it->second);
  std::string err;
  try {
    EXL_CHECK(schema.is_object() || schema.is_boolean(), "the schema must be a JSON object");
    return cached_json_schema_for(schema, host_->tokenizer(), job_schema_options());
  } catch (const GrammarCancelled&) {
    throw;
  } catch (const std::exception& e) {  // exl::Error (grammar errors too), and whatever else compiling throws
    err = cat("runtime: job: schema: ", e.what());
  }
  schema_errors_[key] = err;
  fail(err);
}

std::vector<int32_t> JobEngine::encode_prompt(const RenderedPrompt& prompt) const {
  return host_->encode_prompt(prompt);
}

GenerationJob JobEngine::build_job(const ChatJobSpec& spec) {
  EXL_CHECK(!spec.messages.empty(), "runtime: job: the conversation has no messages");
  GenerationJob job;
  if (spec.schema) job.mask = make_grammar_constraint(schema_grammar(*spec.schema), host_->tokenizer());
  job.prompt = encode_prompt(host_->chat_template()->render(spec.messages, spec.tools, true));
  const int64_t n_prompt = int64_t(job.prompt.size());
  EXL_CHECK(n_prompt < ctx_, "runtime: job: the prompt has ", n_prompt, " tokens; the context holds ", ctx_);
  const int64_t room = ctx_ - n_prompt;
  if (spec.max_tokens) {
    EXL_CHECK(*spec.max_tokens > 0, "runtime: job: max_tokens must be positive, got ", *spec.max_tokens);
    EXL_CHECK(*spec.max_tokens <= room, "runtime: job: the prompt has ", n_prompt, " tokens and max_tokens asks for ",
              *spec.max_tokens, "; the context holds ", ctx_);
  }
  job.max_new_tokens = int32_t(spec.max_tokens.value_or(room));
  job.sampling = spec.sampling;
  job.stop_tokens.assign(host_->tokenizer().eos_ids().begin(), host_->tokenizer().eos_ids().end());
  job.stop_strings = spec.stop;
  for (const auto& s : host_->chat_template()->stop_strings())
    if (!s.empty()) job.stop_strings.push_back(s);
  return job;
}

namespace {

JobOutcome finish_outcome(JobOutcome o, bool has_schema, int64_t max_tokens) {
  if (o.reason == FinishReason::error) {
    o.ok = false;
    return o;
  }
  if (o.reason == FinishReason::cancelled) {
    o.error = "runtime: job: cancelled";
    return o;
  }
  if (!has_schema) {
    o.ok = true;
    return o;
  }
  if (o.reason == FinishReason::max_tokens) {
    o.error = cat("runtime: job: the reply was cut off at max_tokens (", max_tokens,
                  ") before its JSON was complete; raise max_tokens. It began: '", o.text.substr(0, 120), "'");
    return o;
  }
  try {
    o.json = nlohmann::ordered_json::parse(o.text);
    o.ok = true;
  } catch (const nlohmann::json::exception&) {
    o.error = cat("runtime: job: the reply is not valid JSON: '", o.text.substr(0, 200),
                  o.text.size() > 200 ? "...'" : "'");
  }
  return o;
}

}  // namespace

PreparedJob JobEngine::prepare(const ChatJobSpec& spec) {
  PreparedJob p;
  p.has_schema = spec.schema.has_value();
  try {
    p.job = build_job(spec);
  } catch (const std::exception& e) {
    p.error = e.what();
  }
  return p;
}

void JobEngine::submit(ChatJobSpec spec, std::function<void(JobOutcome)> done) {
  submit(prepare(spec), std::move(done));
}

void JobEngine::submit(PreparedJob prepared, std::function<void(JobOutcome)> done) {
  if (prepared.error) {
    JobOutcome o;
    o.reason = FinishReason::error;
    o.rejected = true;
    o.error = std::move(*prepared.error);
    failed_.emplace_back(std::move(done), std::move(o));
    ++in_flight_;
    return;
  }
  GenerationJob job = std::move(prepared.job);
  auto acc = std::make_shared<JobOutcome>();
  const bool has_schema = prepared.has_schema;
  const int64_t max_tokens = job.max_new_tokens;
  auto job_id = std::make_shared<uint64_t>(0);
  job.on_event = [this, acc, job_id, has_schema, max_tokens, done = std::move(done)](const GenerationEvent& e) {
    if (e.type == GenerationEvent::Type::token) {
      acc->text += e.text;
      return;
    }
    acc->reason = e.reason;
    acc->error = e.error;
    acc->stats = e.stats;
    generating_.erase(*job_id);
    --in_flight_;
    done(finish_outcome(std::move(*acc), has_schema, max_tokens));
  };
  ++in_flight_;
  *job_id = gen_->submit(std::move(job));
  generating_.insert(*job_id);
}

void JobEngine::cancel_all() {
  for (const uint64_t id : generating_) gen_->cancel(id);
}

bool JobEngine::step() {
  bool did = false;
  while (!failed_.empty()) {
    auto [done, o] = std::move(failed_.front());
    failed_.erase(failed_.begin());
    --in_flight_;
    done(std::move(o));
    did = true;
  }
  return gen_->step() || did;
}

void JobEngine::run_until_idle() {
  while (in_flight_ > 0)
    EXL_CHECK(step(), "runtime: job: internal: ", in_flight_, " jobs in flight but the generator is idle");
}

}  // namespace exl
