// A draft model: a smaller model with the target's vocabulary that proposes the tokens a
// Generator's speculating jobs check in one target pass (Speculation::draft,
// engine/generate/speculation.h). It keeps, per job, the K/V of a prefix of the job's context in
// pages of its own, so each proposal feeds only what the job emitted since the last one.
//
// Invariants: a slot's K/V hold exactly the tokens next_logits last fed it (positions 0..n);
// a context that diverges from them (a rejected draft) reuses their longest common prefix and
// overwrites the rest. A slot that cannot get pages gives its pages back and drafts nothing that
// round (the target's output never depends on the draft).
// Thread-safety: one Generator's stepping thread.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/generate/page_cache.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"

namespace exl {

// Throws exl::Error unless `draft` has `target`'s vocabulary: the same size and every token the
// same bytes and specialness (naming the first token that differs).
void check_same_vocabulary(const Tokenizer& target, const Tokenizer& draft);

class DraftModel {
 public:
  using Slot = uint64_t;

  // `model` outlives this object. num_pages pages of page_size tokens for all slots together.
  DraftModel(Model& model, int num_pages, int page_size, KvFormat format);
  ~DraftModel();
  DraftModel(const DraftModel&) = delete;
  DraftModel& operator=(const DraftModel&) = delete;

  Model& model() { return model_; }
  Slot open();
  void close(Slot slot);

  // One batched forward of the draft model: for each i, the logits after contexts[i] (prompt and
  // tokens so far, including any draft so far) in row i of the result ([n, vocab]), or ready[i]
  // false when slot i could not catch up this round (its new tokens beyond `max_tokens` in all,
  // or no pages). Slots must be distinct.
  struct Logits {
    std::vector<float> rows;
    std::vector<bool> ready;
  };
  Logits next_logits(std::span<const Slot> slots, std::span<const std::span<const int32_t>> contexts,
                     int64_t max_tokens);

 private:
  struct State {
    SeqId seq = 0;
    std::vector<int32_t> fed;
  };
  Model& model_;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<PageCache> cache_;
  std::unordered_map<Slot, State> slots_;
  Slot next_ = 1;
};

}  // namespace exl
