// Element types of tensors as stored in model files and used by the backends.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace exl {

enum class DType : uint8_t { f32, f16, bf16, i32, i16, u8, i64, f64, i8, u16, u32, u64, bool_ };
inline constexpr int n_dtypes = 13;

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: case DType::u32: return 4;
    case DType::f16: case DType::bf16: case DType::i16: case DType::u16: return 2;
    case DType::u8: case DType::i8: case DType::bool_: return 1;
    case DType::i64: case DType::f64: case DType::u64: return 8;
  }
  return 0;
}

// The safetensors spelling ("F32", "BF16", ...).
std::string_view to_string(DType t);
std::optional<DType> dtype_from_safetensors(std::string_view s);

}  // namespace exl
