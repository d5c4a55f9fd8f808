#include <algorithm>
#include <vector>

#include "kernels/communicator.h"
#include "kernels/error.h"

namespace exl {

namespace {

class HostCommunicator final : public Communicator {
 public:
  explicit HostCommunicator(std::span<Backend* const> ranks) : ranks_(ranks.begin(), ranks.end()) {
    EXL_CHECK(!ranks_.empty(), "kernels: communicator: no ranks");
    for (Backend* b : ranks_) EXL_CHECK(b != nullptr, "kernels: communicator: a rank without a backend");
  }
  int n_ranks() const override { return int(ranks_.size()); }

  void all_reduce_sum(std::span<float* const> bufs, int64_t n) override {
    check_reduce_args("kernels: communicator", bufs.size(), ranks_.size());
    const size_t bytes = size_t(n) * sizeof(float);
    sum_.assign(size_t(n), 0.0f);
    part_.resize(size_t(n));
    for (size_t r = 0; r < ranks_.size(); ++r) {
      ranks_[r]->make_current();
      ranks_[r]->download(part_.data(), bufs[r], bytes);
      for (size_t i = 0; i < size_t(n); ++i) sum_[i] += part_[i];
    }
    for (size_t r = 0; r < ranks_.size(); ++r) {
      ranks_[r]->make_current();
      ranks_[r]->upload(bufs[r], sum_.data(), bytes);
    }
  }

  void all_gather_columns(std::span<const float* const> in, std::span<float* const> out, int64_t rows,
                          std::span<const int64_t> widths) override {
    const int64_t total = check_gather_args("kernels: communicator", in.size(), out.size(), widths, ranks_.size());
    sum_.resize(size_t(rows * total));
    int64_t offset = 0;
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const int64_t w = widths[r];
      part_.resize(size_t(rows * w));
      ranks_[r]->make_current();
      ranks_[r]->download(part_.data(), in[r], part_.size() * sizeof(float));
      for (int64_t t = 0; t < rows; ++t)
        std::copy(part_.begin() + t * w, part_.begin() + (t + 1) * w, sum_.begin() + t * total + offset);
      offset += w;
    }
    for (size_t r = 0; r < ranks_.size(); ++r) {
      ranks_[r]->make_current();
      ranks_[r]->upload(out[r], sum_.data(), sum_.size() * sizeof(float));
    }
  }

 private:
  std::vector<Backend*> ranks_;
  std::vector<float> sum_, part_;
};

}  // namespace

std::unique_ptr<Communicator> make_host_communicator(std::span<Backend* const> ranks) {
  return std::make_unique<HostCommunicator>(ranks);
}

#ifndef EXL_HAVE_NCCL
bool nccl_available() { return false; }

std::unique_ptr<Communicator> make_nccl_communicator(std::span<Backend* const>, std::span<const int>) {
  fail("kernels: nccl: this build has no NCCL (configure with CUDA and NCCL present)");
}
#endif

}  // namespace exl
