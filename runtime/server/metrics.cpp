#include "runtime/server/metrics.h"

#include "kernels/error.h"

namespace exl {

void Metrics::Histogram::observe(double v, uint64_t n) {
  for (size_t i = 0; i < bounds.size(); ++i)
    if (v <= bounds[i]) buckets[i] += n;
  count += n;
  sum += v * double(n);
}

void Metrics::Histogram::render(std::string& out, const char* name, const char* help) const {
  out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " histogram\n");
  for (size_t i = 0; i < bounds.size(); ++i) out += cat(name, "_bucket{le=\"", bounds[i], "\"} ", buckets[i], "\n");
  out += cat(name, "_bucket{le=\"+Inf\"} ", count, "\n", name, "_sum ", sum, "\n", name, "_count ", count, "\n");
}

void Metrics::count_request(std::string_view endpoint, int status) {
  std::lock_guard lk(mu_);
  ++requests_[{std::string(endpoint), status}];
}

void Metrics::observe_generation(const GenerationStats& s) {
  prompt_tokens_ += uint64_t(s.n_prompt_tokens);
  generated_tokens_ += uint64_t(s.n_generated);
  cached_tokens_ += uint64_t(s.n_cached_tokens);
  decode_passes_ += uint64_t(s.n_decode_passes);
  drafted_tokens_ += uint64_t(s.n_drafted);
  accepted_tokens_ += uint64_t(s.n_accepted);
  std::lock_guard lk(mu_);
  if (s.n_generated > 0) ttft_.observe(s.ttft_s);
  if (s.n_generated > 1) itl_.observe(s.decode_s / double(s.n_generated - 1), uint64_t(s.n_generated - 1));
}

void Metrics::observe_preparation(double seconds) {
  std::lock_guard lk(mu_);
  prep_.observe(seconds);
}

std::string Metrics::render(int64_t running_generations) const {
  std::string out;
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " counter\n", name, " ", v, "\n");
  };
  auto gauge = [&](const char* name, const char* help, int64_t v) {
    out += cat("# HELP ", name, " ", help, "\n# TYPE ", name, " gauge\n", name, " ", v, "\n");
  };
  std::lock_guard lk(mu_);
  out += "# HELP exlagent:requests_total HTTP requests by endpoint and status code.\n"
         "# TYPE exlagent:requests_total counter\n";
  for (const auto& [key, n] : requests_)
    out += cat("exlagent:requests_total{endpoint=\"", key.first, "\",code=\"", key.second, "\"} ", n, "\n");
  counter("exlagent:prompt_tokens_total", "Prompt tokens of finished generations.", prompt_tokens_);
  counter("exlagent:generation_tokens_total", "Generated tokens.", generated_tokens_);
  counter("exlagent:prefix_cache_hit_tokens_total", "Prompt tokens served from the prefix cache.", cached_tokens_);
  counter("exlagent:decode_passes_total", "Forward passes that gave a generation logits to sample from.", decode_passes_);
  counter("exlagent:spec_draft_tokens_total", "Tokens drafted by speculative decoding and checked.", drafted_tokens_);
  counter("exlagent:spec_accepted_tokens_total", "Drafted tokens emitted as drafted.", accepted_tokens_);
  ttft_.render(out, "exlagent:time_to_first_token_seconds", "Submit to first sampled token.");
  itl_.render(out, "exlagent:inter_token_latency_seconds", "Mean time between generated tokens, per token.");
  prep_.render(out, "exlagent:request_preparation_seconds",
               "Generation request read to job submitted (parsing, template, tokenization, grammar).");
  gauge("exlagent:requests_running", "Generations admitted and not finished (queued or running).", running_generations);
  gauge("exlagent:connections_open", "Open HTTP connections.", open_connections.load());
  return out;
}

}  // namespace exl
