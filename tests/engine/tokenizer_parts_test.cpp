// The tokenizer building blocks on small hand-made inputs whose right answers are worked out by
// hand from the Hugging Face semantics: BPE merge order, byte fallback, unknown fusing,
// ignore_merges, added-token options, the translated pre-tokenizer regex, lossy UTF-8, and the
// special-id rules.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/added_tokens.h"
#include "engine/tokenizer/bpe_model.h"
#include "engine/tokenizer/byte_level.h"
#include "engine/tokenizer/split_regex.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "kernels/error.h"
#include "test_support.h"

namespace exl {
namespace tokenizer_parts_test {

using nlohmann::json;

json tiny_model(json merges, json extra = json::object()) {
  json m = {{"type", "BPE"},
            {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"c", 3}, {"ab", 4}, {"bc", 5}, {"aa", 6}, {"abc", 7},
                       {"<0xC3>", 8}, {"<0xA9>", 9}, {"x", 10}}},
            {"merges", std::move(merges)}};
  m.update(extra);
  return m;
}

std::vector<int32_t> enc(const BpeModel& m, std::string_view w, bool byte_level = false) {
  std::vector<int32_t> out;
  m.encode_word(w, byte_level, out);
  return out;
}

TEST(TokenizerBpe, LowestRankMergesFirstNotLeftmost) {
  BpeModel m(tiny_model({"b c", "a b"}), "test");
  EXPECT_EQ(enc(m, "abc"), (std::vector<int32_t>{1, 5}));  // a + bc, although "a b" is leftmost
  BpeModel m2(tiny_model({"a b", "b c"}), "test");
  EXPECT_EQ(enc(m2, "abc"), (std::vector<int32_t>{4, 3}));
}

TEST(TokenizerBpe, EqualRanksMergeLeftmostFirst) {
  BpeModel m(tiny_model(json::array({json::array({"a", "a"})})), "test");  // pair form, as in Qwen's file
  EXPECT_EQ(enc(m, "aaa"), (std::vector<int32_t>{6, 1}));
  EXPECT_EQ(enc(m, "aaaa"), (std::vector<int32_t>{6, 6}));
}

TEST(TokenizerBpe, ByteFallbackAndUnknown) {
  BpeModel fb(tiny_model({"a b"}, {{"byte_fallback", true}, {"unk_token", "<unk>"}}), "test");
  EXPECT_EQ(enc(fb, "\xC3\xA9" "ab"), (std::vector<int32_t>{8, 9, 4}));  // é -> <0xC3><0xA9>
  EXPECT_EQ(enc(fb, "\xE2\x82\xAC" "a"), (std::vector<int32_t>{0, 1}));   // € lacks byte tokens -> <unk>
  BpeModel fused(tiny_model(json::array(), {{"unk_token", "<unk>"}, {"fuse_unk", true}}), "test");
  EXPECT_EQ(enc(fused, "zzxzz"), (std::vector<int32_t>{0, 10, 0}));
  BpeModel unfused(tiny_model(json::array(), {{"unk_token", "<unk>"}}), "test");
  EXPECT_EQ(enc(unfused, "zzx"), (std::vector<int32_t>{0, 0, 10}));
}

TEST(TokenizerBpe, IgnoreMergesTakesWholeWords) {
  BpeModel plain(tiny_model({"a b"}), "test");
  EXPECT_EQ(enc(plain, "abc"), (std::vector<int32_t>{4, 3}));
  BpeModel ignoring(tiny_model({"a b"}, {{"ignore_merges", true}}), "test");
  EXPECT_EQ(enc(ignoring, "abc"), (std::vector<int32_t>{7}));
  EXPECT_EQ(enc(ignoring, "abcabc"), (std::vector<int32_t>{4, 3, 4, 3}));  // the cache must not mix words
}

TEST(TokenizerBpe, ByteLevelAlphabet) {
  EXPECT_EQ(byte_level::char_of(' '), "\xC4\xA0");  // Ġ
  EXPECT_EQ(byte_level::char_of('\n'), "\xC4\x8A");  // Ċ
  EXPECT_EQ(byte_level::char_of('a'), "a");
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(byte_level::decode(byte_level::encode(all)), all);
  EXPECT_EQ(byte_level::decode("<|x|>\xE2\x96\x81"), "<|x|>\xE2\x96\x81");  // outside the alphabet: unchanged
}

TEST(TokenizerBpe, BadMergesAreErrors) {
  EXPECT_THROW(BpeModel(tiny_model({"a q"}), "t.json"), Error);
  EXPECT_THROW(BpeModel(tiny_model({"a b c"}), "t.json"), Error);
  EXPECT_THROW(BpeModel(tiny_model(json::array(), {{"type", "Unigram"}}), "t.json"), Error);
  EXPECT_THROW(BpeModel(tiny_model(json::array(), {{"unk_token", "<nope>"}}), "t.json"), Error);
}

