// Server metrics in Prometheus text format (exposition 0.0.4), names prefixed "exlagent:" after
// vLLM's families: requests by endpoint and status, prompt / generated / prefix-cache-hit tokens,
// time-to-first-token, inter-token latency and request preparation histograms, speculative decoding (decode passes,
// drafted and accepted tokens: tokens per pass = generated / passes), running generations (queue depth) and
// open connections. Any thread: counters are atomics, histograms take a mutex.
#pragma once
#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "engine/generate/generator.h"

namespace exl {

class Metrics {
 public:
  void count_request(std::string_view endpoint, int status);
  void observe_generation(const GenerationStats& stats);
  // A generation request's time from its last byte read to its job's submission (parsing, chat
  // template, tokenization, grammar compilation): with time_to_first_token, a request's time to
  // its first token in the server.
  void observe_preparation(double seconds);

  std::atomic<int64_t> open_connections{0};

  // gauges passed in by the caller: generations admitted and not finished.
  std::string render(int64_t running_generations) const;

 private:
  struct Histogram {
    static constexpr std::array<double, 12> bounds = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                      0.25,  0.5,   1,    2.5,   5,    10};
    std::array<uint64_t, bounds.size()> buckets{};
    uint64_t count = 0;
    double sum = 0;
    void observe(double v, uint64_t n = 1);
    void render(std::string& out, const char* name, const char* help) const;
  };
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;  // guarded by mu_
  Histogram ttft_, itl_, prep_;                               // guarded by mu_
  std::atomic<uint64_t> prompt_tokens_{0}, generated_tokens_{0}, cached_tokens_{0};
  std::atomic<uint64_t> decode_passes_{0}, drafted_tokens_{0}, accepted_tokens_{0};
};

}  // namespace exl
