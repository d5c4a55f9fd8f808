// Fuzz target: the safetensors header parser (offsets, sizes, dtypes and shapes against the file
// length) on a whole file's bytes.
#include "engine/formats/safetensors.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  exl::fuzz::expect_clean([&] {
    exl::parse_safetensors_header({reinterpret_cast<const std::byte*>(data), size}, "fuzz");
  });
  return 0;
}
