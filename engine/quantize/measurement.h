// The converter's measurement: for every attention block and MLP block, candidate layouts (one
// per linear of the block, ExLlamaV2's candidate tables of exl2-engine.md §8.5) with their storage
// bits, the error of the block's output they cause on calibration activations, and that error
// weighted by the block's sensitivity (quantize_model.h, step 2). Saved as measurement.json and
// reusable across bit rates (`quantize --measurement FILE`); its format is exlagent's own, not
// ExLlamaV2's. Plain data and pure functions.
#pragma once
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/quantize/quantize_linear.h"

namespace exl {

// The layouts of a block's linears: q, k, v, o or gate, up, down.
using BlockLayout = std::vector<QuantOption>;

std::span<const BlockLayout> attention_candidates();  // 19 candidates
std::span<const BlockLayout> mlp_candidates();        // 17 candidates

// "8:0.15@128,6@128" (to_string's form) back to segments. Throws exl::Error naming the text.
QuantOption parse_quant_option(std::string_view text);

struct BlockOptionScore {
  BlockLayout layout;
  int64_t bits = 0;           // storage bits of the block's linears (format overhead included)
  double error = 0;           // what the allocation sums: sensitivity · output_error (predicted KL)
  double output_error = 0;    // Σ‖y_q − y‖² / Σ‖y‖² over calibration tokens, y the block's output
};

struct BlockMeasurement {
  std::string name;           // "model.layers.3.self_attn" or "model.layers.3.mlp"
  double sensitivity = 0;     // mean KL of the final logits per unit of output_error
  std::vector<BlockOptionScore> options;
};

struct Measurement {
  std::string model;        // config fingerprint: architecture and dimensions
  std::string calibration;  // CalibrationSet::source
  std::vector<BlockMeasurement> blocks;  // per layer: attention, then MLP
};

nlohmann::json to_json(const Measurement& m);
// Throws exl::Error ("engine: quantize: measurement '<where>': ...") for a malformed document.
Measurement measurement_from_json(const nlohmann::json& j, std::string_view where);
void save_measurement(const Measurement& m, const std::filesystem::path& file);
Measurement load_measurement(const std::filesystem::path& file);

}  // namespace exl
