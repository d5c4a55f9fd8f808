// Producer → reader hand-off between consecutive ops of a decode step (Exl2GemvHandoff,
// AttnArgs::out_perm): the op that writes a gemv's input (attention → o projection, o projection
// → gate/up, gate/up → down, down → the next layer's q/k/v) also writes it in that gemv's
// act-order, and a residual producer the tile sums of squares the reader's norm needs, so the
// reader's blocks neither look up the permutation nor read all of x. Pairs are learned from the
// ops of one step (a reader whose input the previous op wrote) and take effect from the next
// step (decode steps repeat their ops); until then, and whenever the previous op is not the
// learned producer with the same buffers, the reader gathers through its permutation as before.
// EXL_CUDA_HANDOFF=0 turns it off (for comparisons). Beyond two rows a producer may instead have
// staged the reader's tensor-core input (produce_staged / read_staged: the reader then runs no
// norm or staging kernel; EXL_CUDA_LAYER_CHAINS=0 in the backend turns those off). Host code;
// owned and used by the CUDA backend's thread.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_context.h"
#include "kernels/cuda/cuda_linear.h"

namespace exl::cuda {

class Handoff {
 public:
  explicit Handoff(CudaContext& ctx);

  // What a reader op gets from the previous op: pointers to read instead of its own (x and x_up
  // in act-order, permuted norm weights) and the launch's reader-side hand-off fields.
  struct In {
    bool ok = false;
    const float* x = nullptr;
    const float* up = nullptr;
    const float* norm_w = nullptr;
    Exl2GemvHandoff io;
  };
  // What a producer op writes besides its outputs (null inv_perm: nothing).
  struct Out {
    const int32_t* inv_perm = nullptr;
    float* x = nullptr;
    float* up = nullptr;
    double* ssq = nullptr;
  };

  // Start of a step: pairs learned during the last step take effect (norm weights permuted for
  // them, which allocates and waits for the device); no op's output is pending. Permuted norm
  // weights are keyed by the source's device address, so after any device buffer was freed they
  // are all dropped and made again from the weights then at those addresses.
  void begin_step();
  // Reader: `set` reads x (and x_up) at `rows`, normalized with norm_w when non-null. Consumes
  // the previous op's output.
  In read(std::span<const CudaLinear* const> set, const float* x, const float* up, const float* norm_w,
          int64_t rows);
  // Which op produces: a linear set (its first matrix, layer −1) or a KV pool's attention layer.
  using Key = std::pair<const void*, int>;
  // Producer: op `key` writes x (and up) of n values per row; `able`: it can write the copies (an
  // EXL2 gemv or decode attention).
  Out produce(Key key, const float* x, const float* up, int64_t n, int64_t rows, bool able);
  // Any other op: nothing is handed on.
  void other() { last_ = {}; }
  // Staged hand-off: op `key` (null: none to learn) staged x at `rows` (rms_norm(x) ⊙ norm_w with
  // norm_w) for the tensor-core set `reader` in the mma scratch (Scratch::mma_staged), which it
  // made at least `bytes` large; nothing else pending. Producers: decode attention for the o
  // projection, cuda::run_layer_output_staged's next for the next layer's q/k/v.
  void produce_staged(Key key, const float* x, const float* norm_w, std::span<const void* const> reader, int64_t rows,
                      size_t bytes);
  // Whether the previous op staged exactly that for this reader in a scratch of at least `need`
  // bytes (so that the reader's own scratch call keeps it); consumes the previous op's output.
  bool read_staged(const float* x, const float* norm_w, std::span<const void* const> reader, int64_t rows,
                   size_t need);
  // The key of the previous op if it wrote x at `rows` (a producer of either kind), else nulls;
  // consumes nothing.
  Key producer_of(const float* x, int64_t rows) const;
  // Reader ops so far that read a hand-off, staged ones included (ops recorded for a step graph
  // included).
  int64_t reads() const { return reads_; }

 private:
  // A learned reader. It holds its permutation's host and device copies, so that a key reused
  // by a later object never leads a producer to a freed inverse permutation (a stale pair only
  // makes the reader fall back and learn again).
  struct Reader {
    HandoffPerm perm;
    int64_t n = 0;
    bool ssq = false;
  };
  struct NormPerm {
    Buffer w;
    std::shared_ptr<const Buffer> inv;  // keeps the key's inverse permutation from being reused
  };
  struct Last {
    Key key{nullptr, 0};
    const float* x = nullptr;
    const float* up = nullptr;
    int64_t n = 0, rows = 0;
    Out out;
    Scratch area_x{}, area_up{};
    bool staged = false;  // a staged hand-off (produce_staged), with x, rows
    const float* staged_norm_w = nullptr;
    const void* staged_reader[k_exl2_gemv_max_jobs] = {};
    size_t staged_bytes = 0;
  };

  CudaContext& ctx_;
  bool enabled_ = true;
  std::map<Key, Reader> readers_, learned_;
  std::map<std::pair<const float*, const int32_t*>, NormPerm> norm_perm_;
  std::vector<std::pair<const float*, Reader>> norms_wanted_;
  Last last_;
  uint64_t frees_seen_ = 0;  // CudaContext::frees() when norm_perm_ was last known current
  uint32_t reading_ = 0;  // scratch areas the current op reads (bit per area)
  int64_t reads_ = 0;
};

}  // namespace exl::cuda
