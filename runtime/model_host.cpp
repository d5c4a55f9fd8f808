#include "runtime/model_host.h"

#include <filesystem>

#include "engine/generate/draft_model.h"
#include "kernels/error.h"
#include "engine/tensor_parallel.h"
#include "runtime/backend_select.h"

namespace exl {

ModelHost::ModelHost(const ModelHostOptions& options, std::unique_ptr<Backend> backend) {
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
  EXL_CHECK(options.gpu_split.empty() || options.tensor_parallel <= 1,
            "runtime: --gpu-split and --tensor-parallel cannot be combined (give one)");
  EXL_CHECK(options.tensor_parallel >= 0, "runtime: --tensor-parallel must be positive");
  if (options.tensor_parallel > 1) {
    EXL_CHECK(backend == nullptr, "runtime: model host: --tensor-parallel makes its own backends");
    GpuSplit ranks;
    ranks.n_devices = options.tensor_parallel;
    backends_ = make_split_backends(options.backend, ranks, options.cpu_threads, "--tensor-parallel");
    std::vector<Backend*> raw;
    for (const auto& b : backends_) raw.push_back(b.get());
    if (options.backend == "cuda" && nccl_available()) {
      std::vector<int> devices;
      for (int d = 0; d < options.tensor_parallel; ++d) devices.push_back(d);
      comm_ = make_nccl_communicator(raw, devices);
    } else {
      comm_ = make_host_communicator(raw);
    }
  } else if (!options.gpu_split.empty()) {
    EXL_CHECK(backend == nullptr, "runtime: model host: a --gpu-split makes its own backends");
    split_ = parse_gpu_split(options.gpu_split, options.backend);
    backends_ = make_split_backends(options.backend, *split_, options.cpu_threads);
  } else {
    backends_.push_back(backend ? std::move(backend) : make_backend(options.backend, options.cpu_threads));
  }
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
    draft_model_ = load_planned_model(*draft_dir_, backend(), dreq, draft_plan_);
    req.companion_page_bytes = int64_t(draft_model_->kv_layout(cache_format_, req.page_size).page_bytes());
  }
  if (comm_) {
    plan_ = plan_tp_memory(*dir_, plan_tensor_parallel(*dir_, int(backends_.size())), req, device_memories(backends_));
    check_fits(plan_);
    std::vector<Backend*> ranks;
    for (const auto& b : backends_) ranks.push_back(b.get());
    model_ = std::make_unique<Model>(*dir_, ranks, *comm_);
    return;
  }
  if (!split_) {
    model_ = load_planned_model(*dir_, backend(), req, plan_);
    return;
  }
  placement_ = plan_layer_split(*dir_, req, *split_, device_memories(backends_));
  check_fits(*placement_);
  std::vector<ModelPart> parts;
  for (const auto& [device, range] : placement_->used_ranges())
    parts.push_back({backends_[size_t(device)].get(), range.first, range.second});
  plan_ = MemoryPlan{};
  plan_.model = placement_->model;
  plan_.request = placement_->request;
  plan_.cache_format = placement_->cache_format;
  plan_.cache_pages = placement_->cache_pages;
  plan_.cache_tokens = placement_->cache_tokens;
  plan_.cache_auto = placement_->cache_auto;
  plan_.max_pages = placement_->max_pages;
  for (const DevicePlacement& d : placement_->devices) {
    if (!d.used()) continue;
    plan_.weight_bytes += d.weight_bytes;
    plan_.scratch_bytes += d.scratch_bytes;
    plan_.cache_bytes += d.cache_bytes;
    plan_.page_bytes += d.page_bytes;
  }
  model_ = std::make_unique<Model>(*dir_, parts);
}

std::unique_ptr<Generator> ModelHost::load_generator(GeneratorOptions go, int64_t max_seq_len) {
  load({cache_format_, go.page_size, go.num_pages, go.max_batch_seqs, go.max_step_tokens, max_seq_len});
  go.num_pages = plan_.cache_pages;
  return make_generator(go);
}

std::unique_ptr<Generator> ModelHost::make_generator(GeneratorOptions go) {
  go.cache_format = cache_format_;
  go.draft_model = draft_model_.get();
  auto gen = std::make_unique<Generator>(model(), *tok_, go);
  if (model().backend().device_memory()) gen->warm_up();  // a GPU: its first request would load libraries
  return gen;
}

std::vector<int32_t> ModelHost::encode_prompt(const RenderedPrompt& prompt) const {
  return tokenize_prompt(*tok_, prompt);
}

}  // namespace exl
