#include "kernels/kv_layout.h"

#include <array>

namespace exl {

namespace {
constexpr std::array<std::string_view, n_kv_formats> k_names = {"fp16", "q8", "q4"};
}  // namespace

std::string_view to_string(KvFormat f) { return k_names[static_cast<size_t>(f)]; }

std::optional<KvFormat> kv_format_from_string(std::string_view s) {
  for (size_t i = 0; i < k_names.size(); ++i)
    if (k_names[i] == s) return static_cast<KvFormat>(i);
  return std::nullopt;
}

}  // namespace exl
