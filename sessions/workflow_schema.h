// The JSON Schema of workflow files (docs/workflow.schema.json, compiled in) and a validator for
// the keywords it uses, so a malformed workflow is refused with the JSON pointer of each problem
// ("/steps/1: missing required property 'prompt'") before anything runs.
//
// Supported keywords: type, properties, required, additionalProperties, items, minItems,
// minLength, pattern (RE2, search semantics), minimum, enum, anyOf, $ref to "#/$defs/NAME";
// annotations ($schema, $id, title, description) are ignored. Any thread.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace exl {

// The workflow schema's text, identical to docs/workflow.schema.json.
std::string_view workflow_schema_text();

// Every violation of `schema` by `doc` ("POINTER: message"; the pointer is "" for the root),
// at most `max_errors` of them. Throws exl::Error for a keyword the validator does not know.
std::vector<std::string> schema_violations(const nlohmann::ordered_json& schema, const nlohmann::ordered_json& doc,
                                           size_t max_errors = 10);

}  // namespace exl
