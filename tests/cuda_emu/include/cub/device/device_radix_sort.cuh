// CPU stand-in for the part of CUB's DeviceRadixSort that kernels/cuda/ uses (see ../../emu.h):
// a stable ascending sort of (key, value) pairs over the whole key.
#pragma once
#include <algorithm>
#include <cstddef>
#include <numeric>
#include <vector>

#include "emu.h"

namespace cub {
struct DeviceRadixSort {
  template <class K, class V>
  static cudaError_t SortPairs(void* temp, size_t& temp_bytes, const K* keys_in, K* keys_out, const V* vals_in,
                               V* vals_out, int n, int begin_bit = 0, int end_bit = int(sizeof(K) * 8),
                               cudaStream_t = nullptr) {
    if (temp == nullptr) {
      temp_bytes = 16;
      return cudaSuccess;
    }
    if (begin_bit != 0 || end_bit != int(sizeof(K) * 8) || n < 0) return cudaErrorInvalidValue;
    std::vector<int> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return keys_in[a] < keys_in[b]; });
    std::vector<K> k(static_cast<size_t>(n));
    std::vector<V> v(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) k[size_t(i)] = keys_in[idx[size_t(i)]], v[size_t(i)] = vals_in[idx[size_t(i)]];
    std::copy(k.begin(), k.end(), keys_out);
    std::copy(v.begin(), v.end(), vals_out);
    return cudaSuccess;
  }
};
}  // namespace cub
