#include "runtime/server_state.h"

#include <algorithm>
#include <ctime>
#include <filesystem>

#include "engine/memory_plan.h"
#include "kernels/error.h"
#include "runtime/backend_select.h"
#include "runtime/session_hub.h"

namespace exl {

bool is_loopback_host(std::string_view h) {
  return h == "localhost" || h == "::1" || h == "[::1]" || h.substr(0, 4) == "127.";
}

ServerState::ServerState(ServerOptions options, std::unique_ptr<Backend> backend)
    : opts_(std::move(options)), backend_(std::move(backend)) {
  EXL_CHECK(opts_.max_sessions > 0, "runtime: serve: --max-sessions must be positive");
  EXL_CHECK(opts_.cache_pages >= 0, "runtime: serve: --cache-pages must be positive (0: fit the free memory)");
  EXL_CHECK(opts_.page_size > 0, "runtime: serve: page size must be positive");
  EXL_CHECK(opts_.max_prompt_tokens >= 0, "runtime: serve: --max-prompt-tokens must be positive (0: the context)");
  EXL_CHECK(opts_.max_prompt_bytes > 0, "runtime: serve: --max-prompt-bytes must be positive");
  EXL_CHECK(opts_.read_timeout.count() > 0, "runtime: serve: the read timeout must be positive");
  EXL_CHECK(opts_.ws_message_timeout.count() > 0, "runtime: serve: the WebSocket message timeout must be positive");
  dir_ = std::make_unique<ModelDir>(opts_.model_dir);
  std::filesystem::path p = std::filesystem::absolute(opts_.model_dir).lexically_normal();
  model_id_ = p.has_filename() ? p.filename().string() : p.parent_path().filename().string();
  created_ = int64_t(std::time(nullptr));
  tok_ = load_tokenizer(dir_->path());
  TemplateTokens tt;
  if (tok_->bos_id()) tt.bos = tok_->token_bytes(*tok_->bos_id());
  if (!tok_->eos_ids().empty()) tt.eos = tok_->token_bytes(*tok_->eos_ids().begin());
  tmpl_ = make_chat_template(choose_template(dir_->path(), opts_.chat_template), tt);
  if (!backend_) backend_ = make_backend(opts_.backend, opts_.cpu_threads);
  GeneratorOptions go;
  go.cache_format = default_cache_format(opts_.backend);
  go.page_size = opts_.page_size;
  go.max_batch_seqs = opts_.max_batch_seqs;
  MemoryRequest req{go.cache_format, go.page_size, opts_.cache_pages, go.max_batch_seqs, go.max_step_tokens};
  MemoryPlan plan;
  model_ = load_planned_model(*dir_, *backend_, req, plan);
  go.num_pages = plan.cache_pages;
  gen_ = std::make_unique<Generator>(*model_, *tok_, go);
  hub_ = std::make_unique<SessionHub>(*this, opts_.session_dir, opts_.max_sessions, opts_.read_root,
                                      TranscriptRetention{opts_.session_retain_files, opts_.session_retain_bytes});
}

ServerState::~ServerState() {
  if (gen_) gen_->stop();  // no generator callbacks into sessions while they go
  hub_.reset();
}

int64_t ServerState::context_length() const {
  const int64_t cache = int64_t(gen_->options().num_pages) * opts_.page_size;
  const int64_t n = model_->config().max_position_embeddings;
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
  return tokenize_prompt(*tok_, prompt);
}

std::vector<int32_t> ServerState::encode_raw_prompt(const std::string& text) const {
  std::vector<int32_t> ids = tok_->encode(text, true);
  if (ids.size() >= 2 && tok_->bos_id() && ids[0] == *tok_->bos_id() && ids[1] == *tok_->bos_id())
    ids.erase(ids.begin());
  return ids;
}

}  // namespace exl
