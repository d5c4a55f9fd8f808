// Test-only: what the generation tests (generator_test, grammar_constraint_test) share: a model
// directory loaded on a 2-thread CPU backend, and the record of one job's events.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/formats/model_dir.h"
#include "engine/generate/generator.h"
#include "engine/model.h"

namespace exl::test {

struct CpuModel {
  ModelDir dir;
  std::unique_ptr<Backend> be;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Model> model;
  explicit CpuModel(const std::filesystem::path& p)
      : dir(p), be(make_cpu_backend(2)), tok(load_tokenizer(p)), model(std::make_unique<Model>(dir, *be)) {}
};

// One job's events: its tokens (the ids >= 0 of its token events), text, and how it finished.
// `reason` is error until the done event arrives.
struct GenerationRecord {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason reason = FinishReason::error;
  std::string error;
  GenerationStats stats;
  int token_events = 0;
  bool done = false;
};

// A GenerationJob::on_event that fills `*r`, which must outlive the job.
inline std::function<void(const GenerationEvent&)> record_events(GenerationRecord* r) {
  return [r](const GenerationEvent& e) {
    if (e.type == GenerationEvent::Type::token) {
      if (e.token >= 0) r->tokens.push_back(e.token);
      r->text += e.text;
      ++r->token_events;
    } else {
      r->reason = e.reason;
      r->error = e.error;
      r->stats = e.stats;
      r->done = true;
    }
  };
}

}  // namespace exl::test
