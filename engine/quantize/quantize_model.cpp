#include "engine/quantize/quantize_model.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/formats/exl2_writer.h"
#include "engine/formats/linear_loader.h"
#include "engine/formats/model_dir.h"
#include "engine/formats/safetensors.h"
#include "engine/formats/safetensors_writer.h"
#include "engine/formats/tensor_access.h"
#include "engine/quantize/calib_model.h"
#include "engine/quantize/calibration.h"
#include "engine/quantize/gptq_runner.h"
#include "engine/quantize/kl_reference.h"
#include "engine/quantize/measurement.h"
#include "engine/quantize/quantize_alloc.h"
#include "engine/quantize/quantize_linear.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/cpu/dequantize.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda_backend.h"
#include "kernels/cuda_device.h"
#include "kernels/gptq_device.h"
#include "kernels/error.h"
#include "kernels/half.h"

namespace exl {

namespace fs = std::filesystem;

namespace quantize_model_impl {

constexpr const char* kVersion = "exlagent-gptq-1";
constexpr int kLinearsPerLayer = kAttnLinears + kMlpLinears;

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A dense source layer as float [N, K] plus its bias.
struct DenseLayer {
  std::vector<float> w;
  std::vector<float> bias;
};

// The source weights of a linear, validated (missing, malformed or already quantized tensors are
// errors naming the layer).
LinearWeights load_source(const ModelDir& dir, const LinearSpec& spec) {
  LinearWeights lw = load_linear(dir, spec.name, spec.in_features, spec.out_features);
  EXL_CHECK(std::holds_alternative<DenseMatrix>(lw), "engine: quantize: '", dir.path().string(), "': layer '",
            spec.name, "' is already quantized (",
            to_string(*detect_weight_format(dir, *resolve_linear_prefix(dir, spec.name))),
            "); the input must be an FP16, BF16 or FP32 checkpoint");
  return lw;
}

DenseLayer load_dense(const ModelDir& dir, const LinearSpec& spec, ThreadPool& pool) {
  const LinearWeights lw = load_source(dir, spec);
  const auto* d = std::get_if<DenseMatrix>(&lw);
  const int64_t K = spec.in_features;
  DenseLayer out;
  out.w.resize(size_t(K * spec.out_features));
  pool.parallel_for(spec.out_features, 64, [&](int64_t b, int64_t e) {
    const DenseMatrix rows{K, e - b, d->dtype, static_cast<const std::byte*>(d->data) + b * K * int64_t(dtype_size(d->dtype)), {}};
    dequantize(rows, std::span(out.w).subspan(size_t(b * K), size_t((e - b) * K)));
  });
  out.bias = d->bias;
  return out;
}

double sum_squares(std::span<const float> v) {
  double s = 0;
  for (float x : v) s += double(x) * x;
  return s;
}

double sum_sq_diff(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i] - b[i]) * double(a[i] - b[i]);
  return s;
}

std::vector<uint16_t> to_f16(std::span<const float> v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_half(v[i]);
  return out;
}

template <typename T>
std::span<const std::byte> bytes(const std::vector<T>& v) {
  return std::as_bytes(std::span<const T>(v));
}

// A file declares the 4-byte tensors of every layer (q_weight, q_scale, q_invperm) before the
// 2-byte ones (q_scale_max, q_groups, bias), as the synth writer does, so every tensor stays
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

// Linears (specs[i], tensors[i]) as one safetensors file.
void write_linears(const fs::path& file, std::span<const LinearSpec> specs, std::span<const Exl2Tensors* const> ts) {
  std::vector<SafetensorsWriter::Entry> wide, narrow;
  for (size_t i = 0; i < specs.size(); ++i) declare_exl2_tensors(specs[i].name, *ts[i], wide, narrow);
  wide.insert(wide.end(), narrow.begin(), narrow.end());
  SafetensorsWriter w(file, wide);
  for (const auto* t : ts) write_exl2_wide(w, *t);
  for (const auto* t : ts) write_exl2_narrow(w, *t);
  w.finish();
}

// Copies `count` elements of tensor `name` of `f` into dst, checking the byte size.
template <typename T>
void read_into(const SafetensorsFile& f, const std::string& name, std::vector<T>& dst) {
  const TensorInfo* info = f.find(name);
  EXL_CHECK(info, "engine: quantize: '", f.path().string(), "' lacks tensor '", name, "'");
  const TensorView v = f.view(*info);
  EXL_CHECK(v.data.size() == dst.size() * sizeof(T), "engine: quantize: '", f.path().string(), "': tensor '", name,
            "' has ", v.data.size(), " bytes, expected ", dst.size() * sizeof(T));
  std::memcpy(dst.data(), v.data.data(), v.data.size());
}

