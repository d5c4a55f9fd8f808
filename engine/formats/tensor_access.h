// Typed access to tensors of a ModelDir: alignment-checked element pointers into the mapped
// file, and conversion of float tensors (F16, BF16, F32) to float. Errors name the file and the
// tensor: "engine: <concept>: '<file>': tensor '<name>': ...".
#pragma once
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/formats/model_dir.h"
#include "kernels/error.h"

namespace exl {

// "engine: <concept>: '<file>': tensor '<name>': ", the prefix of every message about `t`.
std::string tensor_where(std::string_view concept_name, const TensorView& t);

// True for F16, BF16 and F32.
bool is_float_dtype(DType t);

// The tensor's elements as T (whose size must match the dtype's). Throws when the data is not
// aligned for T, which a well-formed safetensors file never causes (writers pad to 8 bytes).
template <typename T>
const T* tensor_data(const TensorView& t, std::string_view concept_name) {
  EXL_CHECK(sizeof(T) == dtype_size(t.info->dtype), tensor_where(concept_name, t), "dtype ",
            to_string(t.info->dtype), " cannot be read as a ", sizeof(T), "-byte element");
  EXL_CHECK(reinterpret_cast<uintptr_t>(t.data.data()) % alignof(T) == 0, tensor_where(concept_name, t),
            "data is not ", alignof(T), "-byte aligned in the file (misaligned safetensors data section)");
  return reinterpret_cast<const T*>(t.data.data());
}

// The elements of a float tensor (F16, BF16 or F32) converted to float; throws for other dtypes.
std::vector<float> tensor_to_f32(const TensorView& t, std::string_view concept_name);

// Loads tensor `name` as float, checking its shape (empty = any) and that the dtype is a float
// type. For norms, embeddings and other unquantized vectors and matrices.
std::vector<float> load_f32(const ModelDir& dir, std::string_view name, std::span<const int64_t> shape = {});

// Tensor `<prefix>.<suffix>` of a quantized linear layer; throws naming the file, the layer and
// the missing tensor when the file lacks it.
TensorView need_layer_tensor(const ModelDir& dir, std::string_view concept_name, std::string_view prefix,
                             std::string_view suffix);

// The optional `<prefix>.bias` of a linear layer as float ([out_features]), or empty when absent.
// Any float dtype is accepted; the shape must be [out_features].
std::vector<float> load_linear_bias(const ModelDir& dir, std::string_view prefix, int64_t out_features,
                                    std::string_view concept_name);

}  // namespace exl
