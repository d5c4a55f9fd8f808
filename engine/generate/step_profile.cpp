#include "engine/generate/step_profile.h"

#include <cstdio>
#include <cstring>

#include "kernels/env_switch.h"

namespace exl {

StepProfile::StepProfile() {
  enabled_ = env_is("EXL_GEN_PROFILE", "1");
}

StepProfile::~StepProfile() {
  if (!enabled_ || phases_.empty()) return;
  std::fprintf(stderr, "generator profile (EXL_GEN_PROFILE):\n");
  for (const Phase& p : phases_)
    std::fprintf(stderr, "  %-28s %8lld calls %9.4f s %9.1f us/call\n", p.name, p.calls, p.seconds,
                 p.calls > 0 ? p.seconds * 1e6 / double(p.calls) : 0.0);
}

void StepProfile::add(const char* name, double seconds) {
  for (Phase& p : phases_)
    if (p.name == name || std::strcmp(p.name, name) == 0) {
      ++p.calls;
      p.seconds += seconds;
      return;
    }
  phases_.push_back({name, 1, seconds});
}

}  // namespace exl
