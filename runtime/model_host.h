// One model being served: its directory, tokenizer, chat template, backend and the weights
// loaded against a memory plan. The one set-up shared by `serve` (ServerState), the job commands
// (JobEngine), `generate` and `bench`.
//
// Two steps, because some callers size the KV cache from a tokenized prompt: the constructor
// opens and validates the directory, loads the tokenizer (and the chat template when asked) and
// makes the backend (one per device with a --gpu-split); load() or load_generator() plans device
// memory (with a split: the layer placement) and uploads the weights, once. Every accessor of the
// model throws before that. A draft model runs on the first device.
// Thread-safety: after loading, the const accessors may be called from any thread (the model and
// tokenizer are immutable); loading itself is not thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "engine/formats/model_dir.h"
#include "engine/generate/generator.h"
#include "engine/layer_split.h"
#include "engine/memory_plan.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/backend.h"
#include "kernels/communicator.h"
#include "sessions/chat_template.h"

namespace exl {

struct ModelHostOptions {
  std::string model_dir;
  std::string backend = "cpu";              // "cpu" or "cuda" (runtime/backend_select.h)
  int cpu_threads = 0;                      // 0 = all
  std::optional<KvFormat> cache_format;     // unset: the backend's default (f32 cpu, fp16 cuda)
  bool chat = false;                        // load the chat template (commands that render conversations)
  std::string chat_template;                // with chat: a template name; empty = detect from the directory
  // A draft model for speculative decoding (GeneratorOptions::draft_model): a directory whose
  // tokenizer is the model's (checked at construction); loaded first, and its K/V planned with
  // each page of the model's cache.
  std::string draft_model_dir;
  // A layer split over several devices (--gpu-split "20,24" or "auto"; runtime/backend_select.h):
  // one backend per device, the model placed by engine/layer_split.h. Empty: one device.
  std::string gpu_split;
  // Tensor parallelism over this many devices (--tensor-parallel N; engine/tp_model.h): one
  // backend per device, collectives by NCCL on CUDA when the build has it, else through host
  // memory. 0 or 1: off. Not with gpu_split.
  int tensor_parallel = 0;
};

class ModelHost {
 public:
  // Throws exl::Error naming what failed (directory, tokenizer, template, backend). `backend`,
  // when given, runs the model instead of the one options.backend names (tests wrap the CPU
  // backend to inject device faults).
  explicit ModelHost(const ModelHostOptions& options, std::unique_ptr<Backend> backend = nullptr);
  ~ModelHost();
  ModelHost(const ModelHost&) = delete;
  ModelHost& operator=(const ModelHost&) = delete;

  // Plans device memory for `req` (its cache_format replaced by cache_format()) and uploads the
  // weights. Throws exl::Error when the plan does not fit or the model is already loaded.
  void load(MemoryRequest req);
  // load() sized for one Generator with options `go` (num_pages 0: as many pages as the free memory
  // holds; max_seq_len 0: the model's context), then that Generator, with cache_format and the
  // planned num_pages filled in.
  std::unique_ptr<Generator> load_generator(GeneratorOptions go, int64_t max_seq_len = 0);
  // Another Generator on the loaded model; its cache_format is set to cache_format(). On a GPU it
  // is warmed up (Generator::warm_up), so that its first request does not load the libraries.
  std::unique_ptr<Generator> make_generator(GeneratorOptions go);

  const ModelDir& dir() const { return *dir_; }
  // The directory's last path component, as /v1/models and job results name the model.
  const std::string& model_id() const { return model_id_; }
  const Tokenizer& tokenizer() const { return *tok_; }
  // Null unless options.chat.
  std::shared_ptr<const ChatTemplate> chat_template() const { return tmpl_; }
  // The first device's backend (the only one without a split).
  Backend& backend() { return *backends_.front(); }
  // Every device's backend, in split order.
  const std::vector<std::unique_ptr<Backend>>& backends() const { return backends_; }
  KvFormat cache_format() const { return cache_format_; }
  // config.json's max_position_embeddings (0 when it does not say).
  int64_t max_position_embeddings() const;
  bool loaded() const { return model_ != nullptr; }
  Model& model();
  // The memory plan; with a split, its totals over the devices (device unset); tensor-parallel,
  // the tightest rank's (engine/tensor_parallel.h: plan_tp_memory).
  const MemoryPlan& plan() const { return plan_; }
  // The layer placement of a split model after loading; null without a split.
  const LayerPlacement* placement() const { return placement_ ? &*placement_ : nullptr; }
  // Null unless options.draft_model_dir (and, after loading, the loaded draft model).
  Model* draft_model() { return draft_model_.get(); }

  // A rendered conversation -> prompt tokens (tokenize_prompt: special tokens only from the
  // template's markup, never from message content; BOS once).
  std::vector<int32_t> encode_prompt(const RenderedPrompt& prompt) const;

 private:
  std::string model_id_;
  std::unique_ptr<ModelDir> dir_;
  std::unique_ptr<Tokenizer> tok_;
  std::shared_ptr<const ChatTemplate> tmpl_;
  std::vector<std::unique_ptr<Backend>> backends_;
  std::optional<GpuSplit> split_;
  std::optional<LayerPlacement> placement_;
  std::unique_ptr<Communicator> comm_;  // tensor parallelism's; after backends_: destroyed first
  std::unique_ptr<ModelDir> draft_dir_;
  std::unique_ptr<Model> draft_model_;
  MemoryPlan draft_plan_;
  KvFormat cache_format_;
  MemoryPlan plan_;
  std::unique_ptr<Model> model_;  // after backends_: destroyed first
};

}  // namespace exl
