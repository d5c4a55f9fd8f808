// The one error root of every layer, and the check macros. kernels/ is the lowest layer, so
// every other one includes this header; their errors derive from exl::Error (GrammarError,
// ApiError, UsageError, ...), so one `catch (const exl::Error&)` catches them all — a handler that
// treats one kind apart catches it first.
// EXL_CHECK validates input (files, requests, flags) and throws exl::Error with context;
// EXL_DCHECK guards our own invariants and compiles out of release builds.
#pragma once
#include <array>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace exl {

// Any failure caused by bad input or an unusable environment. what() names the layer, the
// concept and the bad item, e.g. "engine: safetensors: 'a.safetensors': tensor 'x': ...";
// layer() and concept_name() read the first two parts back ("engine", "safetensors"). Both are
// views into what(), computed on call; the type carries nothing but its message.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;

  // The message's first part when it is a layer's name ("kernels", "engine", "grammar", "tools",
  // "sessions", "runtime", or "internal" for a failed EXL_DCHECK); "" otherwise.
  std::string_view layer() const noexcept {
    const std::string_view m(what());
    static constexpr std::array<std::string_view, 7> k_layers = {"kernels", "engine",  "grammar", "tools",
                                                                 "sessions", "runtime", "internal"};
    for (std::string_view l : k_layers)
      if (m.size() > l.size() + 1 && m.starts_with(l) && m.substr(l.size(), 2) == ": ") return l;
    return {};
  }
  // The concept after the layer: the text up to the next ": " ("safetensors"); "" when the
  // message has no layer or nothing follows it.
  std::string_view concept_name() const noexcept {
    const std::string_view l = layer();
    if (l.empty()) return {};
    const std::string_view rest = std::string_view(what()).substr(l.size() + 2);
    const size_t end = rest.find(": ");
    return end == std::string_view::npos ? std::string_view{} : rest.substr(0, end);
  }
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
