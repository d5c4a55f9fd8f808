#include "engine/formats/exl2_loader.h"

#include <cmath>
#include <string>
#include <vector>

#include "engine/formats/tensor_access.h"
#include "kernels/half.h"

namespace exl {

namespace {

constexpr std::string_view k_exl2 = "exl2";

std::string exl2_where(const TensorView& t) { return tensor_where(k_exl2, t); }

void check_dtype(const TensorView& t, DType want) {
  EXL_CHECK(t.info->dtype == want, exl2_where(t), "has dtype ", to_string(t.info->dtype), ", expected ", to_string(want));
}

void check_shape(const TensorView& t, const std::vector<int64_t>& want, std::string_view meaning) {
  EXL_CHECK(t.info->shape == want, exl2_where(t), "has shape ", shape_to_string(t.info->shape), ", expected ",
            shape_to_string(want), " (", meaning, ")");
}

int64_t min_group_rows(int bits) { return bits == 2 ? 16 : 32; }

// Parses (bits, qrow_start) pairs into groups and checks the layout rules of §1.5.
std::vector<Exl2Group> parse_groups(const TensorView& t, int64_t q_rows) {
  check_dtype(t, DType::i16);
  EXL_CHECK(t.info->shape.size() == 1, exl2_where(t), "has rank ", t.info->shape.size(), ", expected 1 ([2·groups])");
  const int64_t n = t.info->shape[0];
  EXL_CHECK(n >= 2 && n % 2 == 0, exl2_where(t), "has ", n, " elements, expected a positive even count of ",
            "(bits, qrow_start) pairs");
  const auto* raw = tensor_data<uint16_t>(t, k_exl2);
  const int64_t num_groups = n / 2;
  std::vector<Exl2Group> groups(static_cast<size_t>(num_groups));
  for (int64_t g = 0; g < num_groups; ++g) {
    const int64_t bits = int16_t(raw[2 * g]);
    const int64_t qrow = raw[2 * g + 1];
    EXL_CHECK(is_exl2_bit_width(bits), exl2_where(t), "group ", g, " has bit width ", bits,
              ", expected one of 2, 3, 4, 5, 6, 8");
    groups[g].bits = int(bits);
    groups[g].qrow_start = qrow;
    if (g == 0) {
      EXL_CHECK(qrow == 0, exl2_where(t), "group 0 starts at q_weight row ", qrow, ", expected 0");
      continue;
    }
    EXL_CHECK(bits <= groups[g - 1].bits, exl2_where(t), "groups are not sorted by bit width descending: group ", g,
              " has ", bits, " bits after group ", g - 1, " with ", groups[g - 1].bits);
    EXL_CHECK(qrow > groups[g - 1].qrow_start, exl2_where(t), "qrow_start is not strictly increasing: group ", g,
              " starts at q_weight row ", qrow, ", group ", g - 1, " at ", groups[g - 1].qrow_start);
  }
  EXL_CHECK(groups.back().qrow_start < q_rows, exl2_where(t), "last group starts at q_weight row ",
            groups.back().qrow_start, " but q_weight has only ", q_rows, " rows");
  int64_t row = 0;
  for (int64_t g = 0; g < num_groups; ++g) {
    Exl2Group& gr = groups[g];
    const int64_t end = g + 1 < num_groups ? groups[g + 1].qrow_start : q_rows;
    const int64_t bits_total = (end - gr.qrow_start) * 32;
    EXL_CHECK(bits_total % gr.bits == 0, exl2_where(t), "group ", g, " spans ", end - gr.qrow_start,
              " q_weight rows, which is not a whole number of ", gr.bits, "-bit rows");
    gr.rows = bits_total / gr.bits;
    gr.row_start = row;
    row += gr.rows;
    if (g + 1 < num_groups)
      EXL_CHECK(gr.rows % min_group_rows(gr.bits) == 0, exl2_where(t), "group ", g, " has ", gr.rows, " rows at ",
                gr.bits, " bits, not a multiple of ", min_group_rows(gr.bits), " (only the last group may be shorter)");
  }
  return groups;
}

// perm = argsort(invperm), checking that invperm is a permutation of [0, K).
std::vector<int32_t> perm_from_invperm(const TensorView& t, int64_t k) {
  EXL_CHECK(t.info->dtype == DType::i32 || t.info->dtype == DType::i16, exl2_where(t), "has dtype ",
            to_string(t.info->dtype), ", expected I32 (or I16)");
  check_shape(t, {k}, "in_features");
  std::vector<int32_t> perm(size_t(k), -1);
  auto place = [&](int64_t orig, int64_t pos) {
    EXL_CHECK(pos >= 0 && pos < k, exl2_where(t), "is not a permutation: entry ", orig, " is ", pos,
              ", outside [0, ", k, ")");
    EXL_CHECK(perm[pos] < 0, exl2_where(t), "is not a permutation: value ", pos, " appears at entries ", perm[pos],
              " and ", orig);
    perm[pos] = int32_t(orig);
  };
  if (t.info->dtype == DType::i32) {
    const auto* p = tensor_data<int32_t>(t, k_exl2);
    for (int64_t i = 0; i < k; ++i) place(i, p[i]);
  } else {
    const auto* p = tensor_data<uint16_t>(t, k_exl2);
    for (int64_t i = 0; i < k; ++i) place(i, p[i]);
  }
  return perm;
}

}  // namespace

bool is_exl2_bit_width(int64_t bits) {
  return bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
}

Exl2Matrix load_exl2_matrix(const ModelDir& dir, std::string_view prefix, int64_t in_features,
                            int64_t out_features) {
  EXL_CHECK(in_features > 0 && out_features > 0, "engine: exl2: layer '", prefix, "': expected dimensions [",
            out_features, ", ", in_features, "] must be positive");
  Exl2Matrix m;
  m.in_features = in_features;
  m.out_features = out_features;
  m.padded_out = (out_features + 31) / 32 * 32;

  TensorView qw = need_layer_tensor(dir, k_exl2, prefix, "q_weight");
  check_dtype(qw, DType::i32);
  EXL_CHECK(qw.info->shape.size() == 2, exl2_where(qw), "has rank ", qw.info->shape.size(), ", expected 2 ([QR, Np])");
  EXL_CHECK(qw.info->shape[1] == m.padded_out, exl2_where(qw), "has ", qw.info->shape[1], " columns, expected ",
            m.padded_out, " (out_features ", out_features, " padded to 32)");
  m.q_rows = qw.info->shape[0];
  EXL_CHECK(m.q_rows > 0, exl2_where(qw), "has no rows");
  m.q_weight = tensor_data<uint32_t>(qw, k_exl2);

  TensorView qg = need_layer_tensor(dir, k_exl2, prefix, "q_groups");
  m.groups = parse_groups(qg, m.q_rows);
  const int64_t rows = m.groups.back().row_start + m.groups.back().rows;
  EXL_CHECK(rows == in_features, exl2_where(qg), "groups cover ", rows, " rows (from q_groups and q_weight's ",
            m.q_rows, " rows), expected in_features = ", in_features);
  const int64_t num_groups = int64_t(m.groups.size());

  m.perm = perm_from_invperm(need_layer_tensor(dir, k_exl2, prefix, "q_invperm"), in_features);

  TensorView qs = need_layer_tensor(dir, k_exl2, prefix, "q_scale");
  check_dtype(qs, DType::i32);
  check_shape(qs, {num_groups, m.padded_out / 8}, "groups × padded out_features / 8");
  m.q_scale = tensor_data<uint32_t>(qs, k_exl2);

  TensorView qm = need_layer_tensor(dir, k_exl2, prefix, "q_scale_max");
  check_dtype(qm, DType::f16);
  check_shape(qm, {num_groups}, "groups");
  m.q_scale_max = tensor_data<uint16_t>(qm, k_exl2);
  for (int64_t g = 0; g < num_groups; ++g)
    EXL_CHECK(std::isfinite(half_to_float(m.q_scale_max[g])), exl2_where(qm), "group ", g, " has non-finite value ",
              half_to_float(m.q_scale_max[g]));

  m.bias = load_linear_bias(dir, prefix, out_features, k_exl2);
  return m;
}

}  // namespace exl
