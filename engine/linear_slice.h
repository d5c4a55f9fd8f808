// Slices of a linear layer's weights without re-quantization: some of its output columns (in any
// order) or a range of its stored rows. Tensor parallelism gives each rank such slices
// (tensor_parallel.h); a model orders its MLP's gate/up columns by down_proj's act-order
// permutation with them (model.cpp). Plain functions; thread-safe.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/linear_weights.h"

namespace exl {

// A linear's slice: the weights and the storage its pointers use where it does not point into
// the source's memory (which must outlive the slice). Movable; the pointers stay valid.
struct LinearSlice {
  LinearWeights weights;
  std::unique_ptr<uint32_t[]> words, scale_words;
  std::unique_ptr<uint8_t[]> bytes;
};

// Output columns `cols` (in that order, each < out_features) of `w`: EXL2 columns and scale
// nibbles repacked (padding columns zero; the words of a large matrix by several threads, so that
// loading a model whose MLPs are ordered, mlp_order.h, stays quick), dense rows copied; bias
// entries kept. Throws for GPTQ or a column out of range.
LinearSlice slice_linear_columns(const LinearWeights& w, std::span<const int32_t> cols);
// Stored rows [row_begin, row_end) of `w` as a linear over in_features = row_end − row_begin
// whose input feature i is the source's feature perm[row_begin + i] (dense: row_begin + i): EXL2
// at group boundaries (the slice points into w's memory), dense input columns copied. The bias is
// kept only when `keep_bias` (under tensor parallelism one rank adds it). Throws for GPTQ or bounds inside a group.
LinearSlice slice_linear_rows(const LinearWeights& w, int64_t row_begin, int64_t row_end, bool keep_bias);

}  // namespace exl
