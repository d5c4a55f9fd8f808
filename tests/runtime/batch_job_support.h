// Test-only: what the batch-job tests (cli_jobs_test, cli_batch_output_test) share: the
// stories260K model they run on, simple-form request files, output line counts, and an
// `exlagent` child process to kill or race.
#pragma once
#include <fcntl.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace exl::test {

inline constexpr const char* k_job_model = "models/stories260K-hf";

inline std::string job_model_dir() { return (shared_dir() / k_job_model).string(); }

// `n` simple-form batch requests, one a line: id "rI", prompt "Once upon a time I", `max_tokens`.
inline std::string batch_simple_lines(int n, int max_tokens) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    const std::string num = std::to_string(i);
    s += nlohmann::ordered_json{{"id", "r" + num}, {"prompt", "Once upon a time " + num}, {"max_tokens", max_tokens}}
             .dump();
    s += '\n';
  }
  return s;
}

// The newlines in `p` (complete lines); 0 while it does not exist.
inline size_t count_file_lines(const std::filesystem::path& p) {
  if (!std::filesystem::exists(p)) return 0;
  const std::string s = read_file(p);
  return size_t(std::count(s.begin(), s.end(), '\n'));
}

// Starts `bin` with `args` (argv[1...]) in a child process whose stderr goes to /dev/null; returns
// its pid (negative when fork failed). The caller reaps it.
inline pid_t spawn_quiet(const std::filesystem::path& bin, const std::vector<std::string>& args) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<char*> argv{const_cast<char*>(bin.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    const int devnull = ::open("/dev/null", O_WRONLY);
    ::dup2(devnull, 2);
    ::execv(bin.c_str(), argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace exl::test
