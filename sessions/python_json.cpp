#include "sessions/python_json.h"

#include "kernels/error.h"

namespace exl {

namespace {

void dump(const nlohmann::ordered_json& v, int indent, int depth, std::string& out) {
  const bool pretty = indent >= 0;
  auto newline = [&](int d) {
    out += '\n';
    out.append(size_t(indent) * size_t(d), ' ');
  };
  if (v.is_object() || v.is_array()) {
    const bool obj = v.is_object();
    if (v.empty()) {
      out += obj ? "{}" : "[]";
      return;
    }
    out += obj ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end(); ++it) {
      if (!first) out += pretty ? "," : ", ";
      first = false;
      if (pretty) newline(depth + 1);
      if (obj) {
        dump(nlohmann::ordered_json(it.key()), indent, depth + 1, out);
        out += ": ";
      }
      dump(*it, indent, depth + 1, out);
    }
    if (pretty) newline(depth);
    out += obj ? '}' : ']';
    return;
  }
  try {
    out += v.dump();
  } catch (const nlohmann::json::exception& e) {
    fail("sessions: json: cannot serialize value: ", e.what());
  }
}

}  // namespace

std::string python_json_dumps(const nlohmann::ordered_json& value, int indent) {
  std::string out;
  dump(value, indent, 0, out);
  return out;
}

}  // namespace exl
