// Test-only: runs one CLI command in-process and captures its exit code, stdout, stderr, and the
// exl::Error it threw (main would report that and exit 1).
#pragma once
#include <gtest/gtest.h>

#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "kernels/error.h"

namespace exl::test {

struct CliResult {
  int code;  // -1: the command threw exl::Error
  std::string out, err;
  std::string error;  // that error's message
};

inline CliResult run_cli(int (*cmd)(std::span<const std::string>), std::vector<std::string> args) {
  testing::internal::CaptureStdout();
  testing::internal::CaptureStderr();
  int code = -1;
  std::string error;
  try {
    code = cmd(args);
  } catch (const Error& e) {
    error = e.what();
  }
  std::fflush(stdout);
  std::string out = testing::internal::GetCapturedStdout();
  return {code, out, testing::internal::GetCapturedStderr(), error};
}

}  // namespace exl::test
