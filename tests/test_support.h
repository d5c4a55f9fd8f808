// Helpers shared by the tests: where the source tree and ../shared are, and skipping cleanly
// when the shared assets are absent.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace exl::test {

// The CUDA tests (and the exlagent processes tests start) run the tensor-core EXL2 path while it is
// opt-in (kernels/cuda/cuda_linear.h: exl2_mma_enabled); set before main, so before any backend.
inline const bool k_enable_exl2_mma = (::setenv("EXL_CUDA_MMA", "1", 0), true);

inline std::filesystem::path source_dir() { return EXL_SOURCE_DIR; }
inline std::filesystem::path binary_dir() { return EXL_BINARY_DIR; }
// ../shared beside the source tree, or $EXL_SHARED_DIR.
inline std::filesystem::path shared_dir() {
  if (const char* e = std::getenv("EXL_SHARED_DIR")) return e;
  return source_dir().parent_path() / "shared";
}

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::vector<float> read_f32(const std::filesystem::path& p) {
  std::string s = read_file(p);
  std::vector<float> v(s.size() / 4);
  std::memcpy(v.data(), s.data(), v.size() * 4);
  return v;
}

inline void write_file(const std::filesystem::path& p, const std::string& data) {
  std::ofstream out(p, std::ios::binary);
  out << data;
}

// Relative L2 distance ‖a − b‖ / ‖b‖ (b is the reference).
inline double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

// max |got − ref| / max |ref| (ref is the reference; max |got − ref| where ref is all zeros);
// infinite where got has a non-finite value or another size.
inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  if (got.size() != ref.size()) return INFINITY;
  double scale = 0, err = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    scale = std::max(scale, std::fabs(double(ref[i])));
    err = std::max(err, std::fabs(double(got[i]) - double(ref[i])));
  }
  return scale > 0 ? err / scale : err;
}

// Fraction of rows of [rows, vocab] logits whose argmax agree.
inline double argmax_agreement(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  const size_t rows = a.size() / size_t(vocab);
  size_t agree = 0;
  for (size_t r = 0; r < rows; ++r) {
    auto ra = a.begin() + std::ptrdiff_t(r * size_t(vocab)), rb = b.begin() + std::ptrdiff_t(r * size_t(vocab));
    agree += std::max_element(ra, ra + vocab) - ra == std::max_element(rb, rb + vocab) - rb;
  }
  return rows ? double(agree) / double(rows) : 0.0;
}

// A fresh empty directory under the build tree, private to the running test: ctest runs tests in
// parallel processes, so the path holds the test's full name as well as `name`.
inline std::filesystem::path temp_dir(const std::string& name) {
  std::string safe;
  if (const auto* info = ::testing::UnitTest::GetInstance()->current_test_info())
    safe = std::string(info->test_suite_name()) + "." + info->name() + "-";
  safe += name;
  for (char& c : safe)
    if (c == '/' || c == '\\' || c == ' ') c = '_';
  auto d = binary_dir() / "test-tmp" / safe;
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

}  // namespace exl::test

// Skips the current test unless ../shared/<rel> exists.
#define EXL_REQUIRE_SHARED(rel)                                                                   \
  do {                                                                                            \
    if (!std::filesystem::exists(::exl::test::shared_dir() / (rel)))                              \
      GTEST_SKIP() << "shared asset missing: " << (::exl::test::shared_dir() / (rel)).string()   \
                   << " (tests read ../shared beside the source tree, or $EXL_SHARED_DIR)";       \
  } while (0)
