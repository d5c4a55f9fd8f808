// A decoder-only transformer run tensor-parallel over N ranks (one Backend each, one thread
// driving all of them), split as engine/tensor_parallel.h plans: each rank holds its heads' q/k/v
// and K/V cache, its o_proj output columns and its share of the MLP; the ranks meet in three
// collectives per layer (Communicator: attention outputs and o_proj columns all-gathered, down_proj
// partials all-reduced). Embedding and norms are replicated, the head runs on rank 0. Same
// forward() contract as Model's; built once from a ModelDir whose weights the backends copy.
// The ops run one rank after another (the CPU emulation of N devices; a GPU build would queue
// each rank's ops on its own stream). Decode steps are not bracketed for replay (no CUDA graphs
// yet: a collective cannot be captured by the host communicator).
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "engine/model.h"
#include "engine/tensor_parallel.h"
#include "kernels/communicator.h"

namespace exl {

class TpModel {
 public:
  // ranks[r] runs rank r; `comm` connects the same backends in the same order. Both must outlive
  // the model. Throws exl::Error as plan_tensor_parallel does, or for a communicator of another size.
  TpModel(const ModelDir& dir, std::span<Backend* const> ranks, Communicator& comm);
  ~TpModel();

  const ModelConfig& config() const { return cfg_; }
  const TpPlan& plan() const { return plan_; }
  int n_ranks() const { return int(ranks_.size()); }
  // One pool per rank holding its kv heads of every layer, behind one page table.
  std::unique_ptr<KvPool> alloc_kv_pool(KvFormat format, int page_size, int num_pages);
  // Model::forward's contract: logits rows in host memory, [Σ (all_logits ? n_tokens : 1), vocab].
  std::vector<float> forward(std::span<const ForwardSeq> batch, KvPool& pool);
  // forward() leaving the logits rows in rank 0's memory (device_logits()) until the next call;
  // returns the number of rows.
  int64_t forward_device(std::span<const ForwardSeq> batch, KvPool& pool);
  const float* device_logits() const { return logits_.f32(); }
  Backend& rank_backend(int rank) const;
  // Backend::kv_copy on every rank's pool.
  void kv_copy(KvPool& pool, int from, int to, int n_rows);

 private:
  struct Rank;
  void ensure_scratch(int64_t tokens, int64_t rows);
  KvPool& rank_pool(KvPool& pool, size_t rank) const;
  ModelConfig cfg_;
  TpPlan plan_;
  RopeTable rope_;
  Communicator& comm_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<PreparedLinear> head_;  // rank 0
  Buffer final_norm_, last_, logits_;     // rank 0
  int64_t tokens_ = 0, rows_ = 0;
};

}  // namespace exl
