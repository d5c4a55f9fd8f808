// PrefixEncodeMemo: a long piece that shares a prefix with a recently encoded one reuses that
// prefix's word ids; the result must equal splitting the whole piece, for texts whose shared
// prefix ends anywhere (inside words, digit runs, whitespace runs, multi-byte characters).
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <random>

#include "engine/tokenizer/bpe_tokenizer.h"
#include "engine/tokenizer/prefix_encode_memo.h"
#include "tokenizer_test_util.h"

namespace exl {
namespace tokenizer_prefix_memo_test {

// Fragments chosen to end words in every way the patterns know: letters, contractions, digit runs
// longer than three, whitespace runs before words and before newlines, symbol runs with newlines,
// non-ASCII letters and spaces.
const std::vector<std::string> kFragments = {
    "the", " quick", " brown", "fox", " don't", "'s", " it'll", " 12345", "678", " 9", "   ", "  \n",
    "\n\n", "\t", " ...", "!?\n", " (x)", " héllo", "日本語", "\u00a0", "\u3000", " 🙂", " end", "A", "Z9",
    "  word", "\r\n", "-", " 42.5%", " über", "x", " ", "''", " ---\n", "\n   ", " ab1", "zz",
    "e\u0301", "A\u030A", "\u0301",  // decomposed: NFC (Qwen3) composes them with what precedes
};

std::string random_text(std::mt19937& rng, size_t bytes) {
  std::uniform_int_distribution<size_t> pick(0, kFragments.size() - 1);
  std::string s;
  while (s.size() < bytes) s += kFragments[pick(rng)];
  return s;
}

// The byte length of the longest prefix of s no longer than n that ends on a character boundary.
size_t char_boundary(const std::string& s, size_t n) {
  while (n > 0 && n < s.size() && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return n;
}

// A tokenizer twice: with the memo, and splitting every piece whole (the reference). Llama 3
// (no normalizer) and Qwen3 (NFC: the memo sees normalized pieces).
class PrefixEncodeMemoOn : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string file = std::string(GetParam()) + "/tokenizer.json";
    EXL_REQUIRE_SHARED(file);
    memo_ = std::make_unique<BpeTokenizer>(test::shared_dir() / file);
    whole_ = std::make_unique<BpeTokenizer>(test::shared_dir() / file);
    whole_->set_prefix_memo(false);
  }
  std::unique_ptr<BpeTokenizer> memo_, whole_;
};

TEST_P(PrefixEncodeMemoOn, EncodingsEqualWholeSplitsWhereverThePrefixEnds) {
  BpeTokenizer& memo = *memo_;
  BpeTokenizer& whole = *whole_;
  std::mt19937 rng(26);
  int long_prefixes = 0;
  for (int base_i = 0; base_i < 6; ++base_i) {
    const std::string base = random_text(rng, 3000);
    ASSERT_EQ(memo.encode(base, false), whole.encode(base, false));
    for (int v = 0; v < 40; ++v) {
      const size_t cut = char_boundary(base, std::uniform_int_distribution<size_t>(0, base.size())(rng));
      const std::string text = base.substr(0, cut) + random_text(rng, std::uniform_int_distribution<size_t>(0, 400)(rng));
      long_prefixes += cut >= PrefixEncodeMemo::kMinBytes;
      ASSERT_EQ(test::ids_to_string(memo.encode(text, false)), test::ids_to_string(whole.encode(text, false)))
          << "base " << base_i << " variant " << v << " cut at byte " << cut;
    }
  }
  // The memo was used (a test of equality alone would pass without it).
  EXPECT_GE(memo.prefix_memo_hits(), uint64_t(long_prefixes));
  EXPECT_EQ(whole.prefix_memo_hits(), 0u);
}

TEST_P(PrefixEncodeMemoOn, SpecialTokensAroundLongPiecesAndRepeats) {
  BpeTokenizer& memo = *memo_;
  BpeTokenizer& whole = *whole_;
  std::mt19937 rng(7);
  const std::string doc = random_text(rng, 5000);
  const std::optional<int32_t> open = memo.piece_id("<|start_header_id|>");
  const std::string start = open ? "<|start_header_id|>" : "<|im_start|>";
  const std::string stop = open ? "<|eot_id|>" : "<|im_end|>";
  ASSERT_TRUE(memo.piece_id(start) && memo.piece_id(stop)) << start << " " << stop;
  const std::string turn1 = start + "user\n\n" + doc + stop;
  const std::string turn2 = turn1 + start + "assistant\n\n" + doc.substr(0, 2000) + " more";
  for (const std::string& t : {turn1, turn2, turn1, turn2 + doc})
    EXPECT_EQ(memo.encode(t, true), whole.encode(t, true));
  EXPECT_GE(memo.prefix_memo_hits(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, PrefixEncodeMemoOn,
                         ::testing::Values("models/llama3-tokenizer", "models/qwen3-tokenizer"));

// The memo alone: word ends whose last byte is not alphanumeric, or that lie within 8 bytes of
// where the texts part, are not reuse points.
TEST(PrefixEncodeMemo, ReusesOnlySettledWordEnds) {
  PrefixEncodeMemo m;
  std::string a(2000, 'a');
  a[999] = ' ';   // a word "aaa…a" ends at 999, then " aaa…" to the end
  PrefixEncodeMemo::Words w;
  w.word_end = {999, 2000};
  w.id_end = {1, 2};
  w.ids = {11, 22};
  m.store(a, w);
  PrefixEncodeMemo::Words got;
  std::string b = a;
  b[1500] = 'b';
  EXPECT_EQ(m.reuse(b, got), 999u);
  EXPECT_EQ(got.ids, std::vector<int32_t>{11});
  b = a;
  b[1004] = 'b';  // parts 5 bytes after the word end: not settled
  EXPECT_EQ(m.reuse(b, got), 0u);
  EXPECT_TRUE(got.ids.empty());
  std::string c = a;
  c[998] = ' ';  // the word before 999 now ends in a space
  c[1500] = 'b';
  PrefixEncodeMemo m2;
  m2.store(c, w);
  EXPECT_EQ(m2.reuse(c.substr(0, 1600) + "zzzz", got), 0u);
  EXPECT_EQ(m.hits(), 1u);
}

}  // namespace tokenizer_prefix_memo_test
}  // namespace exl