// A linear written by write_linears, rebuilt with its layout.
Exl2Tensors read_linear(const SafetensorsFile& f, const LinearSpec& s, const QuantOption& layout, bool has_bias) {
  std::vector<int32_t> inv(static_cast<size_t>(s.in_features)), perm(static_cast<size_t>(s.in_features));
  read_into(f, s.name + ".q_invperm", inv);
  for (size_t k = 0; k < inv.size(); ++k) {
    EXL_CHECK(inv[k] >= 0 && inv[k] < s.in_features, "engine: quantize: '", f.path().string(), "': bad q_invperm");
    perm[size_t(inv[k])] = int32_t(k);
  }
  Exl2Tensors t = make_exl2_tensors(s.in_features, s.out_features,
                                    make_exl2_groups(option_groups(layout, s.in_features), s.in_features), perm);
  read_into(f, s.name + ".q_weight", t.q_weight);
  read_into(f, s.name + ".q_scale", t.q_scale);
  read_into(f, s.name + ".q_scale_max", t.q_scale_max);
  if (has_bias) {
    t.bias.resize(size_t(s.out_features));
    read_into(f, s.name + ".bias", t.bias);
  }
  return t;
}

void write_floats(const fs::path& file, std::span<const float> v, int64_t cols) {
  SafetensorsWriter w(file, {{"x", DType::f32, {int64_t(v.size()) / cols, cols}}});
  w.write_next(std::as_bytes(v));
  w.finish();
}

std::vector<float> read_floats(const fs::path& file, size_t n) {
  SafetensorsFile f(file);
  std::vector<float> v(n);
  read_into(f, "x", v);
  return v;
}

void write_json(const fs::path& file, const nlohmann::json& j) {
  const fs::path tmp = file.string() + ".tmp";
  {
    std::ofstream f(tmp);
    f << j.dump(1) << "\n";
    EXL_CHECK(f.good(), "engine: quantize: cannot write '", tmp.string(), "'");
  }
  fs::rename(tmp, file);
}

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

void write_config(const ModelDir& in, const QuantizeOptions& o, const CalibrationSet& cal, const fs::path& tmp) {
  nlohmann::json cfg = in.config_json();
  cfg["torch_dtype"] = "float16";
  cfg["quantization_config"] = {
      {"quant_method", "exl2"},
      {"version", kVersion},
      {"bits", o.bpw},
      {"head_bits", o.head_bits},
      {"calibration",
       {{"rows", cal.rows.size()}, {"length", cal.rows.empty() ? 0 : cal.rows[0].size()}, {"dataset", cal.source}}}};
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

std::string model_fingerprint(const ModelConfig& c) {
  return cat(c.architecture, " layers ", c.num_layers, " hidden ", c.hidden_size, " intermediate ",
             c.intermediate_size, " heads ", c.num_heads, "/", c.num_kv_heads, " head_dim ", c.head_dim, " vocab ",
             c.vocab_size);
}

// What makes two runs the same job (a partial directory is resumed only for the same job).
nlohmann::json job_fingerprint(const fs::path& in, const QuantizeOptions& o, const ModelConfig& c) {
  return {{"version", kVersion},
          {"in", fs::absolute(in).lexically_normal().string()},
          {"model", model_fingerprint(c)},
          {"bpw", o.bpw},
          {"head_bits", o.head_bits},
          {"calibration", o.calibration.empty() ? "" : fs::absolute(o.calibration).lexically_normal().string()},
          {"cal_rows", o.cal_rows},
          {"cal_length", o.cal_length},
          {"cal_seed", o.cal_seed},
          {"measurement", o.measurement.empty() ? "" : fs::absolute(o.measurement).lexically_normal().string()},
          {"damp", o.damp},
          {"measure_rows", o.measure_rows}};
}

// The job's state in the partial directory (job.json): what is done, and the reports of it.
struct JobState {
  nlohmann::json fingerprint;
  int64_t done_layers = 0;
  std::vector<QuantizedBlockReport> blocks;
  std::vector<QuantizedLayerReport> layers;
};

nlohmann::json to_json(const JobState& s) {
  nlohmann::json blocks = nlohmann::json::array(), layers = nlohmann::json::array();
  for (const auto& b : s.blocks)
    blocks.push_back({{"name", b.name}, {"bpw", b.bpw}, {"measured_error", b.measured_error},
                      {"output_error", b.output_error}, {"seconds", b.seconds}});
  for (const auto& l : s.layers)
    layers.push_back({{"name", l.name}, {"layout", l.layout}, {"bpw", l.bpw}, {"rel_error", l.rel_error}});
  return {{"fingerprint", s.fingerprint}, {"done_layers", s.done_layers}, {"blocks", blocks}, {"layers", layers}};
}

JobState job_from_json(const nlohmann::json& j) {
  JobState s;
  s.fingerprint = j.at("fingerprint");
  s.done_layers = j.at("done_layers").get<int64_t>();
  for (const auto& b : j.at("blocks"))
    s.blocks.push_back({b.at("name").get<std::string>(), b.at("bpw").get<double>(), b.at("measured_error").get<double>(),
                        b.at("output_error").get<double>(), b.at("seconds").get<double>()});
  for (const auto& l : j.at("layers"))
    s.layers.push_back({l.at("name").get<std::string>(), l.at("layout").get<std::string>(), l.at("bpw").get<double>(),
                        l.at("rel_error").get<double>()});
  return s;
}

// The partial directory's job when it is this job; otherwise a fresh, empty directory.
JobState open_partial(const fs::path& dir, const nlohmann::json& fingerprint) {
  const fs::path job = dir / "job.json";
  if (fs::exists(job)) {
    try {
      JobState s = job_from_json(read_json_file(job));
      if (s.fingerprint == fingerprint) return s;
    } catch (const std::exception&) {  // unreadable state: start over
    }
  }
  fs::remove_all(dir);
  fs::create_directories(dir);
  JobState s;
  s.fingerprint = fingerprint;
  write_json(job, to_json(s));
  return s;
}

CalibrationSet calibration_rows(const fs::path& in_dir, const CalibModel& cm, const QuantizeOptions& o, ThreadPool& pool) {
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_tokenizer(in_dir);
  } catch (const Error&) {
    if (!o.calibration.empty()) throw;
  }
  if (!o.calibration.empty()) return calibration_from_file(o.calibration, *tok, o.cal_rows, o.cal_length);
  std::optional<int32_t> bos;
  if (tok && tok->bos_id()) bos = *tok->bos_id();
  else if (!cm.config().bos_token_ids.empty()) bos = int32_t(cm.config().bos_token_ids[0]);
  return self_generated_calibration(cm, o.cal_rows, o.cal_length, o.cal_seed, bos, &pool);
}

