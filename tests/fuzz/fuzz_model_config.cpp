// Fuzz target: config.json (engine/formats/model_config.h). Text that is not JSON is the fuzzer's own
// business; a parsed document must give a ModelConfig or a clean exl::Error.
#include <nlohmann/json.hpp>

#include "engine/formats/model_config.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto j = nlohmann::json::parse(exl::fuzz::as_text(data, size), nullptr, false);
  if (j.is_discarded()) return 0;
  exl::fuzz::expect_clean([&] { exl::parse_model_config(j, "config.json"); });
  return 0;
}
