// Tokenizers against independent references: llama.cpp's conformance vectors (expected ids from
// Hugging Face AutoTokenizer), llama2.c's prompt vectors, Mistral's documented encodings, and
// Python sentencepiece's encodings of the same strings with tok512.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/sentencepiece_tokenizer.h"
#include "tokenizer_test_util.h"

namespace exl {
namespace tokenizer_conformance_test {

using test::shared_tokenizer;

// Encodes every case without special tokens and expects all of them to match.
void expect_vectors(const Tokenizer& tok, const std::vector<test::VocabCase>& cases, size_t n_expected) {
  ASSERT_EQ(cases.size(), n_expected);
  size_t matched = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto got = tok.encode(cases[i].text, false);
    if (got == cases[i].ids)
      ++matched;
    else
      ADD_FAILURE() << "case " << i << " '" << cases[i].text << "'\n  expected" << test::ids_to_string(cases[i].ids)
                    << "\n  got     " << test::ids_to_string(got);
  }
  EXPECT_EQ(matched, n_expected);
}

TEST(TokenizerConformance, LlamaSpmWithLlama2Model) {
  EXL_REQUIRE_SHARED("models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf.out");
  EXL_REQUIRE_SHARED("models/llama2-tokenizer/tokenizer.model");
  expect_vectors(shared_tokenizer("models/llama2-tokenizer"), test::llama_cpp_cases("llama-spm"), 46);
}

TEST(TokenizerConformance, LlamaBpeWithLlama3Json) {
  EXL_REQUIRE_SHARED("models/llama.cpp-vocab/ggml-vocab-llama-bpe.gguf.out");
  EXL_REQUIRE_SHARED("models/llama3-tokenizer/tokenizer.json");
  expect_vectors(shared_tokenizer("models/llama3-tokenizer"), test::llama_cpp_cases("llama-bpe"), 46);
}

TEST(TokenizerConformance, Qwen2WithQwenJson) {
  EXL_REQUIRE_SHARED("models/llama.cpp-vocab/ggml-vocab-qwen2.gguf.out");
  EXL_REQUIRE_SHARED("models/qwen3-tokenizer/tokenizer.json");
  const Tokenizer& tok = shared_tokenizer("models/qwen3-tokenizer");
  expect_vectors(tok, test::llama_cpp_cases("qwen2"), 46);
  expect_vectors(tok, test::llama_cpp_cases("deepseek-r1-qwen"), 46);
}

TEST(TokenizerConformance, Tok512SentencePieceReference) {
  EXL_REQUIRE_SHARED("models/stories260K/reference/tok512.sentencepiece.ggml-vocab-tests.out");
  auto dir = test::shared_dir() / "models";
  SentencePieceTokenizer tok(dir / "stories260K/tok512.model");
  auto cases = test::read_vocab_cases(dir / "llama.cpp-vocab/ggml-vocab-llama-spm.gguf.inp",
                                      dir / "stories260K/reference/tok512.sentencepiece.ggml-vocab-tests.out");
  expect_vectors(tok, cases, 46);
}

TEST(TokenizerConformance, Llama2cPromptVectorsWithBos) {
  EXL_REQUIRE_SHARED("models/llama2-tokenizer/llama2c_test_vectors.json");
  const Tokenizer& tok = shared_tokenizer("models/llama2-tokenizer");
  auto j = nlohmann::json::parse(test::read_file(test::shared_dir() / "models/llama2-tokenizer/llama2c_test_vectors.json"));
  ASSERT_EQ(j["cases"].size(), 5u);
  for (const auto& c : j["cases"]) {
    std::string prompt = c["prompt"];
    EXPECT_EQ(tok.encode(prompt, true), c["expected_ids_with_bos"].get<std::vector<int32_t>>()) << prompt;
  }
}

TEST(TokenizerConformance, MistralDocumentedVectors) {
  EXL_REQUIRE_SHARED("models/mistral-tokenizer/tokenizer.json");
  const Tokenizer& tok = shared_tokenizer("models/mistral-tokenizer");
  EXPECT_EQ(tok.encode("[INST]", false), (std::vector<int32_t>{733, 16289, 28793}));
  EXPECT_EQ(tok.encode("Hello world", true), (std::vector<int32_t>{1, 22557, 1526}));
  EXPECT_EQ(tok.encode("Hello world", false), (std::vector<int32_t>{22557, 1526}));
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_ids(), (std::set<int32_t>{2}));
  EXPECT_TRUE(tok.add_bos());
}

// The same 512-piece vocabulary as tokenizer.model (libsentencepiece) and as tokenizer.json
// (converted by HF tokenizers; our BPE) must agree. The json has no dummy prefix, so it gets the
// "▁" spelled out as a leading space; tok512.model also has remove_extra_whitespaces, so only
// strings that this normalization leaves alone are comparable.
TEST(TokenizerConformance, Exl2RefJsonAndModelAgree) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/hf/tokenizer.json");
  EXL_REQUIRE_SHARED("models/llama.cpp-vocab/ggml-vocab-llama-spm.gguf.inp");
  auto hf = test::shared_dir() / "data/exl2-ref/llama-gqa/hf";
  const Tokenizer& json_tok = shared_tokenizer("data/exl2-ref/llama-gqa/hf");
  SentencePieceTokenizer spm(hf / "tokenizer.model");
  auto untouched_by_spm = [](const std::string& s) {
    return !s.empty() && s.front() != ' ' && s.back() != ' ' && s.find("  ") == std::string::npos;
  };
  size_t compared = 0;
  for (const auto& c : test::llama_cpp_cases("llama-spm")) {
    if (!untouched_by_spm(c.text)) continue;
    ++compared;
    EXPECT_EQ(json_tok.encode(" " + c.text, false), spm.encode(c.text, false)) << c.text;
  }
  EXPECT_EQ(compared, 29u);
}

}  // namespace tokenizer_conformance_test
}  // namespace exl
