// Fuzz target: workflow files (sessions/workflow.h). A document that parses as JSON goes through
// parse_workflow (schema validation, then the reference checks) with a scratch base directory;
// a workflow that parses has its templates rendered against an empty context.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "sessions/workflow.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto doc = nlohmann::ordered_json::parse(exl::fuzz::as_text(data, size), nullptr, false);
  if (doc.is_discarded()) return 0;
  exl::fuzz::expect_clean([&] {
    exl::Workflow wf = exl::parse_workflow(doc, exl::fuzz::scratch_dir(), {{"text", "hello"}});
    nlohmann::ordered_json context = {{"inputs", wf.inputs}, {"steps", nlohmann::ordered_json::object()},
                                      {"item", "x"}, {"index", 0}};
    for (const auto& step : wf.steps) {
      exl::fuzz::expect_clean([&] { exl::render_template(step.prompt, context, step.name); });
      if (step.condition) exl::condition_holds(*step.condition, context);
    }
  });
  return 0;
}
