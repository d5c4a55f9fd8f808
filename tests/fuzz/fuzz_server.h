// The ServerState the runtime fuzz targets route against: stories260K-hf from the shared assets
// (CPU, generator never started, so nothing generates), an API key, a small grammar budget and a
// private transcript directory. Built once per process; nullptr when the asset is missing (the
// targets then check only what needs no model).
#pragma once
#include <memory>

#include "fuzz/fuzz_support.h"
#include "runtime/server/server_state.h"

namespace exl::fuzz {

inline ServerState* fuzz_server_state() {
  static std::shared_ptr<ServerState> state = []() -> std::shared_ptr<ServerState> {
    const auto model = shared_dir() / "models/stories260K-hf";
    if (!std::filesystem::exists(model / "model.safetensors")) return nullptr;
    ServerOptions o;
    o.model_dir = model.string();
    o.api_key = "sekret";
    o.max_body_bytes = 64u << 10;
    o.session_dir = (scratch_dir() / "sessions").string();
    o.grammar_budget.max_automaton_states = 20000;
    o.grammar_budget.max_states = 200000;
    o.grammar_budget.max_bytes = size_t(32) << 20;
    o.grammar_budget.timeout = std::chrono::milliseconds(500);
    return std::make_shared<ServerState>(o);
  }();
  return state.get();
}

}  // namespace exl::fuzz