std::vector<std::string> split(const SplitRegex& re, std::string_view text) {
  std::vector<std::string_view> pieces;
  re.split(text, pieces);
  return {pieces.begin(), pieces.end()};
}

constexpr const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

TEST(TokenizerSplitRegex, WhitespaceLookaheadSemantics) {
  SplitRegex re(kLlama3Regex);
  using V = std::vector<std::string>;
  // A run before a word gives its last space to the word; a single space is taken whole.
  EXPECT_EQ(split(re, "Hello   world  "), (V{"Hello", "  ", " world", "  "}));
  EXPECT_EQ(split(re, "a b"), (V{"a", " b"}));
  EXPECT_EQ(split(re, "a \t!"), (V{"a", " ", "\t", "!"}));  // "\t" is whitespace: " ?[^\s...]+" cannot take it with "!"
  EXPECT_EQ(split(re, "x \n\n y"), (V{"x", " \n\n", " y"}));
  EXPECT_EQ(split(re, "I'VE 12345"), (V{"I", "'VE", " ", "123", "45"}));
  // Unicode whitespace is \s for Oniguruma (and here), not a symbol: U+3000 behaves like a space.
  EXPECT_EQ(split(re, "a\u3000\u3000b"), (V{"a", "\u3000", "\u3000b"}));
  EXPECT_EQ(split(re, "a\u00a0\u00a0"), (V{"a", "\u00a0\u00a0"}));
}

TEST(TokenizerSplitRegex, GapsAreKeptAndUnsupportedSyntaxRejected) {
  SplitRegex digits("\\d+");
  EXPECT_EQ(split(digits, "ab12cd3"), (std::vector<std::string>{"ab", "12", "cd", "3"}));
  EXPECT_THROW(SplitRegex("(?<=a)b"), Error);
  EXPECT_THROW(SplitRegex("a(?=b)"), Error);
  EXPECT_THROW(SplitRegex("[a"), Error);
}

TEST(TokenizerAddedTokens, LongestLeftmostAndOptions) {
  AddedTokenSplitter sp({{10, "<a>", true}, {11, "<a><b>", true}, {12, "<t>", false},
                         {13, "[L]", true, /*lstrip=*/true}, {14, "[R]", true, false, /*rstrip=*/true},
                         {15, "word", false, false, false, /*single_word=*/true}});
  auto ids = [&](std::string_view text, bool special) {
    std::vector<std::pair<std::string, int32_t>> out;
    for (const auto& p : sp.split(text, special)) out.emplace_back(std::string(p.text), p.id);
    return out;
  };
  using V = std::vector<std::pair<std::string, int32_t>>;
  EXPECT_EQ(ids("x<a><b>y<a>", true), (V{{"x", -1}, {"<a><b>", 11}, {"y", -1}, {"<a>", 10}}));
  EXPECT_EQ(ids("x<a><t>", false), (V{{"x<a>", -1}, {"<t>", 12}}));
  EXPECT_EQ(ids("p  [L]  q", true), (V{{"p", -1}, {"  [L]", 13}, {"  q", -1}}));
  EXPECT_EQ(ids("p  [R]  q", true), (V{{"p  ", -1}, {"[R]  ", 14}, {"q", -1}}));
  EXPECT_EQ(ids("swordfish word.", false), (V{{"swordfish ", -1}, {"word", 15}, {".", -1}}));
}

// Issue #28: special tokens count only inside the ranges the caller marks as markup; their text
// elsewhere stays text, and non-special tokens are found everywhere, even inside such text.
TEST(TokenizerAddedTokens, SpecialTokensOnlyInsideMarkupRanges) {
  AddedTokenSplitter sp({{10, "<a>", true}, {11, "<a><b>", true}, {12, "<t>", false}, {13, "<t><u>", true},
                         {14, "[R]", true, false, /*rstrip=*/true}});
  using V = std::vector<std::pair<std::string, int32_t>>;
  auto ids = [&](std::string_view text, std::vector<TextRange> ranges) {
    V out;
    for (const auto& p : sp.split(text, ranges)) out.emplace_back(std::string(p.text), p.id);
    return out;
  };
  //                  0123456789012345
  const char* text = "<a>x<a>y<a><b>z";
  EXPECT_EQ(ids(text, {}), (V{{text, -1}}));
  EXPECT_EQ(ids(text, {{0, 15}}), (V{{"<a>", 10}, {"x", -1}, {"<a>", 10}, {"y", -1}, {"<a><b>", 11}, {"z", -1}}));
  EXPECT_EQ(ids(text, {{0, 3}, {8, 14}}), (V{{"<a>", 10}, {"x<a>y", -1}, {"<a><b>", 11}, {"z", -1}}));
  // A match must lie wholly inside one range: overlapping its end or spanning two ranges is text,
  // and the shorter token inside the rejected one is still found where it is markup.
  EXPECT_EQ(ids(text, {{8, 13}}), (V{{"<a>x<a>y", -1}, {"<a>", 10}, {"<b>z", -1}}));
  EXPECT_EQ(ids(text, {{8, 11}, {11, 14}}), (V{{"<a>x<a>y", -1}, {"<a>", 10}, {"<b>z", -1}}));
  EXPECT_EQ(ids(text, {{9, 15}}), (V{{text, -1}}));
  // Non-special tokens are recognised in content, also where a rejected special one starts.
  EXPECT_EQ(ids("q<t><u>r<t>", {}), (V{{"q", -1}, {"<t>", 12}, {"<u>r", -1}, {"<t>", 12}}));
  // Options of an accepted token still apply; a rejected one's are not.
  EXPECT_EQ(ids("[R]  s[R]  t", {{6, 9}}), (V{{"[R]  s", -1}, {"[R]  ", 14}, {"t", -1}}));
}

