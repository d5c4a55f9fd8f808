// The driver that runs a fuzz target without libFuzzer (gcc builds, CI): every seed input, then a
// bounded number of deterministic random mutations of them. Flags follow libFuzzer's spelling:
//   fuzz_<target> [-runs=N] [-seed=S] [-max_total_time=SECONDS] [-max_len=BYTES] [-verbose=1]
//                 SEED...
// A SEED is a file, a directory (its regular files, recursively), or @LIST: a file naming one
// path per line relative to the source tree, where "../shared/..." means the shared assets
// ($EXL_SHARED_DIR when set); missing paths are skipped with a note. Seeds larger than max_len (default 4 MiB) are skipped.
// The mutation sequence depends only on the seed files and -seed, so a finding reproduces with
// the same command; the input of an escaped exception is written to ./crash-<run> first.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace exl::fuzz_driver {

namespace fs = std::filesystem;

struct DriverArgs {
  uint64_t runs = 2000;
  uint64_t seed = 1;
  double max_total_time = 0;
  size_t max_len = 4u << 20;
  bool verbose = false;
  std::vector<std::string> inputs;
};

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void add_seed_path(const fs::path& p, const DriverArgs& a, std::vector<std::string>& seeds) {
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::recursive_directory_iterator(p, ec))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) add_seed_path(f, a, seeds);
  } else if (fs::is_regular_file(p, ec)) {
    if (fs::file_size(p, ec) <= a.max_len) seeds.push_back(read_all(p));
    else std::cout << "skipped (larger than max_len): " << p << "\n";
  } else {
    std::cout << "skipped (missing): " << p << "\n";
  }
}

// Tokens the mutator inserts: JSON, HTTP and number edge cases that random bytes rarely hit.
const char* const kDriverTokens[] = {
    "{", "}", "[", "]", "\"", ":", ",", "null", "true", "-1", "0", "1e999", "-0.0", "4294967301",
    "18446744073709551616", "9223372036854775807", "\\u0000", "\\ud800", "\xff", "\xc3\xa9", "{\"a\":",
    "[[[[[[[[", "\r\n", "\r\n\r\n", ": ", "Content-Length: ", "Transfer-Encoding: chunked\r\n", "{1,65535}",
    "(", ")", "|", "*", "+", "?", "\\", "^", "$", "{{", "}}", "\"$ref\":\"#\"", "\"type\":", "\0\0\0\0"};

std::string mutate(const std::vector<std::string>& seeds, std::mt19937_64& rng, size_t max_len) {
  auto pick = [&](size_t n) { return n == 0 ? size_t(0) : size_t(rng() % n); };
  std::string s = seeds.empty() ? std::string() : seeds[pick(seeds.size())];
  const int n_edits = 1 + int(rng() % 4);
  for (int k = 0; k < n_edits; ++k) {
    switch (rng() % 8) {
      case 0:
        if (!s.empty()) s[pick(s.size())] ^= char(1u << (rng() % 8));
        break;
      case 1:
        if (!s.empty()) s[pick(s.size())] = char(rng());
        break;
      case 2:
        s.insert(s.begin() + std::ptrdiff_t(pick(s.size() + 1)), char(rng()));
        break;
      case 3:
        if (!s.empty()) {
          const size_t at = pick(s.size());
          s.erase(at, 1 + pick(std::min<size_t>(s.size() - at, 16)));
        }
        break;
      case 4:
        if (!s.empty()) {
          const size_t at = pick(s.size()), len = 1 + pick(std::min<size_t>(s.size() - at, 64));
          s.insert(pick(s.size() + 1), s.substr(at, len));
        }
        break;
      case 5: {
        const std::string tok = kDriverTokens[pick(std::size(kDriverTokens))];
        s.insert(pick(s.size() + 1), tok.empty() ? std::string(4, '\0') : tok);
        break;
      }
      case 6:
        s.resize(pick(s.size() + 1));
        break;
      case 7:
        if (!seeds.empty()) {
          const std::string& other = seeds[pick(seeds.size())];
          const size_t from = pick(other.size() + 1);
          s = s.substr(0, pick(s.size() + 1)) + other.substr(from);
        }
        break;
    }
  }
  if (s.size() > max_len) s.resize(max_len);
  return s;
}

bool run_one(const std::string& input, const std::string& what, bool verbose) {
  try {
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(input.data()), input.size());
    return true;
  } catch (const std::exception& e) {
    std::cerr << "FINDING: " << what << ": escaped exception: " << e.what() << "\n";
  } catch (...) {
    std::cerr << "FINDING: " << what << ": escaped non-standard exception\n";
  }
  return false;
}

int driver_main(int argc, char** argv) {
  DriverArgs a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto flag = [&](const char* name) { return arg.rfind(name, 0) == 0 ? arg.substr(std::strlen(name)) : std::string(); };
    if (auto v = flag("-runs="); !v.empty()) a.runs = std::stoull(v);
    else if (auto v = flag("-seed="); !v.empty()) a.seed = std::stoull(v);
    else if (auto v = flag("-max_total_time="); !v.empty()) a.max_total_time = std::stod(v);
    else if (auto v = flag("-max_len="); !v.empty()) a.max_len = std::stoull(v);
    else if (auto v = flag("-verbose="); !v.empty()) a.verbose = v != "0";
    else if (arg.rfind('-', 0) == 0) {
      std::cerr << "unknown flag " << arg << "\n";
      return 2;
    } else a.inputs.push_back(arg);
  }
  std::vector<std::string> seeds;
  for (const auto& in : a.inputs) {
    if (in.rfind('@', 0) == 0) {
      std::ifstream list(in.substr(1));
      if (!list) {
        std::cerr << "cannot read seed list " << in.substr(1) << "\n";
        return 2;
      }
      for (std::string line; std::getline(list, line);)
        if (!line.empty() && line[0] != '#') add_seed_path(fuzz::seed_path(line), a, seeds);
    } else {
      add_seed_path(in, a, seeds);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  for (size_t i = 0; i < seeds.size(); ++i)
    if (!run_one(seeds[i], "seed " + std::to_string(i), a.verbose)) return 1;
  std::mt19937_64 rng(a.seed);
  uint64_t done = 0;
  for (; done < a.runs; ++done) {
    if (a.max_total_time > 0 && elapsed() > a.max_total_time) break;
    const std::string input = mutate(seeds, rng, a.max_len);
    if (!run_one(input, "mutation " + std::to_string(done), a.verbose)) {
      const std::string crash = "crash-" + std::to_string(done);
      fuzz::write_bytes(crash, input);
      std::cerr << "input written to " << crash << "\n";
      return 1;
    }
  }
  std::cout << "ran " << seeds.size() << " seeds and " << done << " mutations in " << elapsed() << " s\n";
  return 0;
}

}  // namespace exl::fuzz_driver

int main(int argc, char** argv) { return exl::fuzz_driver::driver_main(argc, argv); }
