// The layer placement of --gpu-split (engine/layer_split.h): greedy in-order fill against each
// device's budget, the embedding and head riding with the first and last layers, the automatic
// cache's largest page count, devices passed over, equal shares without bounds, errors that name
// the device and the bytes, and agreement with the one-device memory plan on a real model.
#include "engine/layer_split.h"

#include <gtest/gtest.h>

#include "kernels/error.h"
#include "test_support.h"

namespace exl {
namespace layer_split_test {

constexpr double k_gib = double(int64_t(1) << 30);

// A split whose budgets are exactly `bytes` (GB values with exact binary fractions).
GpuSplit budgets(std::vector<int64_t> bytes) {
  GpuSplit s;
  for (int64_t b : bytes) s.gb.push_back(double(b) / k_gib);
  s.n_devices = int(bytes.size());
  return s;
}

MemoryRequest request(int cache_pages) {
  MemoryRequest r;
  r.page_size = 16;
  r.cache_pages = cache_pages;
  r.max_step_tokens = 16;
  r.max_batch_seqs = 1;
  r.max_seq_len = 16 * 1000;
  r.cpu_default_pages = 1000;
  return r;
}

// 10 layers of 100 bytes, embedding 50, head 70, scratch 200, 1 byte per layer per page.
SplitSizes ten_layers() {
  SplitSizes s;
  s.layer_bytes.assign(10, 100);
  s.embedding_bytes = 50;
  s.head_bytes = 70;
  s.scratch_bytes = 200;
  s.layer_page_bytes = 1;
  return s;
}

LayerPlacement place(const SplitSizes& s, const MemoryRequest& r, const GpuSplit& g,
                     std::vector<std::optional<DeviceMemory>> mem = {}) {
  if (mem.empty()) mem.resize(size_t(g.n_devices));
  return place_layers(s, r, g, mem, "m");
}

TEST(LayerSplit, FillsDevicesInOrderUpToTheirBudgets) {
  // Device 0: scratch 200 + embedding 50 + 3 · (100 + 10 pages) = 580 exactly.
  auto p = place(ten_layers(), request(10), budgets({580, 100000}));
  ASSERT_TRUE(p.fits) << p.error;
  ASSERT_EQ(p.devices.size(), 2u);
  const DevicePlacement &d0 = p.devices[0], &d1 = p.devices[1];
  EXPECT_EQ(d0.layer_begin, 0);
  EXPECT_EQ(d0.layer_end, 3);
  EXPECT_TRUE(d0.embedding);
  EXPECT_FALSE(d0.head);
  EXPECT_EQ(d0.weight_bytes, 350);
  EXPECT_EQ(d0.page_bytes, 3);
  EXPECT_EQ(d0.cache_bytes, 30);
  EXPECT_EQ(d0.total_bytes(), 580);
  EXPECT_EQ(d1.layer_begin, 3);
  EXPECT_EQ(d1.layer_end, 10);
  EXPECT_FALSE(d1.embedding);
  EXPECT_TRUE(d1.head);
  EXPECT_EQ(d1.weight_bytes, 770);
  EXPECT_EQ(d1.cache_bytes, 70);
  EXPECT_EQ(p.cache_pages, 10);
  EXPECT_EQ(p.cache_tokens, 160);

  auto q = place(ten_layers(), request(10), budgets({579, 100000}));
  ASSERT_TRUE(q.fits);
  EXPECT_EQ(q.devices[0].layer_end, 2);  // one byte short of a third layer
  const auto r = q.used_ranges();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[1].second, (std::pair<int64_t, int64_t>{2, 10}));
}

TEST(LayerSplit, TheHeadStaysWithTheLastLayer) {
  // Device 1 holds layers 3..9 without the head (200 + 7 · 110 = 970) but not with it (+70).
  auto p = place(ten_layers(), request(10), budgets({580, 970, 100000}));
  ASSERT_TRUE(p.fits) << p.error;
  EXPECT_EQ(p.devices[1].layer_end, 9);
  EXPECT_FALSE(p.devices[1].head);
  EXPECT_EQ(p.devices[2].layer_begin, 9);
  EXPECT_EQ(p.devices[2].layer_end, 10);
  EXPECT_TRUE(p.devices[2].head);
  EXPECT_EQ(p.devices[2].weight_bytes, 170);
}

TEST(LayerSplit, AnAutomaticCacheTakesTheMostPagesAtWhichEveryLayerIsPlaced) {
  SplitSizes s;
  s.layer_bytes.assign(4, 100);
  s.layer_page_bytes = 1;
  // Two layers per device at 50 pages: 2 · (100 + 50) = 300; at 51 a device holds only one.
  auto p = place(s, request(0), budgets({300, 300}));
  ASSERT_TRUE(p.fits) << p.error;
  EXPECT_TRUE(p.cache_auto);
  EXPECT_EQ(p.cache_pages, 50);
  EXPECT_EQ(p.devices[0].layer_end, 2);
  EXPECT_EQ(p.devices[1].total_bytes(), 300);
}

TEST(LayerSplit, ADeviceTooSmallForAnyLayerIsPassedOver) {
  auto p = place(ten_layers(), request(10), budgets({300, 100000}));
  ASSERT_TRUE(p.fits) << p.error;
  EXPECT_FALSE(p.devices[0].used());
  EXPECT_EQ(p.devices[0].total_bytes(), 0);
  EXPECT_EQ(p.devices[1].layer_begin, 0);
  EXPECT_TRUE(p.devices[1].embedding && p.devices[1].head);
  ASSERT_EQ(p.used_ranges().size(), 1u);
  EXPECT_EQ(p.used_ranges()[0].first, 1);
}

TEST(LayerSplit, WithoutBoundsEveryDeviceGetsAnEqualShare) {
  SplitSizes s;
  s.layer_bytes.assign(5, 100);
  GpuSplit g;
  g.n_devices = 3;
  auto p = place(s, request(0), g);
  ASSERT_TRUE(p.fits);
  EXPECT_EQ(p.devices[0].layer_end, 2);
  EXPECT_EQ(p.devices[1].layer_end, 4);
  EXPECT_EQ(p.devices[2].layer_begin, 4);
  EXPECT_EQ(p.devices[2].layer_end, 5);
  EXPECT_EQ(p.cache_pages, 1000);  // the host default, capped
}

TEST(LayerSplit, FreeDeviceMemoryBoundsTheBudgetBelowItsGigabytes) {
  DeviceMemory m{1, size_t(k_margin_fixed) + 5000, 0};
  auto p = place(ten_layers(), request(10), budgets({100000, 100000}), {std::nullopt, m});
  EXPECT_EQ(p.devices[0].budget_bytes, 100000);
  EXPECT_EQ(p.devices[1].budget_bytes, 5000);
  EXPECT_EQ(p.devices[1].margin_bytes, k_margin_fixed);
}

TEST(LayerSplit, WhatDoesNotFitNamesTheLastDeviceAndTheBytes) {
  auto p = place(ten_layers(), request(10), budgets({580, 900}));
  ASSERT_FALSE(p.fits);
  // Device 1 takes layers 3..8 (200 + 6 · 110 = 860); layer 9 with the head (180) is left over.
  EXPECT_EQ(p.error,
            "engine: layer split: model 'm' does not fit 2 devices: layers 9..9 are left over, needing 170 B of "
            "weights + 10 B of cache (10 pages of 16 tokens, fp16) + 200 B of scratch on a fresh device, but "
            "device 1, the last, has 40 B left (900 B budget, 860 B placed); give the devices more (--gpu-split), "
            "or lower the cache size");
  EXPECT_THROW(check_fits(p), Error);
  // Automatic: device 1 holds 200 + 7 · (100 + P) + 70 ≤ 1000 at P ≤ 4 pages.
  auto fewer = place(ten_layers(), request(0), budgets({580, 1000}));
  ASSERT_TRUE(fewer.fits) << fewer.error;
  EXPECT_EQ(fewer.cache_pages, 4);
  auto tiny = place(ten_layers(), request(0), budgets({100, 100}));
  ASSERT_FALSE(tiny.fits);
  EXPECT_NE(tiny.error.find("the smallest automatic cache"), std::string::npos) << tiny.error;
  EXPECT_NE(tiny.error.find("layers 0..9 are left over"), std::string::npos) << tiny.error;
}

TEST(LayerSplit, BadSplitsAreErrors) {
  EXPECT_THROW(place(ten_layers(), request(1), GpuSplit{}), Error);  // no devices
  GpuSplit neg = budgets({100, 100});
  neg.gb[1] = -1;
  EXPECT_THROW(place(ten_layers(), request(1), neg), Error);
  EXPECT_THROW(place_layers(ten_layers(), request(1), budgets({100, 100}), std::vector<std::optional<DeviceMemory>>(1),
                            "m"),
               Error);
}

TEST(LayerSplit, ARealModelsDevicesAddUpToItsOneDevicePlan) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw");
  ModelDir dir(test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw");
  MemoryRequest r;
  r.cache_pages = 8;
  const MemoryPlan one = plan_memory(dir, r, std::nullopt);
  GpuSplit g;
  g.n_devices = 3;
  const std::vector<std::optional<DeviceMemory>> none(3);
  const LayerPlacement p = plan_layer_split(dir, r, g, none);
  ASSERT_TRUE(p.fits);
  EXPECT_EQ(p.model, dir.path().string());
  int64_t weights = 0, page_bytes = 0;
  for (const DevicePlacement& d : p.devices) {
    EXPECT_EQ(d.layer_end - d.layer_begin, 1);
    EXPECT_EQ(d.scratch_bytes, one.scratch_bytes);
    weights += d.weight_bytes;
    page_bytes += d.page_bytes;
  }
  EXPECT_EQ(weights, one.weight_bytes);
  EXPECT_EQ(page_bytes, one.page_bytes);
  EXPECT_EQ(p.cache_pages, 8);
  EXPECT_NE(describe(p).find("device 2       layers 2..2 + head"), std::string::npos) << describe(p);
}

}  // namespace layer_split_test
}  // namespace exl
