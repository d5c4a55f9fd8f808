// An MLP's gate/up output columns put in the order its down_proj reads them. EXL2 stores a
// matrix's rows in act-order: stored row j of down_proj holds input feature perm[j], so every
// reader of down's input gathers it through perm (on the GPU, the batched kernels that stage
// silu(gate)·up for down scatter each value to its act-order place). Ordered, gate's and up's output
// column j is feature perm[j] and down's perm is the identity: the same products and the same
// sums in the same order, so a model's results are bit for bit those of the matrices as stored,
// while the swiglu output arrives in the order down's rows are stored (Exl2MmaStaging::in_order,
// kernels/cuda/exl2_gemm.h). Plain data and a function; thread-safe.
#pragma once
#include "engine/linear_slice.h"
#include "kernels/linear_weights.h"

namespace exl {

// gate.weights and up.weights point into the slices' own storage where `ordered` (movable: the
// pointers stay valid), else into what the inputs pointed into.
struct OrderedMlp {
  LinearSlice gate, up;
  LinearWeights down;
  bool ordered = false;
};

// The three linears ordered as above where down is EXL2 with a permutation other than the
// identity and neither gate nor up is GPTQ (whose columns are not sliced); else returned as given.
// Throws exl::Error where gate's or up's out_features differ from down's in_features.
OrderedMlp order_mlp_by_down(LinearWeights gate, LinearWeights up, LinearWeights down);

}  // namespace exl
