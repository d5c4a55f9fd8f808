// Small deterministic pseudo-random generators for sampling and hashing. Plain value types:
// copying one snapshots its stream. Not thread-safe (each job owns its own).
#pragma once
#include <cstdint>

namespace exl {

// SplitMix64 output function (Steele, Lea, Flood 2014): a bijective 64-bit mixer.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// SplitMix64: advances `state` by the golden-ratio increment and returns the mixed value.
inline uint64_t splitmix64(uint64_t& state) {
  state += 0x9e3779b97f4a7c15ull;
  return mix64(state);
}

// xoshiro256** (Blackman, Vigna 2018), seeded by four SplitMix64 outputs of `seed`.
// Used by the default sampler mode; any seed (including 0) gives a valid stream.
struct Xoshiro256 {
  uint64_t s[4];

  explicit Xoshiro256(uint64_t seed) {
    for (uint64_t& w : s) w = splitmix64(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
  }
  // Uniform double in [0, 1) with 53 random bits.
  double uniform() { return double(next() >> 11) * 0x1.0p-53; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
};

// llama2.c's generator (run.c random_u32 / random_f32): xorshift64* with the multiplier applied
// to the output only. State 0 is absorbing (every draw is 0), so seed it with a non-zero value.
struct Llama2cRng {
  uint64_t state;

  uint32_t next_u32() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return uint32_t((state * 0x2545F4914F6CDD1Dull) >> 32);
  }
  // Float in [0, 1) from the top 24 bits of next_u32().
  float next_f32() { return float(next_u32() >> 8) / 16777216.0f; }
};

}  // namespace exl
