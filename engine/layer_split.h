// Placing a model's decoder layers on several devices (`--gpu-split`): which device holds which
// layers, the embedding and the head, and how many KV-cache pages every device holds for its
// layers. Pure arithmetic over the model files and the options, like engine/memory_plan.h (whose
// byte counts it reuses): nothing is uploaded or allocated, so a split that cannot fit fails with
// one error naming the device and the bytes before anything is. Plain data and functions;
// thread-safe.
//
// Every device of a split keeps the same page table (a page id means the same positions on all of
// them), so all devices hold the same number of pages, each page sized for the device's layers.
// Devices are filled in order, greedily: device d takes the next layers while its bytes stay
// within its budget, where a device's bytes are
//   the scratch reserve (scratch_reserve_bytes, the whole of it: each device runs its own step)
//   + the weights of its layers (norms and linears; the embedding with layer 0, the final norm and
//     the head with the last layer) + pages · its layers' share of a page (+ companion page bytes
//     of a draft model with layer 0: the draft loads on device 0, which holds layer 0 unless it
//     is too small for any layer)
// and a budget is min(the split's GB for it, free − margin) (margin as memory_plan.h). A device
// that cannot take the next layer is passed over and keeps nothing. An automatic cache takes the
// most pages (up to MemoryRequest's cap) at which every layer is placed; the fewest it accepts
// is one step's prefill, as for one device. Without device memory (the CPU backend) only the
// split's GB bound a device; an automatic split there gives every device an equal share of layers.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/formats/model_dir.h"
#include "engine/memory_plan.h"
#include "kernels/backend.h"

namespace exl {

// The --gpu-split value: GB (2^30 bytes) each device may hold, in device order, or automatic
// (every device up to its free memory; one entry per device with an empty `gb`).
struct GpuSplit {
  std::vector<double> gb;  // empty: automatic
  int n_devices = 0;       // gb.size(), or the device count of an automatic split
};

// One device's share of a placement.
struct DevicePlacement {
  int device = 0;                          // index in the split (the backend / CUDA device index)
  int64_t layer_begin = 0, layer_end = 0;  // decoder layers [begin, end); empty: the device is unused
  bool embedding = false, head = false;    // the embedding table; the final norm and lm_head
  int64_t budget_bytes = 0;                // what it may hold (-1: no bound)
  int64_t weight_bytes = 0, scratch_bytes = 0;
  int64_t page_bytes = 0;                  // its layers' share of one KV page (+ companion with layer 0)
  int64_t cache_bytes = 0;                 // cache_pages · page_bytes
  std::optional<DeviceMemory> memory;
  int64_t margin_bytes = 0;
  bool used() const { return layer_end > layer_begin; }
  int64_t total_bytes() const { return used() ? weight_bytes + scratch_bytes + cache_bytes : 0; }
};

// The placement; byte counts are device bytes. `fits` false: `error` names the device and bytes.
struct LayerPlacement {
  std::string model;
  MemoryRequest request;  // as given, with max_seq_len resolved
  std::vector<DevicePlacement> devices;  // one per device of the split, in order
  int64_t n_layers = 0;
  int cache_pages = 0;
  int64_t cache_tokens = 0;
  bool cache_auto = false;
  int64_t max_pages = 0;
  KvFormat cache_format = KvFormat::fp16;
  bool fits = true;
  std::string error;
  // The used devices' layer ranges, in order (Model's split constructor takes them).
  std::vector<std::pair<int, std::pair<int64_t, int64_t>>> used_ranges() const;
};

// Device bytes of decoder layer `layer`'s weights (its two norms and seven linears), loading and
// validating its linears.
int64_t layer_weight_bytes(const ModelDir& dir, int64_t layer);

// Places `dir` over the split's devices; `memory[d]` is device d's memory (nullopt: no device
// limit). Throws exl::Error for malformed weights or options (a split of no devices, a negative
// or zero GB, memory.size() != split.n_devices).
LayerPlacement plan_layer_split(const ModelDir& dir, const MemoryRequest& req, const GpuSplit& split,
                                std::span<const std::optional<DeviceMemory>> memory);

// The greedy placement over precomputed sizes (plan_layer_split's core, for tests):
// layer_bytes[l] weights of layer l, layer_page_bytes one layer's share of a page.
struct SplitSizes {
  std::vector<int64_t> layer_bytes;
  int64_t embedding_bytes = 0, head_bytes = 0;  // head: final norm + lm_head
  int64_t scratch_bytes = 0, layer_page_bytes = 0, companion_page_bytes = 0;
};
LayerPlacement place_layers(const SplitSizes& sizes, const MemoryRequest& resolved_req, const GpuSplit& split,
                            std::span<const std::optional<DeviceMemory>> memory, std::string_view model);

// Throws the placement's error when it does not fit.
void check_fits(const LayerPlacement& placement);
// Multi-line text of the placement for `exlagent info`.
std::string describe(const LayerPlacement& placement);

}  // namespace exl
