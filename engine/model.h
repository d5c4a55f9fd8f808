// A decoder-only transformer (Llama / Mistral / Qwen2) on a Backend, or split by layers over
// several (one per device, engine/layer_split.h). The architecture differences are data (biases,
// tied head, rope type, sliding window). Built once from a ModelDir, whose weights the backends
// copy at construction (Backend::prepare_*): the ModelDir and its files may change or go away
// afterwards. forward() is called by one thread (the engine thread).
//
// A split model runs its parts in order on one thread: each part's layers on its backend (a
// decode step is one Backend::begin_step/end_step bracket per part), then the residual stream
// [tokens, hidden] handed to the next part's backend (Backend::copy_to, else download and upload
// through host memory). Its K/V pool is a pool per part, each holding the part's layers, with
// one page table for all (alloc_kv_pool). A model of one part runs exactly the single-backend
// code path. A tensor-parallel model (engine/tp_model.h) runs behind the same interface: its
// logits and sampling on rank 0, a K/V pool per rank.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "engine/formats/model_dir.h"
#include "kernels/backend.h"

namespace exl {

class Communicator;
class TpModel;

// One backend's share of a model split by layers: decoder layers [layer_begin, layer_end).
struct ModelPart {
  Backend* backend = nullptr;
  int64_t layer_begin = 0, layer_end = 0;
};

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
  // A split model: parts in layer order, each non-empty, together every layer once; the first
  // holds the embedding, the last the final norm and the head. Throws exl::Error otherwise.
  Model(const ModelDir& dir, std::span<const ModelPart> parts);
  // A tensor-parallel model over `ranks` (one backend each) joined by `comm` (both outlive the
  // model); throws exl::Error as TpModel does.
  Model(const ModelDir& dir, std::span<Backend* const> ranks, Communicator& comm);
  ~Model();
  // The number of tensor-parallel ranks (1 unless built over ranks).
  int n_ranks() const;

  const ModelConfig& config() const { return cfg_; }
  // The first part's backend (the only one unless split; rank 0's when tensor-parallel).
  Backend& backend() const { return *parts_.front().be; }
  // The parts in layer order (one for a model that is not split).
  std::vector<ModelPart> parts() const;
  int64_t vocab_size() const { return cfg_.vocab_size; }
  // Identifies the weights (directory, tensor files and their sizes) for prefix-cache keys.
  const std::string& identity() const { return identity_; }
  // The cache layout this model needs, for a given storage format and page size.
  KvLayout kv_layout(KvFormat format, int page_size) const;
  // A K/V pool of `num_pages` pages in kv_layout(format, page_size) for forward(): the backend's
  // own pool, or for a split model one pool per part behind one page table.
  std::unique_ptr<KvPool> alloc_kv_pool(KvFormat format, int page_size, int num_pages);
  // Backend::kv_copy on every part's (rank's) pool (copy on write of a shared page).
  void kv_copy(KvPool& pool, int from, int to, int n_rows);

  // Passes of at most this many tokens run as one step a backend may replay (Backend::begin_step:
  // the CUDA backend's graphs): decode steps, and the few positions per sequence of speculative
  // verify passes. Longer ones (prefill chunks) run op by op.
  static constexpr int64_t k_step_max_tokens = 64;
  // Backend::record_steps_at_once on every part's backend (a tensor-parallel model's ranks keep
  // recording a shape when it comes back).
  void record_steps_at_once(bool on);

  // Runs the batch, writing its K/V into `pool`, and returns the requested logits rows in host
  // memory, in batch order: [Σ (all_logits ? n_tokens : 1), vocab].
  std::vector<float> forward(std::span<const ForwardSeq> batch, KvPool& pool);
  // forward() without the download: the logits rows stay in backend memory for sample_device(),
  // until the next forward call. Returns the number of logits rows.
  int64_t forward_device(std::span<const ForwardSeq> batch, KvPool& pool);
  // Backend::sample_rows over the logits rows of the last forward_device() (rows[i].row indexes
  // them; out of range throws). Returns false, doing nothing, when the backend cannot sample.
  bool sample_device(std::span<const RowSampling> rows, std::span<int32_t> out);
  // Whether the backend (a split model's last part's) can sample on the device at all.
  bool can_sample_on_device() const;
  // Whether the backend can sample deferred (sample_device_deferred below); never for a split
  // or tensor-parallel model (the sampled ids would have to reach the other backends).
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
  struct Step;
  // Activation buffers, grown on demand and reused across forward() calls.
  struct Scratch {
    int64_t tokens = 0, rows = 0;
    Buffer x, xn, q, k, v, att, tmp, g, u, last, logits;
  };
  // A part's backend, layers and scratch (logits rows only on the last part).
  struct Part {
    Backend* be = nullptr;
    int64_t begin = 0, end = 0;
    Scratch scratch;
  };
  void load(const ModelDir& dir);
  void ensure_scratch(Part& part, int64_t tokens, int64_t logit_rows);
  KvPool& part_pool(KvPool& pool, size_t part) const;
  int64_t run_forward(std::span<const ForwardSeq> batch, KvPool& pool, bool fed);
  void run_part(size_t part, const Step& step, KvPool& pool);
  void hand_over(size_t from_part, int64_t tokens);
  Part& last_part() { return parts_.back(); }
  const Part& last_part() const { return parts_.back(); }
  const float* device_logits() const;

  std::vector<Part> parts_;
  std::vector<float> staging_;  // host copy of the residual stream between parts
  ModelConfig cfg_;
  std::string identity_;
  RopeTable rope_;
  std::unique_ptr<PreparedEmbedding> embed_;
  std::vector<Layer> layers_;
  Buffer final_norm_;
  std::unique_ptr<PreparedLinear> head_;
  std::unique_ptr<TpModel> tp_;  // a tensor-parallel model: the rest above stays unused
  int64_t device_rows_ = 0;  // logits rows left by the last forward_device()
};

}  // namespace exl
