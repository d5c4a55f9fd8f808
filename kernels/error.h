// Error type and check macros shared by every layer above kernels/.
// EXL_CHECK validates input (files, requests, flags) and throws exl::Error with context;
// EXL_DCHECK guards our own invariants and compiles out of release builds.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace exl {

// Any failure caused by bad input or an unusable environment. what() names the layer, the
// concept and the bad item, e.g. "engine: safetensors: 'a.safetensors': tensor 'x': ...".
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

template <typename... Args>
[[noreturn]] void fail(const Args&... args) {
  throw Error(cat(args...));
}

}  // namespace exl

#define EXL_CHECK(cond, ...)                     \
  do {                                           \
    if (!(cond)) ::exl::fail(__VA_ARGS__);       \
  } while (0)

#ifdef NDEBUG
#define EXL_DCHECK(cond) ((void)0)
#else
#define EXL_DCHECK(cond)                                                                   \
  do {                                                                                     \
    if (!(cond)) ::exl::fail("internal: check failed: " #cond " at " __FILE__ ":", __LINE__); \
  } while (0)
#endif
