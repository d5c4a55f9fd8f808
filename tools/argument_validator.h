// ArgumentValidator: checks a tool call's arguments against the tool's input JSON Schema with the
// grammar engine (grammar/json_schema.h), the same automaton that constrains generation, so a
// call the grammar would have let the model write is exactly a call that validates here.
//
// The schema is compiled once (property order `any`, flexible whitespace); `check` serializes the
// arguments compactly and feeds the bytes to a Matcher. On rejection it names where: the JSON
// pointer of the innermost value (or property name) holding the first rejected byte, and, when the
// schema at that pointer is plain enough to read (properties/items, no $ref), why: a missing
// required property, an unexpected property, a wrong type, a value outside an enum.
//
// Immutable after construction; `check` may run on several threads at once.
#pragma once
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace exl {

class CompiledGrammar;

class ArgumentValidator {
 public:
  // Throws exl::Error ("tools: arguments: input schema: grammar: json_schema: ...") when the
  // grammar engine cannot enforce the schema.
  explicit ArgumentValidator(const nlohmann::json& schema);
  ~ArgumentValidator();

  // nullopt when `arguments` validate; otherwise a one-line description of the problem.
  std::optional<std::string> check(const nlohmann::json& arguments) const;

  static constexpr size_t kMaxArgumentBytes = 1 << 20;

 private:
  nlohmann::json schema_;
  std::shared_ptr<const CompiledGrammar> grammar_;
};

}  // namespace exl
