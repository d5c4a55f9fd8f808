#include "engine/formats/exl2_synth.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/formats/safetensors_writer.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace exl {

namespace fs = std::filesystem;

std::optional<SynthShape> synth_shape(std::string_view name) {
  using json = nlohmann::json;
  const json llama3_rope = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                            {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  if (name == "llama2-7b") return SynthShape{"llama2-7b", "LlamaForCausalLM", 4096, 11008, 32, 32, 32, 128, 32000, 4096, 10000.0, nullptr, false};
  if (name == "llama3-8b") return SynthShape{"llama3-8b", "LlamaForCausalLM", 4096, 14336, 32, 32, 8, 128, 128256, 131072, 500000.0, llama3_rope, false};
  if (name == "llama3-70b") return SynthShape{"llama3-70b", "LlamaForCausalLM", 8192, 28672, 80, 64, 8, 128, 128256, 131072, 500000.0, llama3_rope, false};
  if (name == "qwen2-7b") return SynthShape{"qwen2-7b", "Qwen2ForCausalLM", 3584, 18944, 28, 28, 4, 128, 152064, 32768, 1000000.0, nullptr, true};
  if (name == "tiny") return SynthShape{"tiny", "LlamaForCausalLM", 256, 768, 2, 4, 2, 64, 512, 2048, 10000.0, nullptr, false};
  return std::nullopt;
}

namespace {

struct Rng {  // splitmix64
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

struct Group {
  int bits;
  int64_t rows;
};

// Two widths around the target (packed bits ≈ bpw minus the scale overhead of 4 bits per column per
// 128 rows), the higher one on the first rows in 32-row groups.
std::vector<Group> plan_groups(int64_t K, double bpw) {
  static const int widths[] = {2, 3, 4, 5, 6, 8};
  const double packed = std::clamp(bpw - 4.0 / 128.0, 2.0, 8.0);
  int lo = 2, hi = 3;
  for (int i = 0; i < 5; ++i)
    if (packed >= widths[i]) lo = widths[i], hi = widths[i + 1];
  if (packed >= 8.0) lo = hi = 8;
  const double frac = hi == lo ? 0.0 : (packed - lo) / double(hi - lo);
  const int64_t hi_rows = std::min(K, int64_t(std::llround(frac * double(K) / 32.0)) * 32);
  std::vector<Group> g;
  for (int64_t r = 0; r < hi_rows; r += 32) g.push_back({hi, std::min<int64_t>(32, hi_rows - r)});
  for (int64_t r = hi_rows; r < K; r += 128) g.push_back({lo, std::min<int64_t>(128, K - r)});
  return g;
}

struct LinearPlan {
  std::string prefix;
  int64_t K, N;
  std::vector<Group> groups;
  bool bias;
  bool same_input = false;  // reads the previous plan's input: shares its act-order permutation
};

int64_t q_rows(const LinearPlan& p) {
  int64_t qr = 0;
  for (const auto& g : p.groups) qr += g.rows * g.bits / 32;
  return qr;
}

template <typename T>
std::span<const std::byte> bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

}  // namespace

void write_synth_exl2(const SynthShape& s, double bpw, int head_bits, const fs::path& tokenizer_dir,
                      const fs::path& out_dir, uint64_t seed, const std::function<void(size_t, size_t)>& progress) {
  EXL_CHECK(bpw >= 2.5 && bpw <= 8.0, "engine: synth: --bpw must be in [2.5, 8], got ", bpw);
  EXL_CHECK(head_bits >= 2 && head_bits <= 8, "engine: synth: --head-bits must be in [2, 8], got ", head_bits);
  fs::create_directories(out_dir);
  EXL_CHECK(!fs::exists(out_dir / "output.safetensors"), "engine: synth: '", (out_dir / "output.safetensors").string(),
            "' already exists");

  std::vector<LinearPlan> plans;
  const int64_t H = s.hidden, I = s.intermediate, QD = s.heads * s.head_dim, KVD = s.kv_heads * s.head_dim;
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    plans.push_back({p + "self_attn.q_proj", H, QD, plan_groups(H, bpw), s.qkv_bias});
    plans.push_back({p + "self_attn.k_proj", H, KVD, plan_groups(H, bpw), s.qkv_bias, true});
    plans.push_back({p + "self_attn.v_proj", H, KVD, plan_groups(H, bpw), s.qkv_bias, true});
    plans.push_back({p + "self_attn.o_proj", QD, H, plan_groups(QD, bpw), false});
    plans.push_back({p + "mlp.gate_proj", H, I, plan_groups(H, bpw), false});
    plans.push_back({p + "mlp.up_proj", H, I, plan_groups(H, bpw), false, true});
    plans.push_back({p + "mlp.down_proj", I, H, plan_groups(I, bpw), false});
  }
  plans.push_back({"lm_head", H, s.vocab, plan_groups(H, double(head_bits) + 0.3), false});

  // Declaration order: 4-byte tensors, then 2-byte ones, so everything stays aligned.
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& p : plans) {
    const int64_t Np = (p.N + 31) / 32 * 32, G = int64_t(p.groups.size());
    entries.push_back({p.prefix + ".q_weight", DType::i32, {q_rows(p), Np}});
    entries.push_back({p.prefix + ".q_scale", DType::i32, {G, Np / 8}});
    entries.push_back({p.prefix + ".q_invperm", DType::i32, {p.K}});
  }
  for (const auto& p : plans) {
    entries.push_back({p.prefix + ".q_scale_max", DType::f16, {int64_t(p.groups.size())}});
    entries.push_back({p.prefix + ".q_groups", DType::i16, {2 * int64_t(p.groups.size())}});
    if (p.bias) entries.push_back({p.prefix + ".bias", DType::f16, {p.N}});
  }
  entries.push_back({"model.embed_tokens.weight", DType::f16, {s.vocab, H}});
  for (int64_t l = 0; l < s.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    entries.push_back({p + "input_layernorm.weight", DType::f16, {H}});
    entries.push_back({p + "post_attention_layernorm.weight", DType::f16, {H}});
  }
  entries.push_back({"model.norm.weight", DType::f16, {H}});

  SafetensorsWriter w(out_dir / "output.safetensors", entries);
  Rng rng{seed};
  size_t done = 0;
  auto tick = [&] {
    if (progress) progress(++done, entries.size());
  };
  std::vector<int32_t> perm;
  for (const auto& p : plans) {  // q_weight, q_scale, q_invperm
    const int64_t Np = (p.N + 31) / 32 * 32;
    std::vector<uint32_t> qw(size_t(q_rows(p) * Np));
    for (size_t i = 0; i + 1 < qw.size(); i += 2) {
      const uint64_t r = rng.next();
      qw[i] = uint32_t(r), qw[i + 1] = uint32_t(r >> 32);
    }
    w.write_next(bytes(qw));
    tick();
    std::vector<uint32_t> qs(p.groups.size() * size_t(Np / 8));
    for (auto& x : qs) x = uint32_t(rng.next());
    w.write_next(bytes(qs));
    tick();
    if (!p.same_input) {
      perm.resize(size_t(p.K));
      std::iota(perm.begin(), perm.end(), 0);
      for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.next() % i]);
    }
    w.write_next(bytes(perm));
    tick();
  }
  for (const auto& p : plans) {  // q_scale_max, q_groups, bias
    std::vector<uint16_t> smax;
    std::vector<int16_t> groups;
    int64_t qrow = 0;
    const double target_std = 0.5 / std::sqrt(double(p.K));
    for (const auto& g : p.groups) {
      // E|scale| ≈ 0.4·Smax and the centred code has std 2^b/√12.
      smax.push_back(float_to_half(float(target_std / (0.4 * std::ldexp(1.0, g.bits) / std::sqrt(12.0)))));
      groups.push_back(int16_t(g.bits));
      groups.push_back(int16_t(qrow));
      qrow += g.rows * g.bits / 32;
    }
    w.write_next(bytes(smax));
    tick();
    w.write_next(bytes(groups));
    tick();
    if (p.bias) {
      std::vector<uint16_t> b(size_t(p.N));
      for (auto& x : b) x = float_to_half(float(int(rng.next() % 2001) - 1000) * 1e-4f);
      w.write_next(bytes(b));
      tick();
    }
  }
  {
    std::vector<uint16_t> table(4096);
    for (size_t i = 0; i < table.size(); ++i) table[i] = float_to_half(float(int(i) - 2048) / 2048.0f * 0.05f);
    std::vector<uint16_t> emb(size_t(s.vocab * H));
    for (auto& x : emb) x = table[rng.next() & 4095];
    w.write_next(bytes(emb));
    tick();
  }
  const std::vector<uint16_t> ones(size_t(H), float_to_half(1.0f));
  for (int64_t l = 0; l < 2 * s.layers + 1; ++l) {
    w.write_next(bytes(ones));
    tick();
  }
  w.finish();

  nlohmann::json cfg = {{"architectures", {s.architecture}},
                        {"model_type", s.architecture == "Qwen2ForCausalLM" ? "qwen2" : "llama"},
                        {"hidden_size", H},
                        {"intermediate_size", I},
                        {"num_hidden_layers", s.layers},
                        {"num_attention_heads", s.heads},
                        {"num_key_value_heads", s.kv_heads},
                        {"head_dim", s.head_dim},
                        {"vocab_size", s.vocab},
                        {"max_position_embeddings", s.max_position_embeddings},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", s.rope_theta},
                        {"rope_scaling", s.rope_scaling},
                        {"tie_word_embeddings", false},
                        {"bos_token_id", 1},
                        {"eos_token_id", 2},
                        {"torch_dtype", "float16"},
                        {"exlagent_synthetic", "random weights for benchmarks only; not a usable model"},
                        {"quantization_config",
                         {{"quant_method", "exl2"}, {"version", "exlagent-synth"}, {"bits", bpw}, {"head_bits", head_bits}}}};
  std::ofstream(out_dir / "config.json") << cfg.dump(2) << "\n";
  if (!tokenizer_dir.empty())
    for (const char* f : {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "generation_config.json"})
      if (fs::exists(tokenizer_dir / f)) fs::copy_file(tokenizer_dir / f, out_dir / f, fs::copy_options::overwrite_existing);
}

}  // namespace exl
