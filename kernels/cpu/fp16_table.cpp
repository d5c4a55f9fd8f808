#include "kernels/cpu/fp16_table.h"

#include <vector>

#include "kernels/half.h"

namespace exl::cpu {

const float* fp16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t i = 0; i < 65536; ++i) t[i] = half_to_float(uint16_t(i));
    return t;
  }();
  return table.data();
}

}  // namespace exl::cpu
