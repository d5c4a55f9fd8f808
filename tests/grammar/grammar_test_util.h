// Helpers for the grammar tests: compile a schema or regex and check a text against it.
#pragma once
#include <memory>
#include <string>

#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace exl::test {

inline bool grammar_accepts(Grammar g, std::string_view text) {
  auto cg = std::make_shared<CompiledGrammar>(std::move(g), nullptr);
  Matcher m(cg);
  return m.accept_bytes(text) && m.is_accepting();
}

inline bool schema_accepts(const std::string& schema, const std::string& text, JsonSchemaOptions opts = {}) {
  return grammar_accepts(compile_json_schema_text(schema, opts), text);
}

inline JsonSchemaOptions any_order() {
  JsonSchemaOptions o;
  o.property_order = JsonSchemaOptions::PropertyOrder::any;
  o.integer_zero_fraction = true;
  return o;
}

}  // namespace exl::test
