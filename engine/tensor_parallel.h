// Tensor parallelism (--tensor-parallel N): every decoder layer's attention heads and MLP columns
// split over N ranks, and the weights sliced for them without re-quantization. Plain data and
// functions; thread-safe.
//
// Per layer and rank r (a rank is a device; engine/tp_model.h runs them):
//   attention  whole kv-head groups: kv heads [kv_begin, kv_end) (as even as NKV/N allows) and
//              the query heads that read them; q/k/v are sliced by those heads' columns, the K/V
//              cache holds only those kv heads. The heads' outputs are all-gathered (every rank
//              then holds the whole attention output), and o_proj is sliced by output columns
//              (hidden, in 32-aligned ranges): every rank computes its columns of the residual
//              update from the whole input, and those are all-gathered again.
//   MLP        down_proj is sliced by its (permuted) rows at EXL2 group boundaries, as even as the
//              groups allow; gate/up by the columns those rows read, in the rows' order, so that a
//              rank's down slice reads its own swiglu output with an identity permutation. The
//              partial products are all-reduced (summed) into the residual update.
// Why o and down differ: an EXL2 matrix's rows are stored in act-order (a permutation of its
// input features) and packed in groups of 32+ rows with one scale row each, so a row slice has
// to follow group boundaries, which mix features of every head. Attention computes whole heads,
// so o_proj cannot read a slice of its input chosen by group; the MLP's columns are independent,
// so gate/up can produce exactly the features a down slice reads. The cost is one collective more
// per layer than the classic split (attention: two all-gathers instead of one all-reduce).
// Dense weights follow the same plan (identity order, row slices 32-aligned); GPTQ is not split.
// Embedding and norms are replicated on every rank; the head runs on rank 0.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "engine/formats/model_dir.h"
#include "engine/linear_slice.h"
#include "engine/memory_plan.h"
#include "kernels/linear_weights.h"

namespace exl {

// One rank's share of one decoder layer.
struct TpLayerSlice {
  int64_t q_head_begin = 0, q_head_end = 0;
  int64_t kv_head_begin = 0, kv_head_end = 0;
  int64_t o_col_begin = 0, o_col_end = 0;      // o_proj output columns (hidden)
  int64_t down_row_begin = 0, down_row_end = 0;  // down_proj's stored (permuted) rows
  std::vector<int32_t> mlp_cols;               // gate/up columns: the features of those rows, in order
};

// slices[layer][rank].
struct TpPlan {
  int n_ranks = 0;
  std::vector<std::vector<TpLayerSlice>> slices;
};

// Plans `dir` over `n_ranks` (loading each layer's down_proj to find its groups). Throws
// exl::Error when a rank would get nothing: fewer kv heads, hidden 32-column blocks or down_proj
// groups than ranks, or a GPTQ down_proj.
TpPlan plan_tensor_parallel(const ModelDir& dir, int n_ranks);

// The memory plan of a TP model (memory_plan.h's byte formulas per rank): each rank holds the
// embedding and norms, its linear slices, the head on rank 0, the whole scratch reserve (a
// bound), and per KV page its kv heads of every layer. The cache gets as many pages as the
// tightest rank holds (automatic) or is checked on every rank (explicit). The plan reports the
// tightest rank: its device, weights and page bytes; `error` names it. memory[r] is rank r's
// device memory (nullopt: no limit); throws as plan_tensor_parallel does.
MemoryPlan plan_tp_memory(const ModelDir& dir, const TpPlan& plan, const MemoryRequest& req,
                          std::span<const std::optional<DeviceMemory>> memory);

}  // namespace exl