CalibrationSet load_or_make_calibration(const fs::path& partial, const fs::path& in_dir, const CalibModel& cm,
                                        const QuantizeOptions& o, ThreadPool& pool) {
  const fs::path file = partial / "calibration.json";
  CalibrationSet cal;
  if (fs::exists(file)) {
    const auto j = read_json_file(file);
    cal.source = j.at("source").get<std::string>();
    cal.rows = j.at("rows").get<std::vector<std::vector<int32_t>>>();
    return cal;
  }
  cal = calibration_rows(in_dir, cm, o, pool);
  write_json(file, {{"source", cal.source}, {"rows", cal.rows}});
  return cal;
}

}  // namespace quantize_model_impl

namespace quantize_model_impl {

// What the phases of one run share.
struct Job {
  const ModelDir& in;
  const CalibModel& cm;
  ThreadPool& pool;
  const GptqRunner& gptq;
  const QuantizeOptions& o;
  std::vector<LinearSpec> specs;  // decoder linears, layer by layer (kLinearsPerLayer each), then the head
  CalibPositions pos;             // the calibration rows as one batch
  std::unique_ptr<KvPool> kv;     // one layer's cache for them
  std::map<std::string, double>& steps;  // wall seconds per step (QuantizeReport::step_seconds)
};

// f(), its wall time added to job.steps[step]. Device work is timed where its results reach the
// host, which every step here waits for.
template <typename F>
decltype(auto) timed(Job& job, const char* step, F&& f) {
  struct Add {
    Job& job;
    const char* step;
    Clock::time_point t0 = Clock::now();
    ~Add() { job.steps[step] += seconds_since(t0); }
  } add{job, step};
  return f();
}

using PlanPtr = std::shared_ptr<const GptqRunner::Plan>;

Exl2Tensors gptq_tensors(const Job& job, const DenseLayer& d, const GptqRunner::Weight& w, const LinearSpec& s,
                         const GptqRunner::Plan& plan, const QuantOption& layout) {
  Exl2Tensors t = job.gptq.quantize(w, plan, option_groups(layout, s.in_features));
  if (!d.bias.empty()) t.bias = to_f16(d.bias);
  return t;
}

std::unique_ptr<PreparedLinear> prepare_quantized(const CalibModel& cm, const Exl2Tensors& t, const DenseLayer& d) {
  Exl2Matrix m = t.view();
  m.bias = d.bias;
  return cm.prepare(m);
}

int64_t layout_bits(const QuantOption& layout, const LinearSpec& s) {
  return exl2_storage_bits(option_groups(layout, s.in_features), s.in_features, s.out_features);
}

// Every candidate of one block scored by its output error Σ‖y_q − y‖² / Σ‖y‖² (each distinct
// layout of each linear GPTQ-quantized once; `run` evaluates the block with the given linears).
// *probe receives the output of the candidate nearest 4 bpw, the sensitivity probe.
BlockMeasurement measure_block(
    Job& job, std::string name, std::span<const LinearSpec> specs, std::span<const GptqRunner::Plan* const> plans,
    std::span<const BlockLayout> candidates, std::span<const float> y_ref,
    const std::function<std::vector<float>(std::span<const PreparedLinear* const>)>& run, std::vector<float>* probe,
    size_t* probe_index) {
  std::vector<DenseLayer> dense;
  std::vector<std::shared_ptr<const GptqRunner::Weight>> held;
  int64_t weights = 0;
  timed(job, "measure: load weights", [&] {
    for (const auto& s : specs) dense.push_back(load_dense(job.in, s, job.pool)), weights += s.in_features * s.out_features;
    for (size_t i = 0; i < specs.size(); ++i)
      held.push_back(job.gptq.weight(dense[i].w, specs[i].out_features, specs[i].in_features));
  });
  std::vector<std::map<std::string, Exl2Tensors>> cache(specs.size());
  BlockMeasurement bm{std::move(name), 0, {}};
  const double norm = std::max(sum_squares(y_ref), 1e-30);
  double probe_dist = INFINITY;
  for (const BlockLayout& cand : candidates) {
    std::vector<std::unique_ptr<PreparedLinear>> prepared;
    std::vector<const PreparedLinear*> ptrs;
    BlockOptionScore score{cand, 0, 0, 0};
    for (size_t i = 0; i < specs.size(); ++i) {
      auto [it, fresh] = cache[i].try_emplace(to_string(cand[i]));
      if (fresh)
        it->second = timed(job, "measure: gptq",
                           [&] { return gptq_tensors(job, dense[i], *held[i], specs[i], *plans[i], cand[i]); });
      prepared.push_back(timed(job, "measure: prepare", [&] { return prepare_quantized(job.cm, it->second, dense[i]); }));
      ptrs.push_back(prepared.back().get());
      score.bits += layout_bits(cand[i], specs[i]);
    }
    std::vector<float> y = timed(job, "measure: candidate blocks", [&] { return run(ptrs); });
    score.output_error = sum_sq_diff(y, y_ref) / norm;
    const double dist = std::fabs(double(score.bits) / double(weights) - 4.0);
    if (dist < probe_dist) probe_dist = dist, *probe = std::move(y), *probe_index = bm.options.size();
    bm.options.push_back(std::move(score));
  }
  return bm;
}

// The first measure_rows calibration rows (all with 0): what candidates and output errors are
// scored on.
CalibPositions scored_rows(const Job& job) {
  CalibPositions sub = job.pos;
  if (job.o.measure_rows > 0) sub.rows = std::min(sub.rows, job.o.measure_rows);
  return sub;
}

size_t floats_of(const Job& job, const CalibPositions& p) { return size_t(p.tokens() * job.cm.config().hidden_size); }

// Σ‖y − y_ref‖² / Σ‖y_ref‖² over the scored rows of two activations in backend memory.
double scored_rel_error(const Job& job, const Buffer& y, const Buffer& y_ref) {
  const size_t n = floats_of(job, scored_rows(job));
  const std::vector<float> a = job.cm.to_host(y, n), b = job.cm.to_host(y_ref, n);
  return sum_sq_diff(a, b) / std::max(sum_squares(b), 1e-30);
}

// Block `b` (2·layer for attention, 2·layer + 1 for the MLP) of the source model.
Buffer source_block(Job& job, int64_t b, const Buffer& x, const CalibPositions& pos) {
  return b % 2 ? job.cm.mlp_block(b / 2, x, pos) : job.cm.attention_block(b / 2, x, pos, *job.kv, 0);
}

// The measurement pass on the source model's own activations (x: the embeddings, in backend
// memory, as every activation here stays). The Hessians use every calibration row; the
// candidates are scored on the first measure_rows rows (the block evaluations are the pass's
// cost). Each block's candidates get their output error; the block's sensitivity (the final
// logits' mean KL from the source model's per unit of output error, measured by running the probe
// candidate's output through the rest of the source model) turns them into the predicted KL the
// allocation sums. Memory: the activations of one block at a time (its input and output, its
// linears' inputs); a first pass of the scored rows through the source model keeps their final
// logits.
Measurement measure(Job& job, Buffer x, const std::string& calibration, const QuantizeProgress& progress) {
  const ModelConfig& c = job.cm.config();
  Measurement m{model_fingerprint(c), calibration, {}};
  const double damp = job.o.damp;
  const int64_t n_blocks = 2 * c.num_layers, T = job.pos.tokens();
  const CalibPositions sub = scored_rows(job);
  const size_t sub_n = floats_of(job, sub);
  KlReference ref;
  timed(job, "measure: reference pass", [&] {
    Buffer y = source_block(job, 0, x, sub);
    for (int64_t b = 1; b < n_blocks; ++b) y = source_block(job, b, y, sub);
    ref = kl_reference(job.cm, job.cm.to_host(y, sub_n), sub.n_tokens, job.pool);
  });
  const char* fwd = "measure: block forwards";
  const char* hess = "measure: hessian + factor";
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t l = b / 2;
    const std::span<const LinearSpec> lin(job.specs.data() + l * kLinearsPerLayer, kLinearsPerLayer);
    Buffer xn, act, next;
    std::vector<float> probe;
    size_t probe_index = 0;
    if (b % 2 == 0) {
      next = timed(job, fwd, [&] { return job.cm.attention_block(l, x, job.pos, *job.kv, 0, {}, &xn, &act); });
      const PlanPtr p_in = timed(job, hess, [&] { return job.gptq.plan_resident(xn.f32(), T, c.hidden_size, damp); }),
                    p_o = timed(job, hess, [&] { return job.gptq.plan_resident(act.f32(), T, lin[3].in_features, damp); });
      xn.reset(), act.reset();
      const GptqRunner::Plan* plans[kAttnLinears] = {p_in.get(), p_in.get(), p_in.get(), p_o.get()};
      m.blocks.push_back(measure_block(job, cat("model.layers.", l, ".self_attn"), lin.subspan(0, kAttnLinears), plans,
                                       attention_candidates(), job.cm.to_host(next, sub_n),
                                       [&](std::span<const PreparedLinear* const> w) {
                                         return job.cm.to_host(job.cm.attention_block(l, x, sub, *job.kv, 0, w), sub_n);
                                       }, &probe, &probe_index));
    } else {
      next = timed(job, fwd, [&] { return job.cm.mlp_block(l, x, job.pos, {}, &xn, &act); });
      const PlanPtr p_in = timed(job, hess, [&] { return job.gptq.plan_resident(xn.f32(), T, c.hidden_size, damp); }),
                    p_down = timed(job, hess,
                                   [&] { return job.gptq.plan_resident(act.f32(), T, c.intermediate_size, damp); });
      xn.reset(), act.reset();
      const GptqRunner::Plan* plans[kMlpLinears] = {p_in.get(), p_in.get(), p_down.get()};
      m.blocks.push_back(measure_block(job, cat("model.layers.", l, ".mlp"), lin.subspan(kAttnLinears, kMlpLinears),
                                       plans, mlp_candidates(), job.cm.to_host(next, sub_n),
                                       [&](std::span<const PreparedLinear* const> w) {
                                         return job.cm.to_host(job.cm.mlp_block(l, x, sub, w), sub_n);
                                       }, &probe, &probe_index));
    }
    BlockMeasurement& bm = m.blocks.back();
    const double probe_err = bm.options[probe_index].output_error;
    timed(job, "measure: sensitivity", [&] {
      Buffer y = job.cm.to_backend(probe);
      for (int64_t r = b + 1; r < n_blocks; ++r) y = source_block(job, r, y, sub);
      bm.sensitivity = probe_err > 0 ? mean_kl(job.cm, ref, job.cm.to_host(y, sub_n), job.pool) / probe_err : 0;
    });
    for (auto& o : bm.options) o.error = bm.sensitivity * o.output_error;
    x = std::move(next);
    if (progress) progress("measure", size_t(b + 1), size_t(n_blocks));
  }
  return m;
}

