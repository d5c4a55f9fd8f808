// Shared by the tokenizer tests: llama.cpp's conformance files and loading each tokenizer once per
// test process.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/tokenizer/tokenizer.h"
#include "test_support.h"

namespace exl::test {

// llama.cpp's vocab test format: .inp strings separated by "\n__ggml_vocab_test__\n" (the file
// ends with one), .out one line per string with space-prefixed ids.
struct VocabCase {
  std::string text;
  std::vector<int32_t> ids;
};

inline std::vector<VocabCase> read_vocab_cases(const std::filesystem::path& inp, const std::filesystem::path& out) {
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::string in = read_file(inp), ex = read_file(out);
  std::vector<VocabCase> cases;
  for (size_t pos = 0; pos < in.size();) {
    size_t hit = in.find(sep, pos);
    if (hit == std::string::npos) break;
    cases.push_back({in.substr(pos, hit - pos), {}});
    pos = hit + sep.size();
  }
  std::istringstream lines(ex);
  std::string line;
  for (auto& c : cases) {
    if (!std::getline(lines, line)) break;
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
  }
  return cases;
}

inline std::vector<VocabCase> llama_cpp_cases(const std::string& name) {
  auto dir = shared_dir() / "models/llama.cpp-vocab";
  return read_vocab_cases(dir / ("ggml-vocab-" + name + ".gguf.inp"), dir / ("ggml-vocab-" + name + ".gguf.out"));
}

// The tokenizer of ../shared/<rel>, loaded once per process.
inline const Tokenizer& shared_tokenizer(const std::string& rel) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto& t = loaded[rel];
  if (!t) t = load_tokenizer(shared_dir() / rel);
  return *t;
}

inline std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += " " + std::to_string(id);
  return s;
}

}  // namespace exl::test
