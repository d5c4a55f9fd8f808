#include "runtime/server/server_state.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <iostream>

#include "kernels/error.h"
#include "runtime/server/session_hub.h"

namespace exl {

bool is_loopback_host(std::string_view h) {
  return h == "localhost" || h == "::1" || h == "[::1]" || h.substr(0, 4) == "127.";
}

ServerState::ServerState(ServerOptions options, std::unique_ptr<Backend> backend) : opts_(std::move(options)) {
  EXL_CHECK(opts_.max_sessions > 0, "runtime: serve: --max-sessions must be positive");
  EXL_CHECK(opts_.cache_pages >= 0, "runtime: serve: --cache-pages must be positive (0: fit the free memory)");
  EXL_CHECK(opts_.page_size > 0, "runtime: serve: page size must be positive");
  EXL_CHECK(opts_.max_prompt_tokens >= 0, "runtime: serve: --max-prompt-tokens must be positive (0: the context)");
  EXL_CHECK(opts_.max_prompt_bytes > 0, "runtime: serve: --max-prompt-bytes must be positive");
  EXL_CHECK(opts_.read_timeout.count() > 0, "runtime: serve: the read timeout must be positive");
  EXL_CHECK(opts_.ws_message_timeout.count() > 0, "runtime: serve: the WebSocket message timeout must be positive");
  created_ = int64_t(std::time(nullptr));
  host_ = std::make_unique<ModelHost>(
      ModelHostOptions{opts_.model_dir, opts_.backend, opts_.cpu_threads, std::nullopt, true, opts_.chat_template,
                       opts_.draft_model, opts_.gpu_split, opts_.tensor_parallel},
      std::move(backend));
  GeneratorOptions go;
  go.page_size = opts_.page_size;
  go.num_pages = opts_.cache_pages;
  go.max_batch_seqs = opts_.max_batch_seqs;
  go.speculate = opts_.speculate;
  // On a GPU a pass of a few positions per job costs about one's: grammar jobs gained at every
  // concurrency on the H200 (BENCHMARKS.md session 17).
  if (opts_.backend == "cuda") go.speculate_max_seqs = go.max_batch_seqs;
  gen_ = host_->load_generator(go);
  AgentEnv model;
  model.generator = gen_.get();
  model.tokenizer = &host_->tokenizer();
  model.chat_template = host_->chat_template();
  model.encode_prompt = [host = host_.get()](const RenderedPrompt& p) { return host->encode_prompt(p); };
  model.context_length = context_length();
  model.max_prompt_tokens = max_prompt_tokens();
  model.max_prompt_bytes = opts_.max_prompt_bytes;
  hub_ = std::make_unique<SessionHub>(std::move(model), opts_.grammar_budget, opts_.session_dir, opts_.max_sessions, opts_.read_root,
                                      TranscriptRetention{opts_.session_retain_files, opts_.session_retain_bytes});
  for (const auto& m : opts_.mcp_servers)
    for (const auto& note : hub_->add_mcp_server(m)) std::cerr << "exlagent: warning: " << note << "\n";
  for (const auto& m : opts_.session_mcp_servers) hub_->add_session_mcp_server(m);
}

ServerState::~ServerState() {
  if (gen_) gen_->stop();  // no generator callbacks into sessions while they go
  hub_.reset();
}

int64_t ServerState::context_length() const {
  const int64_t cache = int64_t(gen_->options().num_pages) * opts_.page_size;
  const int64_t n = host_->max_position_embeddings();
  return n > 0 ? std::min(n, cache) : cache;
}

int64_t ServerState::max_prompt_tokens() const {
  const int64_t ctx = context_length();
  return opts_.max_prompt_tokens > 0 ? std::min(opts_.max_prompt_tokens, ctx) : ctx;
}

std::shared_ptr<void> ServerState::admit_generation() {
  if (draining_) return nullptr;
  if (running_.fetch_add(1) >= opts_.max_sessions) {
    --running_;
    return nullptr;
  }
  return std::shared_ptr<void>(static_cast<void*>(this), [this](void*) { --running_; });
}

uint64_t ServerState::add_closer(std::function<void()> closer) {
  std::lock_guard lk(closers_mu_);
  const uint64_t id = next_closer_++;
  closers_[id] = std::move(closer);
  return id;
}

void ServerState::remove_closer(uint64_t id) {
  std::lock_guard lk(closers_mu_);
  closers_.erase(id);
}

void ServerState::close_connections() {
  std::vector<std::function<void()>> all;
  {
    std::lock_guard lk(closers_mu_);
    for (const auto& [id, f] : closers_) all.push_back(f);
  }
  for (auto& f : all) f();
}

size_t ServerState::open_closers() const {
  std::lock_guard lk(closers_mu_);
  return closers_.size();
}

std::vector<int32_t> ServerState::encode_prompt(const RenderedPrompt& prompt) const {
  return host_->encode_prompt(prompt);
}

std::vector<int32_t> ServerState::encode_raw_prompt(const std::string& text) const {
  const Tokenizer& tok = host_->tokenizer();
  std::vector<int32_t> ids = tok.encode(text, true);
  if (ids.size() >= 2 && tok.bos_id() && ids[0] == *tok.bos_id() && ids[1] == *tok.bos_id())
    ids.erase(ids.begin());
  return ids;
}

}  // namespace exl
