// Streaming detokenization: chunks are always whole UTF-8 characters and add up to decode().
#include <gtest/gtest.h>

#include "engine/tokenizer/detokenizer.h"
#include "engine/tokenizer/utf8.h"
#include "kernels/error.h"
#include "tokenizer_test_util.h"

namespace exl {
namespace tokenizer_detokenizer_test {

const std::string kText =
    "Emoji 🦙🚀 😶\u200d🌫️ and CJK 我想在apple工作 天～, Khmer កាន់តែ, Cửa Việt <- done.\n  indented 👍🏽";

struct Streamed {
  std::string text;
  size_t held = 0;  // pushes that returned nothing because a character was incomplete
};

Streamed stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool sequence_start = true) {
  Detokenizer d(tok, sequence_start);
  Streamed s;
  for (int32_t id : ids) {
    std::string chunk = d.push(id);
    EXPECT_TRUE(utf8::is_valid(chunk)) << "token " << id;
    if (d.pending_bytes() > 0) ++s.held;
    s.text += chunk;
  }
  std::string tail = d.flush();
  EXPECT_TRUE(utf8::is_valid(tail));
  s.text += tail;
  return s;
}

class TokenizerDetokenizer : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { EXL_REQUIRE_SHARED(GetParam()); }
  const Tokenizer& tok() const { return test::shared_tokenizer(GetParam()); }
};

TEST_P(TokenizerDetokenizer, ChunksAreWholeCharactersAndAddUpToDecode) {
  for (bool special : {false, true}) {
    auto ids = tok().encode(kText, special);
    Streamed s = stream(tok(), ids);
    EXPECT_EQ(s.text, tok().decode(ids));
    EXPECT_GT(s.held, 0u) << "no token split a character, so nothing was tested";
  }
  auto ids = tok().encode(kText, false);
  EXPECT_EQ(stream(tok(), ids).text, kText);
}

// A continuation keeps the space of its first token; a fresh sequence drops the dummy prefix.
TEST_P(TokenizerDetokenizer, ContinuationKeepsLeadingSpace) {
  auto ids = tok().encode(" world", false);
  std::string cont = stream(tok(), ids, false).text;
  std::string joined;
  for (int32_t id : ids) joined += tok().token_bytes(id);
  EXPECT_EQ(cont, joined);
  EXPECT_EQ(stream(tok(), ids, true).text, tok().decode(ids));
}

// The id of the ordinary token that is exactly byte b.
int32_t byte_token(const Tokenizer& tok, char b) {
  for (int32_t id = 0; id < tok.vocab_size(); ++id)
    if (!tok.is_special(id) && tok.token_bytes(id) == std::string(1, b)) return id;
  ADD_FAILURE() << "no token for byte " << int(static_cast<unsigned char>(b));
  return 0;
}

// Bytes that can never complete a character come out as U+FFFD, exactly as decode shows them.
TEST_P(TokenizerDetokenizer, BrokenCharactersBecomeReplacementChars) {
  // "🦙" is F0 9F A6 99: three of its bytes, "a", then two of them at the very end.
  std::vector<int32_t> ids;
  for (char b : std::string("\xF0\x9F\xA6" "a" "\xF0\x9F")) ids.push_back(byte_token(tok(), b));
  Streamed s = stream(tok(), ids);
  EXPECT_EQ(s.text, tok().decode(ids));
  EXPECT_EQ(s.text, "\xEF\xBF\xBD" "a" "\xEF\xBF\xBD");
  EXPECT_EQ(s.held, 5u);  // all but "a", which completes the first U+FFFD
}

TEST_P(TokenizerDetokenizer, OutOfRangeIdIsAnError) {
  Detokenizer d(tok());
  EXPECT_THROW(d.push(tok().vocab_size()), Error);
  EXPECT_THROW(d.push(-1), Error);
  EXPECT_THROW(tok().decode(std::vector<int32_t>{1, tok().vocab_size() + 5}), Error);
}

INSTANTIATE_TEST_SUITE_P(All, TokenizerDetokenizer,
                         ::testing::Values("models/llama2-tokenizer", "models/mistral-tokenizer",
                                           "models/llama3-tokenizer", "models/qwen3-tokenizer"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

}  // namespace tokenizer_detokenizer_test
}  // namespace exl