void check_measurement(const Measurement& m, const ModelConfig& c, const std::string& where) {
  EXL_CHECK(int64_t(m.blocks.size()) == 2 * c.num_layers, "engine: quantize: measurement '", where, "' has ",
            m.blocks.size(), " blocks; this model has ", 2 * c.num_layers, " (", c.num_layers, " layers)");
  for (size_t b = 0; b < m.blocks.size(); ++b) {
    const int64_t l = int64_t(b / 2);
    const std::string want = cat("model.layers.", l, b % 2 ? ".mlp" : ".self_attn");
    EXL_CHECK(m.blocks[b].name == want, "engine: quantize: measurement '", where, "': block ", b, " is '",
              m.blocks[b].name, "', expected '", want, "'");
    const size_t n = b % 2 ? kMlpLinears : kAttnLinears;
    for (const auto& o : m.blocks[b].options)
      EXL_CHECK(o.layout.size() == n, "engine: quantize: measurement '", where, "': block '", want, "' has a layout of ",
                o.layout.size(), " linears, expected ", n);
  }
}

// One quantized linear of the quantize pass, with its report row.
struct DoneLinear {
  Exl2Tensors t;
  std::unique_ptr<PreparedLinear> prepared;
};

DoneLinear finish_linear(Job& job, const LinearSpec& s, const GptqRunner::Plan& plan, const QuantOption& layout,
                         std::vector<QuantizedLayerReport>& reports) {
  const DenseLayer d = timed(job, "quantize: load weights", [&] { return load_dense(job.in, s, job.pool); });
  DoneLinear out{timed(job, "quantize: gptq",
                       [&] { return gptq_tensors(job, d, *job.gptq.weight(d.w, s.out_features, s.in_features), s, plan, layout); }),
                 nullptr};
  out.prepared = prepare_quantized(job.cm, out.t, d);
  double err = 0, norm = 0;
  timed(job, "quantize: weight error", [&] {
    const int64_t K = s.in_features, N = s.out_features, chunk = 64;
    const auto back = std::make_unique_for_overwrite<float[]>(size_t(N * K));
    const std::span<float> all(back.get(), size_t(N * K));
    std::vector<double> part_err(size_t((N + chunk - 1) / chunk)), part_norm(part_err.size());
    const Exl2Matrix view = out.t.view();
    job.pool.parallel_for(int64_t(part_err.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t r0 = i * chunk, r1 = std::min(r0 + chunk, N);
        dequantize_rows(view, all, r0, r1);
        const size_t at = size_t(r0 * K), n = size_t((r1 - r0) * K);
        part_err[size_t(i)] = sum_sq_diff(all.subspan(at, n), std::span(d.w).subspan(at, n));
        part_norm[size_t(i)] = sum_squares(std::span(d.w).subspan(at, n));
      }
    });
    for (size_t i = 0; i < part_err.size(); ++i) err += part_err[i], norm += part_norm[i];
  });
  reports.push_back({s.name, to_string(layout), 8.0 * double(out.t.storage_bytes()) / double(d.w.size()),
                     std::sqrt(err / std::max(norm, 1e-30))});
  return out;
}

