#include "engine/formats/exl2_writer.h"

#include <algorithm>

#include "engine/formats/exl2_loader.h"
#include "kernels/error.h"

namespace exl {

std::vector<Exl2Group> make_exl2_groups(std::span<const std::pair<int, int64_t>> bits_rows, int64_t in_features) {
  std::vector<Exl2Group> out;
  int64_t row = 0, qrow = 0;
  for (size_t g = 0; g < bits_rows.size(); ++g) {
    const auto [bits, rows] = bits_rows[g];
    EXL_CHECK(is_exl2_bit_width(bits), "engine: exl2 writer: group ", g, ": unsupported width ", bits);
    EXL_CHECK(g == 0 || bits <= bits_rows[g - 1].first, "engine: exl2 writer: group ", g, ": widths must descend (",
              bits_rows[g - 1].first, " then ", bits, ")");
    const int64_t step = bits == 2 ? 16 : 32;
    const bool last = g + 1 == bits_rows.size();
    EXL_CHECK(rows > 0 && (last || rows % step == 0), "engine: exl2 writer: group ", g, ": ", rows,
              " rows (must be a positive multiple of ", step, " except in the last group)");
    EXL_CHECK(rows * bits % 32 == 0, "engine: exl2 writer: group ", g, ": ", rows, " rows of ", bits,
              " bits do not fill whole 32-bit words");
    out.push_back({bits, row, rows, qrow});
    row += rows;
    qrow += rows * bits / 32;
  }
  EXL_CHECK(row == in_features, "engine: exl2 writer: groups cover ", row, " rows, expected ", in_features);
  return out;
}

Exl2Tensors make_exl2_tensors(int64_t in_features, int64_t out_features, std::vector<Exl2Group> groups,
                              std::vector<int32_t> perm) {
  EXL_CHECK(in_features > 0 && out_features > 0, "engine: exl2 writer: bad shape ", out_features, "x", in_features);
  EXL_CHECK(int64_t(perm.size()) == in_features, "engine: exl2 writer: perm has ", perm.size(), " entries, expected ",
            in_features);
  std::vector<char> seen(size_t(in_features), 0);
  for (int32_t p : perm) {
    EXL_CHECK(p >= 0 && p < in_features && !seen[size_t(p)], "engine: exl2 writer: perm is not a permutation of [0, ",
              in_features, ")");
    seen[size_t(p)] = 1;
  }
  Exl2Tensors t;
  t.in_features = in_features;
  t.out_features = out_features;
  t.padded_out = (out_features + 31) / 32 * 32;
  for (const auto& g : groups) t.q_rows += g.rows * g.bits / 32;
  t.groups = std::move(groups);
  t.perm = std::move(perm);
  t.q_weight.assign(size_t(t.q_rows * t.padded_out), 0);
  t.q_scale.assign(t.groups.size() * size_t(t.padded_out / 8), 0);
  t.q_scale_max.assign(t.groups.size(), 0);
  for (const Exl2Group& gr : t.groups) {
    // Every column of a group holds the same words: its rows' zero points packed, low bits first.
    const int64_t words = gr.rows * gr.bits / 32;
    const uint64_t zero = uint64_t(1) << (gr.bits - 1);
    uint64_t acc = 0;
    int filled = 0;
    int64_t w = 0;
    for (int64_t j = 0; j < gr.rows; ++j) {
      acc |= zero << filled;
      filled += gr.bits;
      if (filled >= 32) {
        const auto row = t.q_weight.begin() + (gr.qrow_start + w++) * t.padded_out;
        std::fill(row, row + t.padded_out, uint32_t(acc));
        acc >>= 32;
        filled -= 32;
      }
    }
    EXL_CHECK(w == words && filled == 0, "engine: exl2 writer: group of ", gr.rows, " rows of ", gr.bits,
              " bits does not fill whole words");
  }
  return t;
}

void set_code(Exl2Tensors& t, size_t g, int64_t j, int64_t n, uint32_t q) {
  const Exl2Group& gr = t.groups[g];
  const int64_t bit = j * gr.bits;
  const int shift = int(bit % 32);
  const uint32_t mask = (1u << gr.bits) - 1u;
  uint32_t& lo = t.q_weight[size_t((gr.qrow_start + bit / 32) * t.padded_out + n)];
  lo = (lo & ~(mask << shift)) | ((q & mask) << shift);
  if (shift + gr.bits > 32) {
    uint32_t& hi = t.q_weight[size_t((gr.qrow_start + bit / 32 + 1) * t.padded_out + n)];
    const int spill = shift + gr.bits - 32;
    const uint32_t hmask = (1u << spill) - 1u;
    hi = (hi & ~hmask) | ((q & mask) >> (32 - shift));
  }
}

void set_scale_code(Exl2Tensors& t, size_t g, int64_t n, uint32_t code) {
  uint32_t& w = t.q_scale[g * size_t(t.padded_out / 8) + size_t(n / 8)];
  const int shift = int(4 * (n % 8));
  w = (w & ~(15u << shift)) | ((code & 15u) << shift);
}

Exl2Matrix Exl2Tensors::view() const {
  Exl2Matrix m;
  m.in_features = in_features;
  m.out_features = out_features;
  m.padded_out = padded_out;
  m.q_rows = q_rows;
  m.q_weight = q_weight.data();
  m.q_scale = q_scale.data();
  m.q_scale_max = q_scale_max.data();
  m.groups = groups;
  m.perm = perm;
  return m;
}

std::vector<int16_t> Exl2Tensors::q_groups() const {
  std::vector<int16_t> out;
  for (const auto& g : groups) {
    EXL_CHECK(g.qrow_start <= INT16_MAX, "engine: exl2 writer: q_weight row ", g.qrow_start,
              " does not fit q_groups' int16 (layer too large for EXL2)");
    out.push_back(int16_t(g.bits));
    out.push_back(int16_t(g.qrow_start));
  }
  return out;
}

std::vector<int32_t> Exl2Tensors::q_invperm() const {
  std::vector<int32_t> inv(perm.size());
  for (size_t j = 0; j < perm.size(); ++j) inv[size_t(perm[j])] = int32_t(j);
  return inv;
}

int64_t Exl2Tensors::storage_bytes() const {
  const int64_t G = int64_t(groups.size());
  return 4 * int64_t(q_weight.size()) + 4 * int64_t(q_scale.size()) + 2 * G + 4 * G + 4 * in_features;
}

}  // namespace exl
