// Fuzz target for the safetensors header parser. With clang it builds as a libFuzzer target
// (-fsanitize=fuzzer); otherwise as a driver that runs each file named on the command line.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <iterator>
#include <span>
#include <vector>

#include "engine/safetensors.h"
#include "kernels/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    auto h = exl::parse_safetensors_header({reinterpret_cast<const std::byte*>(data), size}, "fuzz");
    (void)h;
  } catch (const exl::Error&) {
  }
  return 0;
}

#ifdef EXL_FUZZ_STANDALONE
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::vector<char> buf((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(buf.data()), buf.size());
  }
  std::cout << "ran " << argc - 1 << " inputs\n";
  return 0;
}
#endif