// One decoder layer of the quantize pass: x (its input in the partly quantized model, in backend
// memory) becomes its output; the layer's tensors are returned in model order.
std::vector<Exl2Tensors> quantize_layer(Job& job, int64_t l, Buffer& x, const BlockLayout& attn,
                                        const BlockLayout& mlp, JobState& state) {
  const ModelConfig& c = job.cm.config();
  const std::span<const LinearSpec> lin(job.specs.data() + l * kLinearsPerLayer, kLinearsPerLayer);
  const int64_t T = job.pos.tokens();
  const double damp = job.o.damp;
  const char* fwd = "quantize: block forwards";
  const char* hess = "quantize: hessian + factor";
  std::vector<DoneLinear> done;
  auto t0 = Clock::now();
  Buffer in;
  const Buffer a_ref = timed(job, fwd, [&] { return job.cm.attention_block(l, x, job.pos, *job.kv, 0, {}, &in); });
  PlanPtr plan = timed(job, hess, [&] { return job.gptq.plan_resident(in.f32(), T, c.hidden_size, damp); });
  for (int i = 0; i < 3; ++i) done.push_back(finish_linear(job, lin[size_t(i)], *plan, attn[size_t(i)], state.layers));
  const PreparedLinear* w[kAttnLinears] = {done[0].prepared.get(), done[1].prepared.get(), done[2].prepared.get(), nullptr};
  timed(job, fwd, [&] { return job.cm.attention_block(l, x, job.pos, *job.kv, 0, std::span(w, 3), nullptr, &in); });
  plan = timed(job, hess, [&] { return job.gptq.plan_resident(in.f32(), T, lin[3].in_features, damp); });
  in.reset();
  done.push_back(finish_linear(job, lin[3], *plan, attn[3], state.layers));
  w[3] = done[3].prepared.get();
  x = timed(job, fwd, [&] { return job.cm.attention_block(l, x, job.pos, *job.kv, 0, w); });
  int64_t bits = 0, weights = 0;
  for (int i = 0; i < kAttnLinears; ++i)
    bits += 8 * done[size_t(i)].t.storage_bytes(), weights += lin[size_t(i)].in_features * lin[size_t(i)].out_features;
  state.blocks.push_back({cat("model.layers.", l, ".self_attn"), double(bits) / double(weights), 0,
                          scored_rel_error(job, x, a_ref), seconds_since(t0)});
  t0 = Clock::now();
  const Buffer m_ref = timed(job, fwd, [&] { return job.cm.mlp_block(l, x, job.pos, {}, &in); });
  plan = timed(job, hess, [&] { return job.gptq.plan_resident(in.f32(), T, c.hidden_size, damp); });
  for (int i = 0; i < 2; ++i) done.push_back(finish_linear(job, lin[size_t(4 + i)], *plan, mlp[size_t(i)], state.layers));
  const PreparedLinear* g[kMlpLinears] = {done[4].prepared.get(), done[5].prepared.get(), nullptr};
  timed(job, fwd, [&] { return job.cm.mlp_block(l, x, job.pos, std::span(g, 2), nullptr, &in); });
  plan = timed(job, hess, [&] { return job.gptq.plan_resident(in.f32(), T, lin[6].in_features, damp); });
  in.reset();
  done.push_back(finish_linear(job, lin[6], *plan, mlp[2], state.layers));
  g[2] = done[6].prepared.get();
  x = timed(job, fwd, [&] { return job.cm.mlp_block(l, x, job.pos, g); });
  bits = weights = 0;
  for (int i = kAttnLinears; i < kLinearsPerLayer; ++i)
    bits += 8 * done[size_t(i)].t.storage_bytes(), weights += lin[size_t(i)].in_features * lin[size_t(i)].out_features;
  state.blocks.push_back({cat("model.layers.", l, ".mlp"), double(bits) / double(weights), 0,
                          scored_rel_error(job, x, m_ref), seconds_since(t0)});
  std::vector<Exl2Tensors> out;
  for (auto& d : done) out.push_back(std::move(d.t));
  return out;
}

