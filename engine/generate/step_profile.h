// Where a Generator's stepping thread spends its wall-clock time, by phase (admission, drafting,
// forward passes by kind, host sampling, device sampling, ...), for comparisons such as
// speculation against none. Off unless EXL_GEN_PROFILE=1 is set when the Generator is made; then
// the totals go to stderr when it is destroyed, one line per phase: calls, seconds, µs per call.
//
// Not thread-safe: the stepping thread only.
#pragma once
#include <chrono>
#include <string_view>
#include <vector>

namespace exl {

class StepProfile {
 public:
  StepProfile();
  ~StepProfile();
  StepProfile(const StepProfile&) = delete;
  StepProfile& operator=(const StepProfile&) = delete;

  bool enabled() const { return enabled_; }
  // Adds `seconds` to the phase `name` (a string literal: it is kept by pointer).
  void add(const char* name, double seconds);

  // Times a scope into phase `name` when the profile is on.
  class Scope {
   public:
    Scope(StepProfile& p, const char* name) : p_(p.enabled_ ? &p : nullptr), name_(name) {
      if (p_) t0_ = std::chrono::steady_clock::now();
    }
    ~Scope() {
      if (p_) p_->add(name_, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
    }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    StepProfile* p_;
    const char* name_;
    std::chrono::steady_clock::time_point t0_;
  };

 private:
  struct Phase {
    const char* name;
    long long calls = 0;
    double seconds = 0;
  };
  bool enabled_ = false;
  std::vector<Phase> phases_;  // in order of first use
};

}  // namespace exl
