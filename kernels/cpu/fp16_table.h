// fp16 → fp32 by table lookup (256 KiB, built once, thread-safe): the CPU backend's fast path.
#pragma once
#include <cstdint>

namespace exl::cpu {

const float* fp16_table();

inline float fp16_to_f32(const float* table, uint16_t h) { return table[h]; }

}  // namespace exl::cpu
