// The tag that opens an op's notes in a recorded step (kernels/cuda/step_graph.h): which backend
// op the values after it describe, so that two steps that differ in their ops never share a graph
// even where their other notes coincide. The numbers are noted and hashed: each op keeps its own.
#pragma once
#include <cstdint>

namespace exl::cuda {

enum class StepOp : uint8_t {
  embedding = 1,
  rms_norm = 2,
  linear = 3,
  rope = 4,
  swiglu = 5,
  add = 6,
  kv_write = 7,
  kv_copy = 8,
  attention = 9,
  rope_qk = 10,
  add_rms_norm = 11,
  linears = 12,
  swiglu_linear = 13,
  rope_qk_kv_write = 14,
  swiglu_linear_residual = 15,
  linear_residual = 16,
  rms_norm_linears = 17,
  attention_inputs = 18,
  rms_norm_linears_staged = 19,
  rms_norm_mlp_residual = 20,
  attention_inputs_staged = 21,
  embedding_of_samples = 31,
};

}  // namespace exl::cuda
