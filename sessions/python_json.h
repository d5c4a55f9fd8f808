// JSON text exactly as Python's json.dumps(x, ensure_ascii=False[, indent=N]) writes it, which is
// what Hugging Face chat templates produce with `| tojson`: ", " and ": " separators without an
// indent, "," + newline and ": " with one. Object keys keep their order (ordered_json), so a tool
// schema renders the way the client wrote it. Pure functions; any thread.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

namespace exl {

// indent < 0: one line. Throws exl::Error for strings that are not valid UTF-8.
std::string python_json_dumps(const nlohmann::ordered_json& value, int indent = -1);

}  // namespace exl
