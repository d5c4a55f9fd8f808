// Fuzz target: the tokenizer.json and tokenizer_config.json loaders (engine/tokenizer/tokenizer.h). The
// input up to its first NUL byte is tokenizer.json, the rest (when there is a NUL)
// tokenizer_config.json; both are written to a model directory and load_tokenizer reads it. A
// tokenizer that loads then encodes and decodes a short text with special tokens.
#include "engine/tokenizer/tokenizer.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto dir = exl::fuzz::scratch_dir() / "tokenizer";
  std::filesystem::create_directories(dir);
  const std::string_view text = exl::fuzz::as_text(data, size);
  const size_t nul = text.find('\0');
  exl::fuzz::write_bytes(dir / "tokenizer.json", text.substr(0, nul));
  std::filesystem::remove(dir / "tokenizer_config.json");
  if (nul != std::string_view::npos) exl::fuzz::write_bytes(dir / "tokenizer_config.json", text.substr(nul + 1));
  exl::fuzz::expect_clean([&] {
    auto tok = exl::load_tokenizer(dir);
    auto ids = tok->encode("Hello <s> world\n<|im_end|> caf\xc3\xa9 \xf0\x9f\x98\x80 12345", true);
    tok->decode(ids);
    tok->decode(ids, true);
  });
  return 0;
}
