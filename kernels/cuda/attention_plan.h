// Host-side planning of one paged attention call on the GPU: validates the batch, flattens the
// sequences and page tables into device-ready arrays, and splits the work into AttnWork blocks
// (paged_attention.h). Positions are split into partitions only when the batch alone would not
// fill the device (decode, short prompts), which is the flash-decoding scheme; otherwise every
// block covers its rows' whole context and writes the output directly. Host code only.
//
// A step replayed as a CUDA graph (step_graph.h) stages the plan's arrays as per-step data, but
// their sizes and the grid are part of the graph. So that a context growing by one position per
// step does not need a new graph every partition, the shape depends on the context through
// buckets: without a sliding window (or with one that covers the context), a split plan has a
// power-of-two max_parts and a work for every (sequence, kv head, row block, partition below
// max_parts) — a partition past a block's last position leaves its partials empty (sum 0), which
// attention_combine does not read — and the page tables are padded with page 0 to a power-of-two
// count of at least k_attn_min_pages. The partitions themselves (part_size) are those of the exact
// context, so no row's result changes.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/paged_attention.h"

namespace exl::cuda {

struct AttnPlan {
  std::vector<AttnSeqDesc> seqs;
  std::vector<int32_t> pages;      // every sequence's page table, concatenated, then padding
  std::vector<AttnWork> works;
  std::vector<int32_t> token_pos;  // [n_tokens] position of each query row, −1 where no sequence has it
  int n_tokens = 0;                // 1 + the last query row any sequence uses
  int part_size = 0;               // positions per partition, a multiple of k_attn_tile
  int max_parts = 1;               // partials per row: above the last partition any row needs, bucketed
  bool direct = true;
  bool decode = false;             // attention_decode's plan: grid (kv heads, seqs, max_parts), no works
};

// Smallest partition when splitting: one K/V tile (decode at short context is latency-bound: a
// block per tile plus the combine pass measured fastest on the H200).
inline constexpr int k_attn_min_part = 32;
// Fewest entries of AttnPlan::pages (padding included).
inline constexpr int k_attn_min_pages = 16;

// `target_blocks`: how many blocks keep the device busy (about 2 per multiprocessor).
// Throws exl::Error on an inconsistent batch (page table too short, page id out of range, ...).
// `min_part`: the smallest partition (a multiple of k_attn_tile, at least k_attn_tile).
// `decode_ok`: the cache format and head_dim suit attention_decode; the plan is then a decode plan
// when every sequence has at most one query token and the group is at most k_attn_decode_max_group,
// with partitions of `decode_part` positions (k_attn_decode_part, _short or _stream; 0: the
// streaming kernel's when there are at least k_attn_decode_stream_from (kv head, sequence) pairs
// per multiprocessor (target_blocks / 2 multiprocessors), else the short ones when the context spans
// several long ones and the grid would still have fewer than k_attn_decode_short_below blocks —
// b=1 at 512–1024 positions gained 4–5% on the H200, larger grids lost up to 6%).
// `decode_max_positions`: when no sequence has more query tokens than this (a speculative verify
// pass), each token is planned as a sequence of its own (AttnPlan::seqs: n_tokens 1, its own
// position, its sequence's page table — entries shared by consecutive sequences of one table, so
// that AttnPlan::pages grows with the context, not with the positions), so that such a pass attends as a decode step
// does: with attention_decode where it serves, else with the tiled kernel's one-row blocks
// (H200, demo model, head_dim 64: 19 µs per call for 2–6 positions in one sequence's blocks,
// 12.7 µs for one).
// `rows_per_work`: query rows per AttnWork (k_attn_rows for the tiled kernel, k_flash_rows for
// flash_attention.h's).
inline constexpr int64_t k_attn_decode_short_below = 64;
inline constexpr int64_t k_attn_decode_stream_from = 1;
inline constexpr int k_attn_decode_max_positions = 16;
AttnPlan plan_attention(std::span<const SeqAttn> seqs, int n_heads, int n_kv_heads, int page_size, int num_pages,
                        int window, int target_blocks, int min_part = k_attn_min_part, bool decode_ok = false,
                        int decode_part = 0, int decode_max_positions = 1, int rows_per_work = k_attn_rows);

}  // namespace exl::cuda
