// read_file: a text file under the configured root. Checks, in order: the path is relative, not
// empty, has no NUL and no ".." component; the root-joined path, with every symlink resolved
// (std::filesystem::canonical), still lies under the canonical root (compared component by
// component); it is a regular file no larger than the cap; its bytes are valid UTF-8.
// The canonical path is what gets opened; a component replaced by a symlink between the check and
// the open (a race needing write access under the root) is not guarded against.
#include <fstream>

#include "kernels/error.h"
#include "tools/builtin_tools.h"
#include "tools/function_tool.h"

namespace exl {
namespace fs = std::filesystem;
namespace {

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = uint8_t(s[i]);
    size_t n;
    uint32_t cp;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
    else return false;
    if (i + n >= s.size()) return false;
    for (size_t k = 1; k <= n; ++k) {
      const uint8_t b = uint8_t(s[i + k]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n + 1;
  }
  return true;
}

bool under(const fs::path& root, const fs::path& p) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end(); ++r, ++q)
    if (q == p.end() || *r != *q) return false;
  return true;
}

ToolResult read(const fs::path& root, uint64_t cap, const nlohmann::json& args) {
  const std::string rel = args.at("path").get<std::string>();
  const std::string shown = nlohmann::json(rel).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  EXL_CHECK(!rel.empty(), "read_file: path is empty");
  EXL_CHECK(rel.find('\0') == std::string::npos, "read_file: path ", shown, " contains a NUL byte");
  const fs::path p(rel);
  EXL_CHECK(!p.is_absolute() && !p.has_root_name() && !p.has_root_directory(), "read_file: path ", shown,
            " is absolute; give a path relative to the root directory");
  for (const fs::path& part : p)
    EXL_CHECK(part != "..", "read_file: path ", shown, " contains '..'; paths may not leave the root directory");
  std::error_code ec;
  const fs::path real = fs::canonical(root / p, ec);
  EXL_CHECK(!ec, "read_file: path ", shown, ": ", ec == std::errc::no_such_file_or_directory ? "no such file" : ec.message());
  EXL_CHECK(under(root, real), "read_file: path ", shown, " resolves (through a symlink) outside the root directory");
  const fs::file_status st = fs::status(real, ec);
  EXL_CHECK(!ec && fs::is_regular_file(st), "read_file: path ", shown, " is not a regular file");
  const uint64_t size = fs::file_size(real, ec);
  EXL_CHECK(!ec, "read_file: path ", shown, ": ", ec.message());
  EXL_CHECK(size <= cap, "read_file: path ", shown, " is ", size, " bytes, more than the limit of ", cap);
  std::ifstream in(real, std::ios::binary);
  EXL_CHECK(in, "read_file: path ", shown, ": cannot open");
  std::string data(size_t(cap) + 1, '\0');
  in.read(data.data(), std::streamsize(data.size()));
  data.resize(size_t(in.gcount()));
  EXL_CHECK(data.size() <= cap, "read_file: path ", shown, " is more than the limit of ", cap, " bytes");
  EXL_CHECK(valid_utf8(data), "read_file: path ", shown, " is not UTF-8 text");
  return {data};
}

}  // namespace

std::shared_ptr<Tool> make_read_file_tool(const BuiltinToolOptions& opts) {
  std::error_code ec;
  const fs::path root = fs::canonical(opts.read_root, ec);
  EXL_CHECK(!ec && fs::is_directory(root), "tools: read_file: root '", opts.read_root.string(),
            "' is not an existing directory");
  ToolSpec spec{"read_file",
                "Read a UTF-8 text file, given its path relative to the allowed directory.",
                {{"type", "object"},
                 {"properties",
                  {{"path",
                    {{"type", "string"}, {"minLength", 1}, {"maxLength", 4096},
                     {"description", "relative path, e.g. notes/todo.txt"}}}}},
                 {"required", {"path"}},
                 {"additionalProperties", false}}};
  const uint64_t cap = opts.read_max_bytes;
  return std::make_shared<FunctionTool>(std::move(spec), [root, cap](const nlohmann::json& args, const CancelToken&) {
    return read(root, cap, args);
  });
}

}  // namespace exl
