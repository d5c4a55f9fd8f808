// The source (FP16/BF16/FP32) model run block by block on a Backend for the converter: embeddings,
// each decoder layer's attention block and MLP block as separate calls on host activations, with
// the inputs of every linear captured on request (the Hessians' X), and any block run with other
// linears in place of the source ones (candidate layouts, already quantized layers). All math goes
// through Backend ops, so a device backend runs it unchanged.
//
// Batches are `rows` sequences of equal length (CalibPositions). One attention block at a time
// needs a KV pool of one layer (kv_layer 0) for whole-row batches; incremental decoding
// (generate()) uses one of every layer. Not thread-safe (one Backend, one thread).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/formats/linear_loader.h"
#include "engine/formats/model_dir.h"
#include "kernels/backend.h"

namespace exl {

class ThreadPool;

// Which positions the T rows of an activation [T, hidden] are: `rows` sequences of `n_tokens`
// each, at positions pos_start.., rows of one sequence consecutive.
struct CalibPositions {
  int64_t rows = 0, n_tokens = 0, pos_start = 0, max_len = 0;
  int64_t tokens() const { return rows * n_tokens; }
};

// The linears of a block in model order: attention q, k, v, o; MLP gate, up, down.
constexpr int kAttnLinears = 4, kMlpLinears = 3;

class CalibModel {
 public:
  // Reads every weight of `dir` (must be unquantized). rope: the model's table (engine/rope.h).
  CalibModel(const ModelDir& dir, Backend& backend, RopeTable rope);
  ~CalibModel();

  const ModelConfig& config() const { return cfg_; }
  Backend& backend() const { return be_; }
  // The source linears of layer l: 0..3 attention (q, k, v, o), 4..6 MLP (gate, up, down).
  const PreparedLinear& source(int64_t layer, int which) const;
  std::unique_ptr<PreparedLinear> prepare(const LinearWeights& w) const { return be_.prepare_linear(w); }

  // x [T, hidden] = embed(ids) in backend memory, ids [T] host.
  Buffer embed(std::span<const int32_t> ids) const;
  // Host floats copied to new backend memory, and the first n floats of backend memory to the host.
  Buffer to_backend(std::span<const float> host) const;
  std::vector<float> to_host(const Buffer& b, size_t n) const;
  // The blocks work on activations in backend memory (device memory on a device backend), so that
  // a converter's activations need not cross to the host. x holds at least p.tokens() rows [T,
  // hidden] (a larger batch whose first rows p describes works); the output is new backend memory,
  // and the captured inputs arrive as new backend memory. The backend's work is complete on return
  // (another stream may read the results).
  // out = x + attention(rms_norm(x)) with the given q, k, v, o (null: the source's); `xn` / `att`
  // receive the inputs of q/k/v [T, hidden] and of o [T, heads·head_dim]. kv_layer selects the
  // pool layer (pool from kv_pool()).
  Buffer attention_block(int64_t layer, const Buffer& x, const CalibPositions& p, KvPool& pool, int kv_layer,
                         std::span<const PreparedLinear* const> qkvo = {}, Buffer* xn = nullptr,
                         Buffer* att = nullptr) const;
  // out = x + down(silu(gate(xn)) · up(xn)), xn = rms_norm(x); `xn` / `act` receive the inputs of
  // gate/up [T, hidden] and of down [T, intermediate].
  Buffer mlp_block(int64_t layer, const Buffer& x, const CalibPositions& p,
                   std::span<const PreparedLinear* const> gud = {}, Buffer* xn = nullptr, Buffer* act = nullptr) const;
  // rms_norm(x) with the final norm (the head's input), [tokens, hidden].
  Buffer final_norm(const Buffer& x, int64_t tokens) const;
  // head(final_norm(x)), [T, vocab].
  std::vector<float> logits(std::span<const float> x) const;

  // A pool for `rows` sequences of up to max_len positions over n_layers layers.
  std::unique_ptr<KvPool> kv_pool(int64_t rows, int64_t max_len, int n_layers) const;

  // `rows` sequences continued from `prompts` (one per row, equal lengths) to `length` tokens,
  // each next token sampled from softmax(logits) by next(row, logits[vocab]), with the source
  // weights and an incremental KV cache. On a backend with device memory the rows run in batches
  // whose KV pool (every layer, f32) takes at most half the free memory; next() sees them in order.
  // With `pool`, next() runs for the rows of a step in parallel (it must be safe to call
  // concurrently for different rows).
  std::vector<std::vector<int32_t>> generate(
      std::span<const std::vector<int32_t>> prompts, int64_t length,
      const std::function<int32_t(int64_t row, std::span<const float> logits)>& next,
      ThreadPool* pool = nullptr) const;

 private:
  struct Layer;
  Backend& be_;
  ModelConfig cfg_;
  RopeTable rope_;
  std::unique_ptr<PreparedEmbedding> embed_;
  std::vector<Layer> layers_;
  Buffer final_norm_;
  std::unique_ptr<PreparedLinear> head_;
};

}  // namespace exl
