#include "runtime/model_host.h"

#include <filesystem>

#include "engine/generate/draft_model.h"
#include "kernels/error.h"
#include "runtime/backend_select.h"

namespace exl {

ModelHost::ModelHost(const ModelHostOptions& options, std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {
  dir_ = std::make_unique<ModelDir>(options.model_dir);
  const std::filesystem::path p = std::filesystem::absolute(options.model_dir).lexically_normal();
  model_id_ = p.has_filename() ? p.filename().string() : p.parent_path().filename().string();
  tok_ = load_tokenizer(dir_->path());
  if (options.chat) {
    TemplateTokens tt;
    if (tok_->bos_id()) tt.bos = tok_->token_bytes(*tok_->bos_id());
    if (!tok_->eos_ids().empty()) tt.eos = tok_->token_bytes(*tok_->eos_ids().begin());
    tmpl_ = make_chat_template(choose_template(dir_->path(), options.chat_template), tt);
  }
  if (!options.draft_model_dir.empty()) {
    draft_dir_ = std::make_unique<ModelDir>(options.draft_model_dir);
    try {
      check_same_vocabulary(*tok_, *load_tokenizer(draft_dir_->path()));
    } catch (const Error& e) {
      fail("runtime: draft model '", options.draft_model_dir, "': ", e.what());
    }
  }
  if (!backend_) backend_ = make_backend(options.backend, options.cpu_threads);
  cache_format_ = options.cache_format.value_or(default_cache_format(options.backend));
}

ModelHost::~ModelHost() = default;

int64_t ModelHost::max_position_embeddings() const { return dir_->config().max_position_embeddings; }

Model& ModelHost::model() {
  EXL_CHECK(model_ != nullptr, "runtime: model host: '", dir_->path().string(), "' is not loaded yet");
  return *model_;
}

void ModelHost::load(MemoryRequest req) {
  EXL_CHECK(model_ == nullptr, "runtime: model host: '", dir_->path().string(), "' is already loaded");
  req.cache_format = cache_format_;
  if (draft_dir_ && !draft_model_) {
    MemoryRequest dreq = req;
    dreq.cache_pages = 1;  // its pages are planned with the model's (companion_page_bytes)
    draft_model_ = load_planned_model(*draft_dir_, *backend_, dreq, draft_plan_);
    req.companion_page_bytes = int64_t(draft_model_->kv_layout(cache_format_, req.page_size).page_bytes());
  }
  model_ = load_planned_model(*dir_, *backend_, req, plan_);
}

std::unique_ptr<Generator> ModelHost::load_generator(GeneratorOptions go, int64_t max_seq_len) {
  load({cache_format_, go.page_size, go.num_pages, go.max_batch_seqs, go.max_step_tokens, max_seq_len});
  go.num_pages = plan_.cache_pages;
  return make_generator(go);
}

std::unique_ptr<Generator> ModelHost::make_generator(GeneratorOptions go) {
  go.cache_format = cache_format_;
  go.draft_model = draft_model_.get();
  return std::make_unique<Generator>(model(), *tok_, go);
}

std::vector<int32_t> ModelHost::encode_prompt(const RenderedPrompt& prompt) const {
  return tokenize_prompt(*tok_, prompt);
}

}  // namespace exl
