// CPU stand-in for the part of CUB's DeviceSegmentedSort that kernels/cuda/ uses (see ../../emu.h):
// a stable ascending sort of (key, value) pairs within each segment [begin[s], end[s]).
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "emu.h"

namespace cub {
struct DeviceSegmentedSort {
  template <class K, class V, class B, class E>
  static cudaError_t StableSortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* vals_in,
                                     V* vals_out, int64_t n_items, int64_t n_segments, B begin, E end,
                                     cudaStream_t = nullptr) {
    if (temp == nullptr) {
      temp_bytes = 16;
      return cudaSuccess;
    }
    if (n_items < 0 || n_segments < 0) return cudaErrorInvalidValue;
    for (int64_t s = 0; s < n_segments; ++s) {
      const int64_t b = begin[s], e = end[s];
      if (b >= e) continue;
      if (b < 0 || e > n_items) return cudaErrorInvalidValue;
      std::vector<int64_t> idx(static_cast<size_t>(e - b));
      std::iota(idx.begin(), idx.end(), b);
      std::stable_sort(idx.begin(), idx.end(), [&](int64_t x, int64_t y) { return keys_in[x] < keys_in[y]; });
      std::vector<K> k;
      std::vector<V> v;
      for (int64_t i : idx) k.push_back(keys_in[i]), v.push_back(vals_in[i]);
      std::copy(k.begin(), k.end(), keys_out + b);
      std::copy(v.begin(), v.end(), vals_out + b);
    }
    return cudaSuccess;
  }
};
}  // namespace cub
