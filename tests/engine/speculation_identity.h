// Greedy decoding with and without prompt lookup, token for token, on the committed demo model
// (trained; with and without a JSON-like grammar), stories260K and the exl2-ref models (random
// weights, EXL2 from ExLlamaV2's converter; both with and without a regex grammar), on the backend
// that `make_backend` returns (the CPU's in speculation_test.cpp, CUDA's in model_cuda_test.cpp).
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/generate/generator.h"
#include "engine/generate/grammar_constraint.h"
#include "engine/generate/speculation.h"
#include "engine/model.h"
#include "engine/tokenizer/tokenizer.h"
#include "test_support.h"

namespace exl::test {

// Greedy tokens of one job of `prompt` on `g` (which runs it to the end), with its stats; `mask`:
// the job's grammar, if any.
inline std::vector<int32_t> greedy_job(Generator& g, const Tokenizer& tok, const std::string& prompt, Speculation sp,
                                       GenerationStats* stats, int max_new_tokens = 200,
                                       std::shared_ptr<LogitsMaskHook> mask = nullptr) {
  std::vector<int32_t> out;
  GenerationJob j;
  j.prompt = tok.encode(prompt, true);
  j.sampling.temperature = 0;
  j.max_new_tokens = max_new_tokens;
  j.speculate = sp;
  j.mask = std::move(mask);
  j.on_event = [&](const GenerationEvent& e) {
    if (e.type == GenerationEvent::Type::token) out.push_back(e.token);
    else *stats = e.stats;
  };
  g.submit(std::move(j));
  g.run_until_idle();
  return out;
}

inline void expect_speculation_keeps_greedy_tokens(const std::function<std::unique_ptr<Backend>()>& make_backend) {
  if (!std::filesystem::exists(shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw/output.safetensors"))
    GTEST_SKIP() << "../shared/data/exl2-ref is absent";
  const std::filesystem::path demo = source_dir() / "examples/demo-model/model";
  if (!std::filesystem::exists(demo / "config.json")) GTEST_SKIP() << "examples/demo-model/model is absent";
  const std::string story =
      "Once upon a time, there was a little girl named Lily. She loved to play in the park. "
      "One day, Lily went to the park with her mom. Once upon a time, there was a little";
  const std::string document =
      "Invoice 4471 from Harbor Supply Co., dated 2024-03-18, total 1,250.00 USD, due 2024-04-17. "
      "Contact: Maria Chen, maria.chen@harbor.example. Invoice 4471 from Harbor Supply Co., dated";
  struct Case {
    std::filesystem::path dir;
    const std::string* prompt;
    const char* pattern;
  };
  const std::filesystem::path ref = shared_dir() / "data/exl2-ref";
  const std::vector<Case> cases = {
      {demo, &document, "\\{\"vendor\": \"[A-Za-z .,]{1,40}\", \"total\": [0-9]{1,6}\\.[0-9]{2}\\}"},
      {shared_dir() / "models/stories260K-hf", &story,
       "( there was a (little|big) (girl|boy|dog) named [A-Z][a-z]{2,8}\\.){2}"},
      {ref / "llama-gqa/exl2-4.0bpw", &story, "( there was a (little|big) (girl|boy|dog) named [A-Z][a-z]{2,8}\\.){2}"},
      {ref / "qwen2-bias/exl2-4.0bpw", &story, "( there was a (little|big) (girl|boy|dog) named [A-Z][a-z]{2,8}\\.){2}"},
      {ref / "llama3-rope/exl2-4.0bpw", &story, "( there was a (little|big) (girl|boy|dog) named [A-Z][a-z]{2,8}\\.){2}"}};
  int64_t accepted = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.dir.string());
    ModelDir dir(c.dir);
    auto tok = load_tokenizer(dir.path());
    auto be = make_backend();
    Model model(dir, *be);
    GeneratorOptions o;
    o.cache_format = KvFormat::fp16;
    Generator g(model, *tok, o);
    for (bool grammar : {false, true}) {
      auto run = [&](Speculation sp, GenerationStats* stats) {
        return greedy_job(g, *tok, *c.prompt, sp, stats, 96,
                          grammar ? make_grammar_constraint(compile_regex_for(c.pattern, *tok), *tok) : nullptr);
      };
      GenerationStats plain_stats, spec_stats;
      const auto plain = run(Speculation::none, &plain_stats);
      const auto spec = run(Speculation::ngram, &spec_stats);
      EXPECT_EQ(spec, plain) << "grammar " << grammar;
      EXPECT_FALSE(plain.empty());
      EXPECT_GT(spec_stats.n_drafted, 0) << "grammar " << grammar;
      accepted += spec_stats.n_accepted;
    }
  }
  EXPECT_GT(accepted, 0);
}

}  // namespace exl::test
