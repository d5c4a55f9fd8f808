#include "kernels/cuda/attention_plan.h"

#include <algorithm>
#include <limits>

#include "kernels/error.h"
#include "kernels/int_math.h"

namespace exl::cuda {

namespace {

void validate(std::span<const SeqAttn> seqs, int n_heads, int n_kv_heads, int page_size, int num_pages) {
  EXL_CHECK(n_kv_heads > 0 && n_heads > 0 && n_heads % n_kv_heads == 0, "kernels: cuda: attention: ", n_heads,
            " query heads are not a multiple of ", n_kv_heads, " kv heads");
  for (size_t i = 0; i < seqs.size(); ++i) {
    const SeqAttn& s = seqs[i];
    EXL_CHECK(s.token_begin >= 0 && s.n_tokens >= 0 && s.pos_start >= 0, "kernels: cuda: attention: sequence ", i,
              ": negative token_begin, n_tokens or pos_start");
    const int64_t ctx = s.pos_start + s.n_tokens;
    EXL_CHECK(ctx < std::numeric_limits<int32_t>::max() && s.token_begin + s.n_tokens < std::numeric_limits<int32_t>::max(),
              "kernels: cuda: attention: sequence ", i, ": positions beyond int32");
    EXL_CHECK(int64_t(s.page_table.size()) * page_size >= ctx, "kernels: cuda: attention: sequence ", i,
              ": page table holds ", s.page_table.size(), " pages of ", page_size, " slots, fewer than its ", ctx,
              " positions");
    const int64_t used = s.n_tokens > 0 ? ceil_div(ctx, page_size) : 0;
    for (int64_t p = 0; p < used; ++p)
      EXL_CHECK(s.page_table[size_t(p)] >= 0 && s.page_table[size_t(p)] < num_pages, "kernels: cuda: attention: sequence ",
                i, ": page ", s.page_table[size_t(p)], " is outside the pool of ", num_pages, " pages");
  }
}

}  // namespace

AttnPlan plan_attention(std::span<const SeqAttn> seqs, int n_heads, int n_kv_heads, int page_size, int num_pages,
                        int window, int target_blocks, int min_part, bool decode_ok, int decode_part,
                        int decode_max_positions, int rows_per_work) {
  min_part = std::max(k_attn_tile, min_part / k_attn_tile * k_attn_tile);
  validate(seqs, n_heads, n_kv_heads, page_size, num_pages);
  const bool few = std::all_of(seqs.begin(), seqs.end(), [&](const SeqAttn& s) { return s.n_tokens <= decode_max_positions; });
  if (few && std::any_of(seqs.begin(), seqs.end(), [](const SeqAttn& s) { return s.n_tokens > 1; })) {
    std::vector<SeqAttn> rows;
    for (const SeqAttn& s : seqs)
      if (s.n_tokens == 0) rows.push_back(s);
      else
        for (int64_t t = 0; t < s.n_tokens; ++t) rows.push_back({s.token_begin + t, 1, s.pos_start + t, s.page_table});
    return plan_attention(rows, n_heads, n_kv_heads, page_size, num_pages, window, target_blocks, min_part, decode_ok,
                          decode_part, 1, rows_per_work);
  }
  const int group = n_heads / n_kv_heads;
  AttnPlan plan;
  int64_t base_blocks = 0, max_ctx = 0, n_tokens = 0;
  for (const SeqAttn& s : seqs) {
    if (s.n_tokens == 0) continue;
    base_blocks += n_kv_heads * ceil_div(s.n_tokens * group, rows_per_work);
    max_ctx = std::max(max_ctx, s.pos_start + s.n_tokens);
    n_tokens = std::max(n_tokens, s.token_begin + s.n_tokens);
  }
  plan.n_tokens = int(n_tokens);
  plan.decode = decode_ok && n_tokens > 0 && group <= k_attn_decode_max_group &&
                std::all_of(seqs.begin(), seqs.end(), [](const SeqAttn& s) { return s.n_tokens <= 1; });
  if (plan.decode) {
    if (decode_part == 0) {
      int64_t rows = 0;
      for (const SeqAttn& s : seqs) rows += s.n_tokens;
      const int64_t blocks = n_kv_heads * rows * ceil_div(max_ctx, k_attn_decode_part);
      decode_part = n_kv_heads * rows >= int64_t(target_blocks) * k_attn_decode_stream_from / 2
                        ? k_attn_decode_part_stream
                    : max_ctx > k_attn_decode_part && blocks < k_attn_decode_short_below ? k_attn_decode_part_short
                                                                                          : k_attn_decode_part;
    }
    EXL_CHECK(attention_decode_part(decode_part), "kernels: cuda: attention plan: decode partitions of ", decode_part,
              " positions");
    plan.part_size = decode_part;
    plan.max_parts = int(ceil_div(max_ctx, decode_part));
    for (const SeqAttn& s : seqs) {
      const int64_t lo = window > 0 ? std::max<int64_t>(0, s.pos_start - window + 1) : 0;
      if (s.n_tokens == 1 && lo / decode_part != s.pos_start / decode_part) plan.direct = false;
    }
    if (!plan.direct && (window <= 0 || window >= max_ctx)) plan.max_parts = int(pow2_ceil(plan.max_parts));
  }
  const int64_t direct_part = std::max<int64_t>(k_attn_tile, ceil_div(max_ctx, k_attn_tile) * k_attn_tile);
  if (!plan.decode) plan.part_size = int(direct_part);
  if (!plan.decode && base_blocks > 0 && base_blocks < target_blocks && max_ctx > min_part) {
    const int64_t want = ceil_div(target_blocks, base_blocks);
    const int64_t part = std::max<int64_t>(min_part, ceil_div(ceil_div(max_ctx, want), k_attn_tile) * k_attn_tile);
    if (part < max_ctx) {
      plan.part_size = int(part);
      plan.direct = false;
      plan.max_parts = int(ceil_div(max_ctx, part));
      if (window <= 0 || window >= max_ctx) plan.max_parts = int(pow2_ceil(plan.max_parts));
    }
  }
  const bool all_parts = !plan.direct && (window <= 0 || window >= max_ctx);  // no row's window starts above 0

  plan.token_pos.assign(size_t(n_tokens), -1);
  // Sequences with the same page table (a verify pass's rows) share its entries: the last ones
  // inserted grow to the longest context among them.
  const int32_t* last_table = nullptr;
  int64_t last_offset = 0, last_used = 0;
  for (size_t si = 0; si < seqs.size(); ++si) {
    const SeqAttn& s = seqs[si];
    const int64_t ctx = s.pos_start + s.n_tokens;
    const int64_t used = s.n_tokens > 0 ? ceil_div(ctx, page_size) : 0;
    if (!last_table || s.page_table.data() != last_table) {
      last_table = s.page_table.data(), last_offset = int64_t(plan.pages.size()), last_used = 0;
    }
    if (used > last_used) {
      plan.pages.insert(plan.pages.end(), s.page_table.begin() + last_used, s.page_table.begin() + used);
      last_used = used;
    }
    plan.seqs.push_back({int32_t(s.token_begin), int32_t(s.n_tokens), int32_t(s.pos_start), int32_t(last_offset)});
    for (int64_t t = 0; t < s.n_tokens; ++t) plan.token_pos[size_t(s.token_begin + t)] = int32_t(s.pos_start + t);
    if (plan.decode) continue;  // attention_decode's grid covers the sequences itself
    const int64_t rows = s.n_tokens * group;
    for (int h = 0; h < n_kv_heads; ++h)
      for (int64_t r0 = 0; r0 < rows; r0 += rows_per_work) {
        const int64_t pos_first = s.pos_start + r0 / group;
        const int64_t pos_last = s.pos_start + (std::min(rows, r0 + rows_per_work) - 1) / group;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, pos_first - window + 1) : 0;
        const int64_t p_begin = plan.direct || all_parts ? 0 : lo / plan.part_size;
        const int64_t p_end = plan.direct ? 0 : all_parts ? plan.max_parts - 1 : pos_last / plan.part_size;
        for (int64_t p = p_begin; p <= p_end; ++p)
          plan.works.push_back({int32_t(si), int32_t(h), int32_t(r0), int32_t(p)});
      }
  }
  plan.pages.resize(size_t(pow2_ceil(std::max<int64_t>(k_attn_min_pages, int64_t(plan.pages.size())))), 0);
  return plan;
}

}  // namespace exl::cuda
