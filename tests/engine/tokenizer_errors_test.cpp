// Bad tokenizer directories and files give an exl::Error that names the problem, never a crash.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"
#include "kernels/error.h"
#include "test_support.h"

namespace exl {
namespace tokenizer_errors_test {

using nlohmann::json;

// Loads `dir` expecting an exl::Error whose message contains every one of `parts`.
void expect_load_error(const std::filesystem::path& dir, std::initializer_list<std::string> parts) {
  try {
    load_tokenizer(dir);
    ADD_FAILURE() << "loading '" << dir.string() << "' did not fail";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_TRUE(msg.starts_with("engine: ")) << msg;
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

json minimal_json() {
  return {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}}};
}

std::filesystem::path dir_with_json(const std::string& name, const std::string& content) {
  auto d = test::temp_dir(name);
  test::write_file(d / "tokenizer.json", content);
  return d;
}

TEST(TokenizerErrors, MissingDirectory) {
  expect_load_error(test::binary_dir() / "test-tmp" / "no-such-dir", {"no-such-dir", "not a directory"});
}

TEST(TokenizerErrors, NoTokenizerFiles) {
  auto d = test::temp_dir("tok_err_empty");
  test::write_file(d / "config.json", "{}");
  expect_load_error(d, {"tok_err_empty", "neither tokenizer.json nor tokenizer.model"});
}

TEST(TokenizerErrors, TruncatedJson) {
  std::string full = minimal_json().dump();
  expect_load_error(dir_with_json("tok_err_trunc", full.substr(0, full.size() / 2)), {"tokenizer.json", "not valid JSON"});
}

TEST(TokenizerErrors, WrongStructure) {
  expect_load_error(dir_with_json("tok_err_nomodel", "[1,2]"), {"tokenizer.json", "no 'model'"});
  json j = minimal_json();
  j["model"]["vocab"] = {{"a", "zero"}};
  expect_load_error(dir_with_json("tok_err_vocabtype", j.dump()), {"tokenizer.json", "unexpected structure"});
  j = minimal_json();
  j["model"].erase("merges");
  expect_load_error(dir_with_json("tok_err_nomerges", j.dump()), {"tokenizer.json", "merges"});
  j = minimal_json();
  j["model"]["vocab"]["b"] = -4;
  expect_load_error(dir_with_json("tok_err_negid", j.dump()), {"tokenizer.json", "'b'", "out of range"});
  j = minimal_json();
  j["added_tokens"] = {{{"id", -1}, {"content", "<x>"}}};
  expect_load_error(dir_with_json("tok_err_addedid", j.dump()), {"tokenizer.json", "added token id -1"});
}

// Found by fuzz_tokenizer_json: a float id was converted to int64 (1.5e92: undefined behaviour;
// 2.5: silently read as 2).
TEST(TokenizerErrors, FloatIds) {
  for (double id : {2.5, 1.5e92, -1e300}) {
    json j = minimal_json();
    j["model"]["vocab"]["ab"] = id;
    expect_load_error(dir_with_json("tok_err_floatid", j.dump()), {"tokenizer.json", "'ab'", "not an integer"});
    j = minimal_json();
    j["added_tokens"] = {{{"id", id}, {"content", "<x>"}}};
    expect_load_error(dir_with_json("tok_err_floataddedid", j.dump()), {"tokenizer.json", "added token id", "not an integer"});
  }
}

TEST(TokenizerErrors, MergeWithUnknownToken) {
  json j = minimal_json();
  j["model"]["merges"] = {"a c"};
  expect_load_error(dir_with_json("tok_err_merge", j.dump()), {"tokenizer.json", "merge 0", "missing from the vocabulary"});
}

TEST(TokenizerErrors, UnsupportedComponents) {
  json j = minimal_json();
  j["model"]["type"] = "Unigram";
  expect_load_error(dir_with_json("tok_err_unigram", j.dump()), {"model type 'Unigram'"});
  j = minimal_json();
  j["normalizer"] = {{"type", "NFKD"}};
  expect_load_error(dir_with_json("tok_err_norm", j.dump()), {"normalizer type 'NFKD'"});
  j = minimal_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_load_error(dir_with_json("tok_err_pre", j.dump()), {"pre_tokenizer type 'Whitespace'"});
  j = minimal_json();
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(?<=x)y"}}}, {"behavior", "Isolated"}};
  expect_load_error(dir_with_json("tok_err_lookbehind", j.dump()), {"(?<=x)y", "look-around"});
  j = minimal_json();
  j["decoder"] = {{"type", "WordPiece"}};
  expect_load_error(dir_with_json("tok_err_dec", j.dump()), {"decoder type 'WordPiece'"});
}

TEST(TokenizerErrors, CorruptSentencePieceModel) {
  auto d = test::temp_dir("tok_err_spm");
  test::write_file(d / "tokenizer.model", std::string("\x0a\x05garbage-not-a-model\xff\xff", 22));
  expect_load_error(d, {"tokenizer.model", "cannot load SentencePiece model"});
}

// Found by fuzz_sentencepiece: a well-formed proto whose piece starts with a NUL byte made
// SentencePiece's trie builder throw Darts::Details::Exception out of Load.
TEST(TokenizerErrors, SentencePieceModelThatThrowsWhileLoading) {
  auto d = test::temp_dir("tok_err_spm_darts");
  test::write_file(d / "tokenizer.model",
                   std::string("\x0a\x0e\x0a\x05<unk>\x15\x00\x00\x00\x00\x18\x02\x0a\x0c\x0a\x03\x00J>\x15\x00\x00"
                               "\x00\x00\x18\x03\x0a\x0d\x0a\x04\xc0\x30s>\x15\x00\x00\x00\x00\x18\x01\x15\x00\x00\x00"
                               "\x00\x18\x03\x0a\x14\x0a\x0b\x00\x00\x00\x00\x00\x00\x00Jll>\x15\x00\x00\x00\x00\x18\x04",
                               74));
  expect_load_error(d, {"tokenizer.model", "cannot load SentencePiece model", "zero-length key"});
}

TEST(TokenizerErrors, BadConfigFiles) {
  auto d = dir_with_json("tok_err_cfg", minimal_json().dump());
  test::write_file(d / "tokenizer_config.json", "{\"bos_token\": ");
  expect_load_error(d, {"tokenizer_config.json", "not valid JSON"});
  test::write_file(d / "tokenizer_config.json", "[]");
  expect_load_error(d, {"tokenizer_config.json", "not a JSON object"});
}

TEST(TokenizerErrors, IdsOutOfRange) {
  auto tok = load_tokenizer(dir_with_json("tok_err_ids", minimal_json().dump()));
  EXPECT_EQ(tok->vocab_size(), 3);
  EXPECT_THROW(tok->token_bytes(3), Error);
  EXPECT_THROW(tok->token_bytes(-1), Error);
  EXPECT_THROW(tok->is_special(7), Error);
  try {
    tok->decode(std::vector<int32_t>{0, 1000});
    ADD_FAILURE() << "decode accepted id 1000";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token id 1000 out of range [0, 3)"), std::string::npos) << e.what();
  }
}

}  // namespace tokenizer_errors_test
}  // namespace exl