// The quantize phase from the job state's first unfinished layer; each finished layer is saved
// (its tensors, the hidden state after it, the job state) before the next one starts. Returns
// every linear's tensors, the head's last, and adds the head's report row to *head_report.
std::vector<Exl2Tensors> quantize_pass(Job& job, const Measurement& m, std::span<const size_t> pick,
                                       const QuantOption& head_option, std::span<const int32_t> ids,
                                       const fs::path& partial, JobState& state,
                                       std::vector<QuantizedLayerReport>& head_report,
                                       const QuantizeProgress& progress) {
  const ModelConfig& c = job.cm.config();
  const ModelDir& in = job.in;
  const std::vector<LinearSpec>& specs = job.specs;
  const int64_t T = job.pos.tokens();
  const size_t all = floats_of(job, job.pos);
  // hidden_<l>: the output of quantized layer l. Written before job.json records the layer done,
  // and the previous one removed only after, so a kill at any point leaves a consistent pair.
  auto hidden = [&](int64_t l) { return partial / cat("hidden_", l, ".safetensors"); };
  Buffer x = state.done_layers ? job.cm.to_backend(read_floats(hidden(state.done_layers - 1), all))
                               : job.cm.embed(ids);
  const size_t q_total = size_t(c.num_layers + 1);
  for (int64_t l = state.done_layers; l < c.num_layers; ++l) {
    const auto& attn = m.blocks[size_t(2 * l)].options[pick[size_t(2 * l)]];
    const auto& mlp = m.blocks[size_t(2 * l + 1)].options[pick[size_t(2 * l + 1)]];
    const std::vector<Exl2Tensors> ts = quantize_layer(job, l, x, attn.layout, mlp.layout, state);
    state.blocks[state.blocks.size() - 2].measured_error = attn.error;
    state.blocks.back().measured_error = mlp.error;
    timed(job, "quantize: saving finished layers", [&] {
      std::vector<const Exl2Tensors*> tp;
      for (const auto& t : ts) tp.push_back(&t);
      write_linears(partial / cat("layer_", l, ".safetensors"),
                    std::span(specs).subspan(size_t(l * kLinearsPerLayer), kLinearsPerLayer), tp);
      write_floats(hidden(l), job.cm.to_host(x, all), c.hidden_size);
      state.done_layers = l + 1;
      write_json(partial / "job.json", to_json(state));
      if (l > 0) fs::remove(hidden(l - 1));
    });
    if (progress) progress("quantize", size_t(l + 1), q_total);
  }
  std::vector<Exl2Tensors> tensors;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const SafetensorsFile f(partial / cat("layer_", l, ".safetensors"));
    for (int i = 0; i < kLinearsPerLayer; ++i) {
      const LinearSpec& s = specs[size_t(l * kLinearsPerLayer + i)];
      const size_t b = size_t(2 * l + (i >= kAttnLinears));
      tensors.push_back(read_linear(f, s, m.blocks[b].options[pick[b]].layout[size_t(i < kAttnLinears ? i : i - kAttnLinears)],
                                    in.has(*resolve_linear_prefix(in, s.name) + ".bias")));
    }
  }
  const Buffer head_in = job.cm.final_norm(x, T);
  x.reset();
  const PlanPtr plan = job.gptq.plan_resident(head_in.f32(), T, c.hidden_size, job.o.damp);
  tensors.push_back(std::move(finish_linear(job, specs.back(), *plan, head_option, head_report).t));
  if (progress) progress("quantize", q_total, q_total);
  return tensors;
}

