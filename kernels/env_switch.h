// Comparison switches and settings read from the environment (EXL_CUDA_GRAPHS=0,
// EXL_CUDA_PROFILE=1, EXL_CUDA_LAYER_CHAINS=16, ...),
// shared by the kernels and the engine. Callers read a switch once (at construction or into a
// static) so that it never costs a lookup on a hot path. Thread-safe as std::getenv is.
#pragma once

#include <cstdlib>
#include <cstring>

namespace exl {

// Whether environment variable `name` is set to exactly `value`.
inline bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v && std::strcmp(v, value) == 0;
}

// Environment variable `name` as a number (std::atoll: leading digits, 0 where there are none), or
// `fallback` where it is unset.
inline long long env_int(const char* name, long long fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : fallback;
}

}  // namespace exl
