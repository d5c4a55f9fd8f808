// Fuzz target: the SentencePiece model loader (engine/tokenizer/sentencepiece_tokenizer.h) on a
// tokenizer.model's bytes; a model that loads then encodes and decodes a short text.
#include "engine/tokenizer/sentencepiece_tokenizer.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto file = exl::fuzz::scratch_dir() / "tokenizer.model";
  exl::fuzz::write_bytes(file, exl::fuzz::as_text(data, size));
  exl::fuzz::expect_clean([&] {
    exl::SentencePieceTokenizer tok(file);
    auto ids = tok.encode("Hello <s> world </s>\n caf\xc3\xa9 12345", true);
    tok.decode(ids);
  });
  return 0;
}
