// Paged KV storage (encode/decode of head vectors, writes, reads) and causal attention on the CPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/fp16_table.h"
#include "kernels/cpu/ops.h"
#include "kernels/half.h"

namespace exl::cpu {

void kv_encode(const KvLayout& L, const float* x, std::byte* data, uint16_t* scales) {
  const int D = L.head_dim;
  if (L.format == KvFormat::f32) {
    std::memcpy(data, x, size_t(D) * 4);
    return;
  }
  if (L.format == KvFormat::fp16) {
    auto* o = reinterpret_cast<uint16_t*>(data);
    for (int d = 0; d < D; ++d) o[d] = float_to_half(x[d]);
    return;
  }
  const int B = L.block();
  const float qmax = L.format == KvFormat::q8 ? 127.0f : 7.0f;
  for (int b = 0; b < L.blocks_per_vec(); ++b) {
    const float* xb = x + b * B;
    float amax = 0;
    for (int i = 0; i < B; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const uint16_t sh = float_to_half(amax / qmax);
    scales[b] = sh;
    const float s = half_to_float(sh);
    const float inv = s > 0 ? 1.0f / s : 0.0f;
    for (int i = 0; i < B; ++i) {
      const int q = int(std::clamp(std::nearbyint(xb[i] * inv), -qmax, qmax));
      const int d = b * B + i;
      if (L.format == KvFormat::q8) {
        data[d] = std::byte(uint8_t(int8_t(q)));
      } else {
        auto& byte = data[d / 2];
        const uint8_t nib = uint8_t(q + 8);
        byte = (d % 2 == 0) ? std::byte((uint8_t(byte) & 0xf0) | nib) : std::byte((uint8_t(byte) & 0x0f) | (nib << 4));
      }
    }
  }
}

void kv_decode(const KvLayout& L, const std::byte* data, const uint16_t* scales, float* x) {
  const int D = L.head_dim;
  const float* f16 = fp16_table();
  if (L.format == KvFormat::f32) {
    std::memcpy(x, data, size_t(D) * 4);
    return;
  }
  if (L.format == KvFormat::fp16) {
    const auto* h = reinterpret_cast<const uint16_t*>(data);
    for (int d = 0; d < D; ++d) x[d] = f16[h[d]];
    return;
  }
  const int B = L.block();
  for (int d = 0; d < D; ++d) {
    const float s = f16[scales[d / B]];
    int q;
    if (L.format == KvFormat::q8) q = int(int8_t(uint8_t(data[d])));
    else q = int((uint8_t(data[d / 2]) >> (4 * (d % 2))) & 0xf) - 8;
    x[d] = float(q) * s;
  }
}

namespace {

inline std::byte* vec_data(const KvLayout& L, std::byte* pool, int page, size_t vec) {
  return pool + size_t(page) * L.page_bytes() + L.data_offset(vec);
}
inline uint16_t* vec_scales(const KvLayout& L, std::byte* pool, int page, size_t vec) {
  return reinterpret_cast<uint16_t*>(pool + size_t(page) * L.page_bytes() + L.scale_offset(vec));
}

}  // namespace

void kv_write(const KvLayout& L, std::byte* pool, int layer, const float* k, const float* v,
              std::span<const int32_t> slots) {
  const int D = L.head_dim, H = L.n_kv_heads;
  for (size_t t = 0; t < slots.size(); ++t) {
    const int page = slots[t] / L.page_size, off = slots[t] % L.page_size;
    for (int kv = 0; kv < 2; ++kv) {
      const float* src = (kv == 0 ? k : v) + int64_t(t) * H * D;
      for (int h = 0; h < H; ++h) {
        const size_t vec = L.vec_index(layer, kv, h, off);
        kv_encode(L, src + h * D, vec_data(L, pool, page, vec), vec_scales(L, pool, page, vec));
      }
    }
  }
}

void kv_copy_rows(const KvLayout& L, std::byte* pool, int from, int to, int n_rows) {
  for (int layer = 0; layer < L.n_layers; ++layer)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < L.n_kv_heads; ++h) {
        const size_t vec = L.vec_index(layer, kv, h, 0);
        std::memcpy(vec_data(L, pool, to, vec), vec_data(L, pool, from, vec), size_t(n_rows) * L.vec_bytes());
        std::memcpy(vec_scales(L, pool, to, vec), vec_scales(L, pool, from, vec), size_t(n_rows) * L.vec_scale_bytes());
      }
}

void kv_read(const KvLayout& L, const std::byte* pool, int layer, int kv, int head,
             std::span<const int32_t> page_table, int64_t n_pos, float* out) {
  auto* p = const_cast<std::byte*>(pool);
  for (int64_t pos = 0; pos < n_pos; ++pos) {
    const int page = page_table[size_t(pos / L.page_size)];
    const size_t vec = L.vec_index(layer, kv, head, int(pos % L.page_size));
    kv_decode(L, vec_data(L, p, page, vec), vec_scales(L, p, page, vec), out + pos * L.head_dim);
  }
}

void attention(ThreadPool& tp, const KvLayout& L, const std::byte* pool, int layer, const float* q, float* out,
               std::span<const SeqAttn> seqs, int n_heads, float scale, int sliding_window) {
  const int D = L.head_dim, KVH = L.n_kv_heads, group = n_heads / KVH;
  constexpr int64_t k_tok_block = 16;
  struct Task {
    size_t seq;
    int kv_head;
    int64_t t0, t1;
  };
  std::vector<Task> tasks;
  for (size_t s = 0; s < seqs.size(); ++s)
    for (int h = 0; h < KVH; ++h)
      for (int64_t t0 = 0; t0 < seqs[s].n_tokens; t0 += k_tok_block)
        tasks.push_back({s, h, t0, std::min(seqs[s].n_tokens, t0 + k_tok_block)});
  tp.parallel_for(int64_t(tasks.size()), 1, [&](int64_t a, int64_t b) {
    std::vector<float> K, V, w;
    for (int64_t ti = a; ti < b; ++ti) {
      const Task& task = tasks[size_t(ti)];
      const SeqAttn& s = seqs[task.seq];
      const int64_t n_pos = s.pos_start + task.t1;
      K.resize(size_t(n_pos * D));
      V.resize(size_t(n_pos * D));
      w.resize(size_t(n_pos));
      kv_read(L, pool, layer, 0, task.kv_head, s.page_table, n_pos, K.data());
      kv_read(L, pool, layer, 1, task.kv_head, s.page_table, n_pos, V.data());
      for (int64_t t = task.t0; t < task.t1; ++t) {
        const int64_t pos = s.pos_start + t;
        const int64_t lo = sliding_window > 0 ? std::max<int64_t>(0, pos - sliding_window + 1) : 0;
        for (int g = 0; g < group; ++g) {
          const int h = task.kv_head * group + g;
          const float* qv = q + ((s.token_begin + t) * n_heads + h) * D;
          float mx = -INFINITY;
          for (int64_t p = lo; p <= pos; ++p) {
            const float* kv = K.data() + p * D;
            float d = 0;
            for (int i = 0; i < D; ++i) d += qv[i] * kv[i];
            w[size_t(p)] = d * scale;
            mx = std::max(mx, w[size_t(p)]);
          }
          double sum = 0;
          for (int64_t p = lo; p <= pos; ++p) {
            w[size_t(p)] = std::exp(w[size_t(p)] - mx);
            sum += w[size_t(p)];
          }
          const float inv = float(1.0 / sum);
          float* o = out + ((s.token_begin + t) * n_heads + h) * D;
          std::fill(o, o + D, 0.0f);
          for (int64_t p = lo; p <= pos; ++p) {
            const float pw = w[size_t(p)] * inv;
            const float* vv = V.data() + p * D;
            for (int i = 0; i < D; ++i) o[i] += pw * vv[i];
          }
        }
      }
    }
  });
}

}  // namespace exl::cpu
