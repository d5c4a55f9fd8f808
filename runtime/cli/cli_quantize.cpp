#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/quantize/quantize_model.h"
#include "engine/rope.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"

namespace exl {

namespace cli_quantize_impl {

// "\rquantize: measure   [#########.....................]  12/42  eta 1m05s" on stderr, redrawn in
// place when the bar or the ETA (elapsed / done · remaining, per stage) moves.
class QuantizeProgressBar {
 public:
  void operator()(std::string_view stage, size_t done, size_t total) {
    constexpr int kWidth = 30;
    const auto now = std::chrono::steady_clock::now();
    if (stage != stage_) stage_ = std::string(stage), start_ = now, filled_ = -1;
    const int filled = total ? int(double(done) / double(total) * kWidth) : kWidth;
    const double elapsed = std::chrono::duration<double>(now - start_).count();
    const long eta = done ? long(elapsed / double(done) * double(total - done) + 0.5) : -1;
    if (filled == filled_ && eta == eta_ && done != total) return;
    filled_ = filled, eta_ = eta;
    std::string bar(size_t(filled), '#');
    bar.resize(kWidth, '.');
    char when[32] = "eta ?";
    if (done == total) std::snprintf(when, sizeof when, "%.1fs", elapsed);
    else if (eta >= 0) std::snprintf(when, sizeof when, "eta %ldm%02lds", eta / 60, eta % 60);
    std::fprintf(stderr, "\rquantize: %-9s [%s] %zu/%zu  %-12s", stage_.c_str(), bar.c_str(), done, total, when);
    if (done == total) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  std::string stage_;
  std::chrono::steady_clock::time_point start_;
  int filled_ = -1;
  long eta_ = -2;
};

nlohmann::ordered_json report_json(const QuantizeReport& r, const std::string& out, double secs) {
  nlohmann::ordered_json j = {{"out", out},
                              {"backend", r.backend},
                              {"target_bpw", r.target_bpw},
                              {"layers_bpw", r.layers_bpw},
                              {"head_bpw", r.head_bpw},
                              {"mean_rel_error", r.mean_rel_error},
                              {"calibration", r.calibration},
                              {"measurement_reused", r.measurement_reused},
                              {"resumed_layers", r.resumed_layers},
                              {"seconds", {{"calibrate", r.seconds_calibrate},
                                           {"measure", r.seconds_measure},
                                           {"quantize", r.seconds_quantize},
                                           {"write", r.seconds_write},
                                           {"total", secs}}}};
  j["step_seconds"] = r.step_seconds;
  nlohmann::ordered_json blocks = nlohmann::ordered_json::array(), layers = nlohmann::ordered_json::array();
  for (const auto& b : r.blocks)
    blocks.push_back({{"name", b.name}, {"bpw", b.bpw}, {"measured_error", b.measured_error},
                      {"output_error", b.output_error}, {"seconds", b.seconds}});
  for (const auto& l : r.layers)
    layers.push_back({{"name", l.name}, {"layout", l.layout}, {"bpw", l.bpw}, {"rel_error", l.rel_error}});
  j["blocks"] = std::move(blocks);
  j["layers"] = std::move(layers);
  return j;
}

}  // namespace cli_quantize_impl

int cli_quantize(std::span<const std::string> args) {
  static const CommandSpec spec{
      "quantize",
      "Convert an FP16/BF16/FP32 Hugging Face checkpoint (Llama, Mistral, Qwen2) to an EXL2 directory\n"
      "that ExLlamaV2 and exlagent load, calibrated as ExLlamaV2's converter is: GPTQ per linear with\n"
      "the Hessian of its real inputs (act-order, damping, error feedback), a measurement pass that\n"
      "scores candidate layouts of every attention and MLP block by the error of the block's output\n"
      "times the block's sensitivity (the final logits' KL per unit of that error), and the\n"
      "allocation minimizing the summed score with the decoder layers' average (format overhead\n"
      "included) at or under --bpw (exact dynamic programming). Layers are quantized in order, each\n"
      "on the outputs of the quantized layers before it.\n"
      "--backend cuda runs everything on CUDA device 0: the source model's blocks on the CUDA backend,\n"
      "Hessians as cuBLAS GEMMs, the factorization in double and GPTQ's column loop on the GPU\n"
      "(auto, the default, picks it when a device exists); cpu runs the CPU reference. Results agree\n"
      "to fp32 rounding, not bit for bit.\n"
      "Calibration: --calibration FILE (plain text, or JSONL with a \"text\" field per line), cut\n"
      "into --cal-rows rows of --cal-length tokens; without it, text the FP16 model generates itself\n"
      "from seeded prompts (--cal-seed), so no data set is needed.\n"
      "The job works in .OUT.partial beside --out and resumes from it when run again after a kill\n"
      "(finished layers are not redone); the directory is renamed to --out at the end, with its\n"
      "measurement.json (reusable for other bit rates with --measurement). Prints a JSON report\n"
      "(calibration, per-block bits and output errors, per-linear layout and weight error, seconds\n"
      "per phase) to stdout; progress with ETA per phase goes to stderr.",
      {},
      {{"--in", "DIR", "Hugging Face model directory", true},
       {"--out", "DIR", "output directory (must not exist)", true},
       {"--bpw", "B", "target bits per weight of the decoder layers, 2.5 to 8.0 (default 4.0)"},
       {"--head-bits", "B", "bits of the output head: 2, 3, 4, 5, 6 or 8 (default 6)"},
       {"--calibration", "FILE", "calibration text or JSONL (default: text the model generates itself)"},
       {"--cal-rows", "N", "calibration rows (default: max(32, 8 x the widest linear input / --cal-length))"},
       {"--cal-length", "N", "tokens per calibration row, at least 16 (default 256)"},
       {"--cal-seed", "N", "seed of the self-generated calibration text (default 1)"},
       {"--measure-rows", "N", "calibration rows the measurement scores layouts on; 0 = all (default 4)"},
       {"--measurement", "FILE", "reuse this measurement.json instead of measuring"},
       {"--damp", "F", "GPTQ damping as a fraction of the Hessian's mean diagonal (default 0.01)"},
       {"--backend", "NAME", "cpu, cuda or auto: cuda when a CUDA device exists (default auto)"},
       {"--threads", "N", "worker threads (default: all cores)"}}};
  return run_command(spec, args, [](const ParsedArgs& a) {
    QuantizeOptions o;
    o.bpw = a.get_double("--bpw", 4.0);
    o.head_bits = int(a.get_int("--head-bits", 6));
    o.threads = int(a.get_int("--threads", 0));
    o.rope_table = [](const ModelConfig& c) {
      return make_rope_table(c.rope, int(c.head_dim), c.max_position_embeddings);
    };
    if (auto f = a.get("--calibration")) o.calibration = *f;
    if (auto f = a.get("--measurement")) o.measurement = *f;
    o.cal_rows = a.get_int("--cal-rows", 0);
    o.cal_length = a.get_int("--cal-length", 256);
    o.cal_seed = uint64_t(a.get_int("--cal-seed", 1));
    o.measure_rows = a.get_int("--measure-rows", 4);
    o.damp = a.get_double("--damp", 0.01);
    o.backend = a.get_or("--backend", "auto");
    const auto t0 = std::chrono::steady_clock::now();
    const QuantizeReport r =
        quantize_model(*a.get("--in"), *a.get("--out"), o, cli_quantize_impl::QuantizeProgressBar{});
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << cli_quantize_impl::report_json(r, *a.get("--out"), secs).dump(2) << "\n";
    return 0;
  });
}

}  // namespace exl
