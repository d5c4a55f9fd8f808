#include "engine/quantize/quantize_model.h"

#include <cmath>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/formats/exl2_writer.h"
#include "engine/formats/linear_loader.h"
#include "engine/formats/model_dir.h"
#include "engine/quantize/quantize_alloc.h"
#include "engine/quantize/quantize_linear.h"
#include "engine/formats/safetensors_writer.h"
#include "engine/formats/tensor_access.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace exl {

namespace fs = std::filesystem;

namespace {

constexpr const char* kVersion = "exlagent-rtn-1";

// A dense source layer as float [N, K] plus its bias.
struct DenseLayer {
  std::vector<float> w;
  std::vector<float> bias;
};

DenseLayer load_dense(const ModelDir& dir, const LinearSpec& spec) {
  LinearWeights lw = load_linear(dir, spec.name, spec.in_features, spec.out_features);
  const auto* d = std::get_if<DenseMatrix>(&lw);
  EXL_CHECK(d, "engine: quantize: '", dir.path().string(), "': layer '", spec.name, "' is already quantized (",
            to_string(*detect_weight_format(dir, *resolve_linear_prefix(dir, spec.name))),
            "); the input must be an FP16, BF16 or FP32 checkpoint");
  DenseLayer out;
  out.w.resize(size_t(spec.in_features * spec.out_features));
  dequantize(*d, out.w);
  out.bias = d->bias;
  return out;
}

double sum_squares(std::span<const float> v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return s;
}

// Relative squared error of every menu option for one layer; groups shared by options are fitted once.
LayerOptions measure_layer(const DenseLayer& layer, const LinearSpec& spec) {
  const int64_t K = spec.in_features, N = spec.out_features;
  const auto perm = saliency_order(layer.w, N, K);
  const auto rows = permuted_rows(layer.w, N, K, perm);
  const double norm = std::max(sum_squares(layer.w), 1e-30);
  std::map<std::tuple<int, int64_t, int64_t>, double> cache;
  LayerOptions o;
  for (const auto& option : quant_option_menu()) {
    const auto groups = option_groups(option, K);
    double err = 0;
    int64_t row = 0;
    for (auto [bits, n_rows] : groups) {
      auto [it, fresh] = cache.try_emplace({bits, row, n_rows}, 0.0);
      if (fresh) it->second = group_error(rows.data() + row * N, n_rows, N, bits);
      err += it->second;
      row += n_rows;
    }
    o.bits.push_back(exl2_storage_bits(groups, K, N));
    o.error.push_back(err / norm);
  }
  return o;
}

template <typename T>
std::span<const std::byte> bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// A model file declares the 4-byte tensors of every layer (q_weight, q_scale, q_invperm) before
// the 2-byte ones (q_scale_max, q_groups, bias), as the synth writer does, so every tensor stays
// naturally aligned in the safetensors data section.
void declare_exl2_tensors(const std::string& prefix, const Exl2Tensors& t, std::vector<SafetensorsWriter::Entry>& wide,
                          std::vector<SafetensorsWriter::Entry>& narrow) {
  const int64_t G = int64_t(t.groups.size());
  wide.push_back({prefix + ".q_weight", DType::i32, {t.q_rows, t.padded_out}});
  wide.push_back({prefix + ".q_scale", DType::i32, {G, t.padded_out / 8}});
  wide.push_back({prefix + ".q_invperm", DType::i32, {t.in_features}});
  narrow.push_back({prefix + ".q_scale_max", DType::f16, {G}});
  narrow.push_back({prefix + ".q_groups", DType::i16, {2 * G}});
  if (!t.bias.empty()) narrow.push_back({prefix + ".bias", DType::f16, {t.out_features}});
}

void write_exl2_wide(SafetensorsWriter& w, const Exl2Tensors& t) {
  w.write_next(bytes(t.q_weight));
  w.write_next(bytes(t.q_scale));
  w.write_next(bytes(t.q_invperm()));
}

void write_exl2_narrow(SafetensorsWriter& w, const Exl2Tensors& t) {
  w.write_next(bytes(t.q_scale_max));
  w.write_next(bytes(t.q_groups()));
  if (!t.bias.empty()) w.write_next(bytes(t.bias));
}

std::vector<uint16_t> to_f16(std::span<const float> v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_half(v[i]);
  return out;
}

// Removes the temporary directory unless released.
struct TempDir {
  fs::path path;
  bool keep = false;
  ~TempDir() {
    std::error_code ec;
    if (!keep) fs::remove_all(path, ec);
  }
};

bool is_weight_file(const fs::path& p) {
  static const std::set<std::string> exts = {".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack"};
  const std::string name = p.filename().string();
  return exts.count(p.extension().string()) || name.ends_with(".index.json");
}

void copy_side_files(const fs::path& in, const fs::path& tmp) {
  for (const auto& e : fs::directory_iterator(in)) {
    if (!e.is_regular_file() || e.path().filename() == "config.json" || is_weight_file(e.path())) continue;
    fs::copy_file(e.path(), tmp / e.path().filename(), fs::copy_options::overwrite_existing);
  }
}

void write_config(const ModelDir& in, const QuantizeOptions& o, const fs::path& tmp) {
  nlohmann::json cfg = in.config_json();
  cfg["torch_dtype"] = "float16";
  cfg["quantization_config"] = {{"quant_method", "exl2"},
                                {"version", kVersion},
                                {"bits", o.bpw},
                                {"head_bits", o.head_bits},
                                {"calibration", {{"rows", 0}, {"length", 0}, {"dataset", "(none: weight-error RTN)"}}}};
  std::ofstream f(tmp / "config.json");
  f << cfg.dump(2) << "\n";
  EXL_CHECK(f.good(), "engine: quantize: cannot write '", (tmp / "config.json").string(), "'");
}

// Float tensors that are not linear weights (embeddings, norms, ...) as fp16.
std::vector<std::pair<std::string, std::vector<uint16_t>>> other_tensors(const ModelDir& in,
                                                                         const std::set<std::string>& consumed) {
  std::vector<std::pair<std::string, std::vector<uint16_t>>> out;
  for (const auto& name : in.tensor_names()) {
    if (consumed.count(name) || name.ends_with("rotary_emb.inv_freq")) continue;
    const TensorView t = *in.find(name);
    EXL_CHECK(is_float_dtype(t.info->dtype), tensor_where("quantize", t), "unexpected ", to_string(t.info->dtype),
              " tensor in an unquantized checkpoint");
    out.emplace_back(name, to_f16(tensor_to_f32(t, "quantize")));
  }
  return out;
}

}  // namespace

