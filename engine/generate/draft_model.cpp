#include "engine/generate/draft_model.h"

#include <algorithm>

#include "kernels/error.h"

namespace exl {

void check_same_vocabulary(const Tokenizer& target, const Tokenizer& draft) {
  EXL_CHECK(target.vocab_size() == draft.vocab_size(), "engine: draft model: its vocabulary has ",
            draft.vocab_size(), " tokens, the target's ", target.vocab_size(), " (a draft needs the same tokenizer)");
  for (int32_t t = 0; t < target.vocab_size(); ++t)
    EXL_CHECK(target.token_bytes(t) == draft.token_bytes(t) && target.is_special(t) == draft.is_special(t),
              "engine: draft model: token ", t, " differs from the target's (a draft needs the same tokenizer)");
}

DraftModel::DraftModel(Model& model, int num_pages, int page_size, KvFormat format) : model_(model) {
  EXL_CHECK(num_pages > 0 && page_size > 0, "engine: draft model: num_pages and page_size must be positive");
  const KvLayout layout = model.kv_layout(format, page_size);
  pool_ = model.alloc_kv_pool(format, page_size, num_pages);
  CacheConfig pc;
  pc.n_layers = layout.n_layers;
  pc.n_kv_heads = layout.n_kv_heads;
  pc.head_dim = layout.head_dim;
  pc.page_size = page_size;
  pc.n_pages = num_pages;
  pc.format = format;
  pc.model_hash = std::hash<std::string>{}(model.identity());
  cache_ = std::make_unique<PageCache>(pc);
}

DraftModel::~DraftModel() = default;

DraftModel::Slot DraftModel::open() {
  const Slot s = next_++;
  slots_[s].seq = cache_->create_sequence();
  return s;
}

void DraftModel::close(Slot slot) {
  auto it = slots_.find(slot);
  if (it == slots_.end()) return;
  cache_->release(it->second.seq);
  slots_.erase(it);
}

DraftModel::Logits DraftModel::next_logits(std::span<const Slot> slots,
                                           std::span<const std::span<const int32_t>> contexts, int64_t max_tokens) {
  EXL_CHECK(slots.size() == contexts.size(), "engine: draft model: ", slots.size(), " slots for ", contexts.size(),
            " contexts");
  Logits out;
  out.ready.assign(slots.size(), false);
  std::vector<ForwardSeq> batch;
  std::vector<size_t> in_batch;
  std::vector<std::pair<size_t, size_t>> kept;  // (lcp, fed up to) per batch entry
  int64_t budget = max_tokens;
  for (size_t i = 0; i < slots.size(); ++i) {
    auto it = slots_.find(slots[i]);
    EXL_CHECK(it != slots_.end(), "engine: draft model: unknown slot ", slots[i]);
    State& st = it->second;
    const std::span<const int32_t> ctx = contexts[i];
    if (ctx.empty()) continue;
    size_t lcp = size_t(std::mismatch(st.fed.begin(), st.fed.end(), ctx.begin(), ctx.end()).first - st.fed.begin());
    lcp = std::min(lcp, ctx.size() - 1);  // at least the last token is fed, for its logits
    const size_t n = std::min<size_t>(ctx.size() - lcp, size_t(std::max<int64_t>(budget, 0)));
    if (n == 0) continue;
    if (!cache_->reserve(st.seq, int(lcp + n))) {
      cache_->release(st.seq);
      st.seq = cache_->create_sequence();
      st.fed.clear();
      continue;
    }
    budget -= int64_t(n);
    ForwardSeq s;
    s.tokens = ctx.subspan(lcp, n);
    s.pos_start = int64_t(lcp);
    s.page_table = cache_->page_table(st.seq);
    batch.push_back(s);
    in_batch.push_back(i);
    kept.emplace_back(lcp, lcp + n);
  }
  if (batch.empty()) return out;
  std::vector<float> logits;
  try {
    logits = model_.forward(batch, *pool_);
  } catch (...) {
    for (size_t b = 0; b < in_batch.size(); ++b) {
      State& st = slots_.at(slots[in_batch[b]]);
      st.fed.resize(std::min(st.fed.size(), kept[b].first));
    }
    throw;
  }
  const size_t V = size_t(model_.vocab_size());
  out.rows.assign(slots.size() * V, 0.0f);
  for (size_t b = 0; b < in_batch.size(); ++b) {
    const size_t i = in_batch[b];
    State& st = slots_.at(slots[i]);
    st.fed.resize(kept[b].first);
    st.fed.insert(st.fed.end(), contexts[i].begin() + ptrdiff_t(kept[b].first), contexts[i].begin() + ptrdiff_t(kept[b].second));
    if (kept[b].second != contexts[i].size()) continue;
    out.ready[i] = true;
    std::copy_n(logits.begin() + ptrdiff_t(b * V), V, out.rows.begin() + ptrdiff_t(i * V));
  }
  return out;
}

}  // namespace exl
