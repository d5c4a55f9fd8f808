#include "kernels/dtype.h"

#include <array>

namespace exl {

namespace {
constexpr std::array<std::string_view, n_dtypes> k_names = {
    "F32", "F16", "BF16", "I32", "I16", "U8", "I64", "F64", "I8", "U16", "U32", "U64", "BOOL"};
static_assert(k_names.size() == n_dtypes);
}  // namespace

std::string_view to_string(DType t) { return k_names[static_cast<size_t>(t)]; }

std::optional<DType> dtype_from_safetensors(std::string_view s) {
  for (size_t i = 0; i < k_names.size(); ++i)
    if (k_names[i] == s) return static_cast<DType>(i);
  return std::nullopt;
}

}  // namespace exl