QuantizeReport quantize_model(const fs::path& in_dir, const fs::path& out, const QuantizeOptions& o,
                              const QuantizeProgress& progress) {
  EXL_CHECK(o.bpw >= 2.5 && o.bpw <= 8.0, "engine: quantize: --bpw must be in [2.5, 8.0], got ", o.bpw);
  const QuantOption head_option = head_quant_option(o.head_bits);
  EXL_CHECK(!fs::exists(out), "engine: quantize: output '", out.string(), "' already exists");
  const ModelDir in(in_dir);
  const ModelConfig& c = in.config();
  EXL_CHECK(c.quant_method.empty(), "engine: quantize: '", in_dir.string(), "' is already quantized (quant_method '",
            c.quant_method, "')");

  std::vector<LinearSpec> specs;
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (auto& s : decoder_layer_linears(c, l)) specs.push_back(std::move(s));
  const size_t n_decoder = specs.size();
  specs.push_back(head_linear(c));
  std::set<std::string> consumed;
  for (const auto& s : specs) {
    load_linear(in, s.name, s.in_features, s.out_features);  // fails fast on missing or malformed tensors
    if (*resolve_linear_prefix(in, s.name) == s.name) consumed.insert({s.name + ".weight", s.name + ".bias"});
  }

  ThreadPool pool(o.threads);
  std::mutex mu;
  size_t done = 0;
  auto tick = [&](const char* stage, size_t total) {
    std::lock_guard lock(mu);
    ++done;
    if (progress) progress(stage, done, total);
  };

  std::vector<LayerOptions> options(n_decoder);
  pool.parallel_for(int64_t(n_decoder), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      options[i] = measure_layer(load_dense(in, specs[i]), specs[i]);
      tick("measure", n_decoder);
    }
  });
  int64_t weights = 0;
  for (size_t i = 0; i < n_decoder; ++i) weights += specs[i].in_features * specs[i].out_features;
  const auto pick = allocate_bits(options, int64_t(std::floor(o.bpw * double(weights))));

  std::vector<Exl2Tensors> tensors(specs.size());
  QuantizeReport report;
  report.target_bpw = o.bpw;
  report.layers.resize(specs.size());
  done = 0;
  pool.parallel_for(int64_t(specs.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const LinearSpec& s = specs[i];
      const QuantOption& opt = size_t(i) < n_decoder ? quant_option_menu()[pick[i]] : head_option;
      DenseLayer d = load_dense(in, s);
      tensors[i] = quantize_exl2(d.w, s.out_features, s.in_features, saliency_order(d.w, s.out_features, s.in_features),
                                 option_groups(opt, s.in_features));
      if (!d.bias.empty()) tensors[i].bias = to_f16(d.bias);
      std::vector<float> back(d.w.size());
      dequantize(tensors[i].view(), back);
      for (size_t k = 0; k < back.size(); ++k) back[k] -= d.w[k];
      report.layers[i] = {s.name, to_string(opt), 8.0 * double(tensors[i].storage_bytes()) / double(d.w.size()),
                          std::sqrt(sum_squares(back) / std::max(sum_squares(d.w), 1e-30))};
      tick("quantize", specs.size());
    }
  });
  double bits = 0, err = 0;
  for (size_t i = 0; i < n_decoder; ++i) {
    bits += 8.0 * double(tensors[i].storage_bytes());
    err += report.layers[i].rel_error;
  }
  report.layers_bpw = bits / double(weights);
  report.mean_rel_error = n_decoder ? err / double(n_decoder) : 0;
  report.head_bpw = report.layers.back().bpw;

  const auto others = other_tensors(in, consumed);
  std::vector<SafetensorsWriter::Entry> wide, narrow;
  for (size_t i = 0; i < specs.size(); ++i) declare_exl2_tensors(specs[i].name, tensors[i], wide, narrow);
  for (const auto& [name, data] : others) narrow.push_back({name, DType::f16, in.find(name)->info->shape});
  wide.insert(wide.end(), narrow.begin(), narrow.end());

  TempDir tmp{out.parent_path() / ("." + out.filename().string() + ".partial")};
  fs::remove_all(tmp.path);
  fs::create_directories(tmp.path);
  {
    SafetensorsWriter w(tmp.path / "output.safetensors", wide);
    const size_t total = 2 * specs.size() + others.size();
    done = 0;
    for (const auto& t : tensors) write_exl2_wide(w, t), tick("write", total);
    for (const auto& t : tensors) write_exl2_narrow(w, t), tick("write", total);
    for (const auto& [name, data] : others)
      w.write_next(std::as_bytes(std::span<const uint16_t>(data))), tick("write", total);
    w.finish();
  }
  write_config(in, o, tmp.path);
  copy_side_files(in_dir, tmp.path);
  EXL_CHECK(!fs::exists(out), "engine: quantize: output '", out.string(), "' appeared while quantizing");
  fs::rename(tmp.path, out);
  tmp.keep = true;
  return report;
}

}  // namespace exl
