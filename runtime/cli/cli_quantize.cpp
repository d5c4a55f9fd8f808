#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/quantize/quantize_model.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"

namespace exl {

namespace {

// "\rquantize: measure  [#########...........]  12/42" on stderr, redrawn in place when the bar moves.
class ProgressBar {
 public:
  void operator()(std::string_view stage, size_t done, size_t total) {
    constexpr int kWidth = 30;
    const int filled = total ? int(double(done) / double(total) * kWidth) : kWidth;
    if (stage == stage_ && filled == filled_ && done != total) return;
    stage_ = std::string(stage);
    filled_ = filled;
    std::string bar(size_t(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\rquantize: %-8s [%s] %zu/%zu", stage_.c_str(), bar.c_str(), done, total);
    if (done == total) std::fputc('\n', stderr);
    std::fflush(stderr);
  }

 private:
  std::string stage_;
  int filled_ = -1;
};

}  // namespace

int cli_quantize(std::span<const std::string> args) {
  static const CommandSpec spec{
      "quantize",
      "Convert an FP16/BF16/FP32 Hugging Face checkpoint (Llama, Mistral, Qwen2) to an EXL2 directory\n"
      "that ExLlamaV2 and exlagent load. Round-to-nearest with act-order by weight saliency and a\n"
      "per-layer bit allocation (error per bit, greedy) that keeps the decoder layers' average at or\n"
      "just under --bpw, format overhead included. Prints a JSON report (achieved bpw, per-layer\n"
      "layout and relative weight error) to stdout; progress goes to stderr.",
      {},
      {{"--in", "DIR", "Hugging Face model directory", true},
       {"--out", "DIR", "output directory (must not exist)", true},
       {"--bpw", "B", "target bits per weight of the decoder layers, 2.5 to 8.0 (default 4.0)"},
       {"--head-bits", "B", "bits of the output head: 2, 3, 4, 5, 6 or 8 (default 6)"},
       {"--threads", "N", "worker threads (default: all cores)"}}};
  return run_command(spec, args, [](const ParsedArgs& a) {
    QuantizeOptions o;
    o.bpw = a.get_double("--bpw", 4.0);
    o.head_bits = int(a.get_int("--head-bits", 6));
    o.threads = int(a.get_int("--threads", 0));
    const auto t0 = std::chrono::steady_clock::now();
    const QuantizeReport r = quantize_model(*a.get("--in"), *a.get("--out"), o, ProgressBar{});
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    nlohmann::ordered_json j = {{"out", *a.get("--out")},
                                {"target_bpw", r.target_bpw},
                                {"layers_bpw", r.layers_bpw},
                                {"head_bpw", r.head_bpw},
                                {"mean_rel_error", r.mean_rel_error},
                                {"seconds", secs}};
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (const auto& l : r.layers)
      layers.push_back({{"name", l.name}, {"layout", l.layout}, {"bpw", l.bpw}, {"rel_error", l.rel_error}});
    j["layers"] = std::move(layers);
    std::cout << j.dump(2) << "\n";
    return 0;
  });
}

}  // namespace exl
