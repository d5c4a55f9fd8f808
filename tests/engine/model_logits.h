// Logits of a token sequence run through a Model in chunks, and their comparison, for the tests that
// compare two ways of running one model (over a split, over tensor-parallel ranks, one device).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/model.h"

namespace exl::test {

// All logits of `ids` in chunks of `chunk` tokens (0: one prefill) into a fresh pool of `fmt`
// (16-token pages) through a scrambled page table.
inline std::vector<float> run_chunked(Model& m, const std::vector<int32_t>& ids, int64_t chunk,
                                      KvFormat fmt = KvFormat::fp16) {
  const int pages = int((ids.size() + 15) / 16);
  auto pool = m.alloc_kv_pool(fmt, 16, pages + 2);
  std::vector<int32_t> table;
  for (int i = 0; i < pages; ++i) table.push_back(pages + 1 - i);
  std::vector<float> out;
  if (chunk <= 0) chunk = int64_t(ids.size());
  for (size_t b = 0; b < ids.size(); b += size_t(chunk)) {
    const size_t e = std::min(ids.size(), b + size_t(chunk));
    ForwardSeq s{std::span<const int32_t>(ids).subspan(b, e - b), int64_t(b), table, true};
    auto l = m.forward(std::span<const ForwardSeq>(&s, 1), *pool);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

}  // namespace exl::test