// The write phase: output.safetensors, config.json, the side files and measurement.json in
// partial/out, renamed to `out`; the partial directory is removed then.
void write_output(const ModelDir& in, const QuantizeOptions& o, const CalibrationSet& cal, const Measurement& m,
                  std::span<const LinearSpec> specs, std::span<const Exl2Tensors> tensors,
                  const std::set<std::string>& consumed, const fs::path& partial, const fs::path& out,
                  const QuantizeProgress& progress) {
  const auto others = other_tensors(in, consumed);
  std::vector<SafetensorsWriter::Entry> wide, narrow;
  for (size_t i = 0; i < specs.size(); ++i) declare_exl2_tensors(specs[i].name, tensors[i], wide, narrow);
  for (const auto& [name, data] : others) narrow.push_back({name, DType::f16, in.find(name)->info->shape});
  wide.insert(wide.end(), narrow.begin(), narrow.end());
  const fs::path stage = partial / "out";
  fs::remove_all(stage);
  fs::create_directories(stage);
  {
    SafetensorsWriter w(stage / "output.safetensors", wide);
    const size_t total = 2 * specs.size() + others.size();
    size_t done = 0;
    auto tick = [&] {
      if (progress) progress("write", ++done, total);
    };
    for (const auto& t : tensors) write_exl2_wide(w, t), tick();
    for (const auto& t : tensors) write_exl2_narrow(w, t), tick();
    for (const auto& [name, data] : others) w.write_next(std::as_bytes(std::span<const uint16_t>(data))), tick();
    w.finish();
  }
  write_config(in, o, cal, stage);
  copy_side_files(in.path(), stage);
  save_measurement(m, stage / "measurement.json");
  EXL_CHECK(!fs::exists(out), "engine: quantize: output '", out.string(), "' appeared while quantizing");
  fs::rename(stage, out);
  fs::remove_all(partial);
}

// Whether --backend NAME means the CUDA backend (and the device GPTQ).
bool use_cuda(const std::string& backend) {
  if (backend == "cpu") return false;
  if (backend == "cuda") {
    EXL_CHECK(cuda_device_count() > 0, "engine: quantize: --backend cuda: ", cuda_device_description());
    return true;
  }
  EXL_CHECK(backend == "auto", "engine: quantize: --backend must be cpu, cuda or auto, got '", backend, "'");
  return cuda_device_count() > 0;
}

}  // namespace quantize_model_impl

