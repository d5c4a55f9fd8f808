// Fuzz target: EXL2 and GPTQ tensor sets. The input is the model.safetensors of a directory with
// a fixed small config.json; the loaders read the matrix under prefix "m" (K = N = 32), checking
// every structural invariant the kernels rely on (groups, permutations, shapes, dtypes).
#include "engine/formats/exl2_loader.h"
#include "engine/formats/gptq_loader.h"
#include "engine/formats/model_dir.h"
#include "fuzz/fuzz_support.h"

namespace exl::fuzz_quant_tensors {

const std::filesystem::path& quant_model_dir() {
  static const std::filesystem::path dir = [] {
    auto d = fuzz::scratch_dir() / "quant";
    std::filesystem::create_directories(d);
    fuzz::write_bytes(d / "config.json", R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 32,
      "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 4,
      "vocab_size": 32, "max_position_embeddings": 64, "rms_norm_eps": 1e-5,
      "quantization_config": {"quant_method": "gptq", "bits": 4, "checkpoint_format": "gptq"}})");
    return d;
  }();
  return dir;
}

}  // namespace exl::fuzz_quant_tensors

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto& dir = exl::fuzz_quant_tensors::quant_model_dir();
  exl::fuzz::write_bytes(dir / "model.safetensors", exl::fuzz::as_text(data, size));
  exl::fuzz::expect_clean([&] {
    exl::ModelDir model(dir);
    exl::fuzz::expect_clean([&] { exl::load_exl2_matrix(model, "m", 32, 32); });
    exl::fuzz::expect_clean([&] { exl::load_gptq_matrix(model, "m", 32, 32); });
  });
  return 0;
}