TEST(TokenizerUtf8, LossyConversionByMaximalSubparts) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(utf8::lossy("a\xC3\xA9z"), "a\xC3\xA9z");
  EXPECT_EQ(utf8::lossy("\xF0\x9F\x98"), fffd);                 // truncated 4-byte: one
  EXPECT_EQ(utf8::lossy("\xE0\x80"), fffd + fffd);              // E0 needs A0..BF next
  EXPECT_EQ(utf8::lossy("\xED\xA0\x80"), fffd + fffd + fffd);   // surrogate
  EXPECT_EQ(utf8::lossy("\xC0\xAF!"), fffd + fffd + "!");
  EXPECT_EQ(utf8::lossy("\xF0\x9F\x98" "a"), fffd + "a");
  std::string out;
  EXPECT_EQ(utf8::append_lossy(out, "ok\xF0\x9F\x98", false), 2u);  // holds the incomplete tail
  EXPECT_EQ(out, "ok");
  EXPECT_EQ(utf8::append_lossy(out, "\xF0\x9F\x98\x81", false), 4u);
  EXPECT_EQ(out, "ok\xF0\x9F\x98\x81");
}

// Special ids from a directory's JSON files, on a minimal tokenizer.json.
class TokenizerSpecialRules : public ::testing::Test {
 protected:
  std::filesystem::path dir_ = test::temp_dir("tokenizer_special_rules");
  void write(const char* name, const json& j) { test::write_file(dir_ / name, j.dump()); }
  void SetUp() override {
    write("tokenizer.json",
          {{"model", tiny_model({"a b"})},
           {"added_tokens", {{{"id", 11}, {"content", "<s>"}, {"special", true}},
                             {{"id", 12}, {"content", "</s>"}, {"special", true}},
                             {{"id", 13}, {"content", "<|im_end|>"}, {"special", true}},
                             {{"id", 14}, {"content", "<pad>"}, {"special", true}}}},
           {"post_processor", {{"type", "TemplateProcessing"},
                               {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}}}}});
  }
};

TEST_F(TokenizerSpecialRules, TemplateAndEndOfTurn) {
  auto tok = load_tokenizer(dir_);
  EXPECT_EQ(tok->bos_id(), 11);
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->eos_ids(), (std::set<int32_t>{13}));
  EXPECT_EQ(tok->encode("ab", true), (std::vector<int32_t>{11, 4}));
  EXPECT_EQ(tok->encode("ab<s>", false), (std::vector<int32_t>{4}));  // "<s>" chars are not in this vocab
}

TEST_F(TokenizerSpecialRules, ConfigFilesOverride) {
  write("tokenizer_config.json", {{"bos_token", {{"content", "</s>"}, {"lstrip", false}}},
                                   {"eos_token", "</s>"}, {"pad_token", "<pad>"}, {"add_bos_token", false}});
  write("generation_config.json", {{"eos_token_id", {12, 3}}});
  write("config.json", {{"bos_token_id", 1}, {"eos_token_id", 1}});
  auto tok = load_tokenizer(dir_);
  EXPECT_EQ(tok->bos_id(), 12);
  EXPECT_EQ(tok->eos_ids(), (std::set<int32_t>{1, 3, 12, 13}));
  EXPECT_EQ(tok->pad_id(), 14);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->encode("ab", true), (std::vector<int32_t>{4}));
}

TEST_F(TokenizerSpecialRules, NullBosMeansNone) {
  write("tokenizer_config.json", {{"bos_token", nullptr}});
  write("config.json", {{"bos_token_id", 11}});
  auto tok = load_tokenizer(dir_);
  EXPECT_FALSE(tok->bos_id().has_value());
  EXPECT_FALSE(tok->add_bos());
}

TEST_F(TokenizerSpecialRules, ConfigIdsWithoutTokenizerConfig) {
  write("config.json", {{"bos_token_id", 12}, {"eos_token_id", {11, 99999}}, {"pad_token_id", 14}});
  auto tok = load_tokenizer(dir_);
  EXPECT_EQ(tok->bos_id(), 12);
  EXPECT_EQ(tok->eos_ids(), (std::set<int32_t>{11, 13}));  // out-of-range ids are ignored
  EXPECT_EQ(tok->pad_id(), 14);
}

}  // namespace tokenizer_parts_test
}  // namespace exl
