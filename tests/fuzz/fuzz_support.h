// Helpers shared by the fuzz targets (tests/fuzz/fuzz_*.cpp). Each target defines
// LLVMFuzzerTestOneInput and feeds the bytes to one real parser; the only outcomes allowed are a
// return or a clean exl::Error / GrammarError (expect_clean). Anything else — another exception
// type escaping (an nlohmann exception the parser failed to wrap, std::out_of_range, ...), a
// crash, a sanitizer report, a hang — is a finding. Built as libFuzzer binaries with
// -DEXLAGENT_FUZZ=ON (clang), otherwise linked with fuzz_driver.cpp (see tests/README.md).
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "grammar/grammar_error.h"
#include "kernels/error.h"

namespace exl::fuzz {

inline std::string_view as_text(const uint8_t* data, size_t size) {
  return {reinterpret_cast<const char*>(data), size};
}

// ../shared beside the source tree, or $EXL_SHARED_DIR.
inline std::filesystem::path shared_dir() {
  if (const char* e = std::getenv("EXL_SHARED_DIR")) return e;
  return std::filesystem::path(EXL_SOURCE_DIR).parent_path() / "shared";
}

// A path of a seed list (tests/fuzz/seeds/<target>.list): relative to the source tree, with
// "../shared/" standing for shared_dir().
inline std::filesystem::path seed_path(std::string_view line) {
  constexpr std::string_view shared = "../shared/";
  if (line.substr(0, shared.size()) == shared) return shared_dir() / line.substr(shared.size());
  return std::filesystem::path(EXL_SOURCE_DIR) / line;
}

// A private directory for this process, removed at exit; targets that load files write the fuzz
// input there (the same file names every run).
inline const std::filesystem::path& scratch_dir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      std::string templ = (std::filesystem::temp_directory_path() / "exl-fuzz-XXXXXX").string();
      if (!::mkdtemp(templ.data())) std::abort();
      path = templ;
    }
    ~Dir() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static Dir dir;
  return dir.path;
}

inline void write_bytes(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// Runs f; a clean exl::Error (GrammarError included) is an expected outcome, anything else escapes.
template <class F>
void expect_clean(F&& f) {
  try {
    f();
  } catch (const Error&) {
  }
}

}  // namespace exl::fuzz