QuantizeReport quantize_model(const fs::path& in_dir, const fs::path& out, QuantizeOptions o,
                              const QuantizeProgress& progress) {
  using namespace quantize_model_impl;
  EXL_CHECK(o.bpw >= 2.5 && o.bpw <= 8.0, "engine: quantize: --bpw must be in [2.5, 8.0], got ", o.bpw);
  const QuantOption head_option = head_quant_option(o.head_bits);
  EXL_CHECK(o.rope_table, "engine: quantize: no RoPE table function in the options");
  EXL_CHECK(!fs::exists(out), "engine: quantize: output '", out.string(), "' already exists");
  const ModelDir in(in_dir);
  const ModelConfig& c = in.config();
  EXL_CHECK(c.quant_method.empty(), "engine: quantize: '", in_dir.string(), "' is already quantized (quant_method '",
            c.quant_method, "')");
  EXL_CHECK(o.cal_rows >= 0 && o.cal_length >= 16, "engine: quantize: --cal-rows must not be negative and "
            "--cal-length at least 16, got ", o.cal_rows, " and ", o.cal_length);

  const bool cuda_wanted = use_cuda(o.backend);
  std::vector<LinearSpec> specs;
  for (int64_t l = 0; l < c.num_layers; ++l)
    for (auto& s : decoder_layer_linears(c, l)) specs.push_back(std::move(s));
  const size_t n_decoder = specs.size();
  specs.push_back(head_linear(c));
  if (!o.cal_rows) {
    // GPTQ needs a well-sampled Hessian: rows x length tokens of at least 8x the widest input.
    int64_t widest = 0;
    for (const auto& s : specs) widest = std::max(widest, s.in_features);
    o.cal_rows = std::max<int64_t>(32, (8 * widest + o.cal_length - 1) / o.cal_length);
  }
  std::set<std::string> consumed;
  for (const auto& s : specs) {
    load_source(in, s);  // fails fast on missing, malformed or quantized tensors
    if (*resolve_linear_prefix(in, s.name) == s.name) consumed.insert({s.name + ".weight", s.name + ".bias"});
  }
  std::optional<Measurement> given;
  if (!o.measurement.empty()) {
    given = load_measurement(o.measurement);
    check_measurement(*given, c, o.measurement.string());
  }

  const fs::path partial = out.parent_path() / ("." + out.filename().string() + ".partial");
  JobState state = open_partial(partial, job_fingerprint(in_dir, o, c));
  QuantizeReport report;
  report.target_bpw = o.bpw;
  report.resumed_layers = state.done_layers;

  const bool cuda = cuda_wanted;
  report.backend = cuda ? "cuda" : "cpu";
  auto be = cuda ? make_cuda_backend(0) : make_cpu_backend(o.threads);
  ThreadPool pool(o.threads);
  const std::unique_ptr<GptqDevice> device = cuda ? make_cuda_gptq_device(0) : nullptr;
  const GptqRunner gptq(pool, device.get());
  const CalibModel cm(in, *be, o.rope_table(c));
  auto t0 = Clock::now();
  if (progress) progress("calibrate", 0, 1);
  const CalibrationSet cal = load_or_make_calibration(partial, in_dir, cm, o, pool);
  if (progress) progress("calibrate", 1, 1);
  report.calibration = cal.source;
  report.seconds_calibrate = seconds_since(t0);
  const int64_t rows = int64_t(cal.rows.size()), len = int64_t(cal.rows[0].size());
  Job job{in, cm, pool, gptq, o, specs, {rows, len, 0, len}, cm.kv_pool(rows, len, 1), report.step_seconds};
  std::vector<int32_t> ids;
  for (const auto& r : cal.rows) ids.insert(ids.end(), r.begin(), r.end());

  t0 = Clock::now();
  Measurement m;
  if (given) {
    m = *given, report.measurement_reused = true;
  } else if (fs::exists(partial / "measurement.json")) {
    m = load_measurement(partial / "measurement.json");
  } else {
    m = measure(job, cm.embed(ids), cal.source, progress);
    save_measurement(m, partial / "measurement.json");
  }
  report.seconds_measure = seconds_since(t0);
  std::vector<LayerOptions> slots;
  for (const auto& b : m.blocks) {
    LayerOptions lo;
    for (const auto& s : b.options) lo.bits.push_back(s.bits), lo.error.push_back(s.error);
    slots.push_back(std::move(lo));
  }
  int64_t weights = 0;
  for (size_t i = 0; i < n_decoder; ++i) weights += specs[i].in_features * specs[i].out_features;
  const auto pick = allocate_bits(slots, int64_t(std::floor(o.bpw * double(weights))));

  t0 = Clock::now();
  std::vector<QuantizedLayerReport> head_report;
  const std::vector<Exl2Tensors> tensors =
      quantize_pass(job, m, pick, head_option, ids, partial, state, head_report, progress);
  report.layers = state.layers;
  report.layers.push_back(head_report.at(0));
  report.seconds_quantize = seconds_since(t0);
  report.blocks = state.blocks;
  double bits = 0, err = 0;
  for (size_t i = 0; i < n_decoder; ++i) {
    bits += 8.0 * double(tensors[i].storage_bytes());
    err += report.layers[i].rel_error;
  }
  report.layers_bpw = bits / double(weights);
  report.mean_rel_error = n_decoder ? err / double(n_decoder) : 0;
  report.head_bpw = report.layers.back().bpw;

  t0 = Clock::now();
  write_output(in, o, cal, m, specs, tensors, consumed, partial, out, progress);
  report.seconds_write = seconds_since(t0);
  return report;
}

}  // namespace exl
