// Fuzz target: batch input lines (runtime/openai/batch_request.h) in both forms, with and without a
// default schema, and result-line keys on resume. parse_batch_line never throws: problems are
// error items, which must still give a result line.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "runtime/openai/batch_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view line = exl::fuzz::as_text(data, size);
  static const std::optional<nlohmann::ordered_json> schema =
      nlohmann::ordered_json::parse(R"({"type":"object","properties":{"a":{"type":"string"}},"required":["a"]})");
  for (auto form : {exl::BatchForm::simple, exl::BatchForm::openai}) {
    exl::BatchItem item = exl::parse_batch_line(line, 7, form, form == exl::BatchForm::simple ? schema : std::nullopt, 512);
    if (item.error) exl::batch_error_line(item);
    exl::mark_duplicate(item);
    exl::batch_error_line(item);
  }
  exl::batch_result_key(line);
  return 0;
}
