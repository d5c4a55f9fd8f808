// The converter's sensitivity measure (quantize_model.h, step 2): the mean KL divergence of the
// final logits of hidden states from a reference's, the reference's logits and log-normalizers
// computed once. Logits come from the CalibModel's head, `row_tokens` tokens per call (one
// calibration row); the per-token terms are computed on `pool` and summed in token order, so the
// result does not depend on the thread count.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace exl {

class CalibModel;
class ThreadPool;

struct KlReference {
  std::vector<float> logits;  // [T, vocab]
  std::vector<double> lse;    // [T] log Σ exp(logits)
  int64_t row_tokens = 0;
};

// The reference of final hidden states x_ref [T, hidden].
KlReference kl_reference(const CalibModel& cm, std::span<const float> x_ref, int64_t row_tokens, ThreadPool& pool);
// Mean over tokens of KL(softmax(reference) ‖ softmax(head(x))), x [T, hidden]. Throws exl::Error
// when x has another token count than the reference.
double mean_kl(const CalibModel& cm, const KlReference& ref, std::span<const float> x, ThreadPool& pool);

}  // namespace exl
