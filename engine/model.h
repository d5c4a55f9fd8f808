// A decoder-only transformer (Llama / Mistral / Qwen2) on a Backend. The architecture differences
// are data (biases, tied head, rope type, sliding window). Built once from a ModelDir, whose
// weights the backend copies at construction (Backend::prepare_*): the ModelDir and its files may
// change or go away afterwards. forward() is called by one thread (the engine thread).
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "engine/formats/model_dir.h"
#include "kernels/backend.h"

namespace exl {

// One sequence's part of a forward batch: `tokens` are at positions pos_start.., and their K/V go
// to the cache through `page_table`, which must cover positions [0, pos_start + tokens.size()).
struct ForwardSeq {
  std::span<const int32_t> tokens;
  int64_t pos_start = 0;
  std::span<const int32_t> page_table;
  bool all_logits = false;  // logits for every token, else only for the last one
};

class Model {
 public:
  Model(const ModelDir& dir, Backend& backend);
  ~Model();

  const ModelConfig& config() const { return cfg_; }
  Backend& backend() const { return backend_; }
  int64_t vocab_size() const { return cfg_.vocab_size; }
  // Identifies the weights (directory, tensor files and their sizes) for prefix-cache keys.
  const std::string& identity() const { return identity_; }
  // The cache layout this model needs, for a given storage format and page size.
  KvLayout kv_layout(KvFormat format, int page_size) const;

  // Passes of at most this many tokens run as one step a backend may replay (Backend::begin_step:
  // the CUDA backend's graphs): decode steps, and the few positions per sequence of speculative
  // verify passes. Longer ones (prefill chunks) run op by op.
  static constexpr int64_t k_step_max_tokens = 64;

  // Runs the batch, writing its K/V into `pool`, and returns the requested logits rows in host
  // memory, in batch order: [Σ (all_logits ? n_tokens : 1), vocab].
  std::vector<float> forward(std::span<const ForwardSeq> batch, KvPool& pool);
  // forward() without the download: the logits rows stay in backend memory for sample_device(),
  // until the next forward call. Returns the number of logits rows.
  int64_t forward_device(std::span<const ForwardSeq> batch, KvPool& pool);
  // Backend::sample_rows over the logits rows of the last forward_device() (rows[i].row indexes
  // them; out of range throws). Returns false, doing nothing, when the backend cannot sample.
  bool sample_device(std::span<const RowSampling> rows, std::span<int32_t> out);
  // Whether the backend can sample on the device at all.
  bool can_sample_on_device() const;
  // Whether the backend can sample deferred (sample_device_deferred below).
  bool can_sample_deferred() const;

  // Pipelined decoding (Backend::sample_rows_deferred): the host queues step n+1 before it has
  // read step n's tokens, so the device never waits for the host between steps.
  //   forward_device(first); sample_device_deferred(rows);
  //   loop: forward_device_fed(next); collect_samples(ids); <use ids>; sample_device_deferred(rows);
  // sample_device_deferred() is sample_device() without the wait (false, doing nothing, when the
  // backend cannot). forward_device_fed() runs a decode batch (one position per sequence) whose
  // token for batch[i] is entry i of the last deferred sampling, read on the device (the
  // `tokens` spans must hold one element each, whose value is ignored). When collect_samples()
  // then shows that a sequence should not have continued (a stop token, an error code), its fed
  // step's K/V and logits are garbage to be discarded.
  bool sample_device_deferred(std::span<const RowSampling> rows);
  void collect_samples(std::span<int32_t> out);
  int64_t forward_device_fed(std::span<const ForwardSeq> batch, KvPool& pool);

 private:
  struct Layer;
  // Activation buffers, grown on demand and reused across forward() calls.
  struct Scratch {
    int64_t tokens = 0, rows = 0;
    Buffer x, xn, q, k, v, att, tmp, g, u, last, logits;
  };
  void ensure_scratch(int64_t tokens, int64_t logit_rows);
  int64_t run_forward(std::span<const ForwardSeq> batch, KvPool& pool, bool fed);

  Scratch scratch_;
  Backend& backend_;
  ModelConfig cfg_;
  std::string identity_;
  RopeTable rope_;
  std::unique_ptr<PreparedEmbedding> embed_;
  std::vector<Layer> layers_;
  Buffer final_norm_;
  std::unique_ptr<PreparedLinear> head_;
  int64_t device_rows_ = 0;  // logits rows left by the last forward_device()
};

}  // namespace exl
