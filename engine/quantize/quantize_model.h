// `exlagent quantize`: an FP16/BF16/FP32 Hugging Face checkpoint (Llama, Mistral, Qwen2) to an
// EXL2 directory that ExLlamaV2 and our loader read (exl2-engine.md §1):
//   * every decoder-layer linear is quantized round-to-nearest (engine/quantize/quantize_linear.h) with a
//     layout picked per layer by engine/quantize/quantize_alloc.h so that the decoder layers' average bpw
//     (model_summary.h's accounting, format overhead included) is at most the target and close
//     to it; the head gets the converter's --head-bits option and is outside the budget;
//   * a tied head is quantized from model.embed_tokens and written as lm_head;
//   * embeddings, norms and any other float tensor are stored as fp16; biases as fp16;
//   * config.json gains quantization_config; every other non-weight file (tokenizer, generation
//     config, chat template) is copied;
//   * the directory is built under a hidden temporary name beside `out` and renamed into place at
//     the end, so an interrupted run never leaves a complete-looking directory. `out` must not
//     exist yet.
// Every written layer is read back through the inference path's dequantizer, and the reported
// error is measured on that reconstruction.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace exl {

struct QuantizeOptions {
  double bpw = 4.0;    // decoder-layer target, in [2.5, 8.0]
  int head_bits = 6;   // 2, 3, 4, 5, 6 or 8
  int threads = 0;     // 0 = all cores
};

struct QuantizedLayerReport {
  std::string name;
  std::string layout;     // e.g. "8:0.25@128,6@128"
  double bpw = 0;         // storage bits / (in · out)
  double rel_error = 0;   // ‖W_q − W‖_F / ‖W‖_F, W_q dequantized as the engine does
};

struct QuantizeReport {
  double target_bpw = 0;
  double layers_bpw = 0;  // achieved, decoder layers
  double head_bpw = 0;
  double mean_rel_error = 0;  // over decoder-layer linears
  std::vector<QuantizedLayerReport> layers;  // decoder linears in order, then lm_head
};

// stage is "measure", "quantize" or "write"; called from one thread at a time.
using QuantizeProgress = std::function<void(std::string_view stage, size_t done, size_t total)>;

// Throws exl::Error (message "engine: quantize: ...") for an unsupported architecture, missing or
// already quantized tensors, out-of-range options, an existing `out`, or I/O failures; the
// temporary directory is removed then.
QuantizeReport quantize_model(const std::filesystem::path& in, const std::filesystem::path& out,
                              const QuantizeOptions& options, const QuantizeProgress& progress = {});

}  // namespace exl
