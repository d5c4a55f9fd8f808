// --gpu-split on the command line: its values, `info`'s placement (table and JSON), `generate`
// on a model split over two CPU backends (llama2.c's reference text), the job commands' flag, and
// the error when the machine has fewer CUDA devices than the split names; --tensor-parallel's
// `generate` on two CPU ranks and its usage errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "engine/layer_split.h"
#include "engine/memory_plan.h"
#include "kernels/cuda_device.h"
#include "kernels/error.h"
#include "runtime/backend_select.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"
#include "runtime/job_engine.h"
#include "test_support.h"

namespace exl {
namespace cli_gpu_split_test {

constexpr auto run = test::run_cli;

// The GB value whose bytes are exactly `bytes` (a binary fraction, printed to round-trip).
std::string exact_gb(int64_t bytes) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", double(bytes) / double(int64_t(1) << 30));
  return b;
}

TEST(GpuSplitFlag, ParsesGigabytesPerDeviceOrAuto) {
  const GpuSplit s = parse_gpu_split("20,24.5", "cuda");
  EXPECT_EQ(s.gb, (std::vector<double>{20, 24.5}));
  EXPECT_EQ(s.n_devices, 2);
  EXPECT_EQ(parse_gpu_split("3", "cpu").n_devices, 1);
  for (const char* bad : {"", "20,", ",24", "20,,24", "x", "-1", "0", "20;24", "1e9"})
    EXPECT_THROW(parse_gpu_split(bad, "cuda"), Error) << bad;
  try {
    parse_gpu_split("auto", "cpu");
    ADD_FAILURE() << "auto on the CPU";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--gpu-split auto needs --backend cuda"), std::string::npos) << e.what();
  }
  if (cuda_device_count() == 0) {
    EXPECT_THROW(parse_gpu_split("auto", "cuda"), Error);
  }
}

TEST(GpuSplitFlag, InfoShowsWhichLayersEachDeviceHolds) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw/config.json");
  const auto dir = test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw";
  MemoryRequest req;
  req.cache_format = KvFormat::f32;
  req.cache_pages = 4;
  GpuSplit three;
  three.n_devices = 3;
  const std::vector<std::optional<DeviceMemory>> none(3);
  const int64_t first = plan_layer_split(ModelDir(dir), req, three, none).devices[0].total_bytes();
  const std::string split = exact_gb(first) + ",1";  // layer 0 (and the embedding) exactly fill device 0

  auto r = run(cli_info, {dir.string(), "--json", "--backend", "cpu", "--cache-pages", "4", "--gpu-split", split});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  const auto j = nlohmann::json::parse(r.out)["layer_split"];
  ASSERT_EQ(j["devices"].size(), 2u);
  EXPECT_EQ(j["devices"][0]["layer_end"], 1);
  EXPECT_EQ(j["devices"][0]["total_bytes"].get<int64_t>(), first);
  EXPECT_TRUE(j["devices"][0]["embedding"].get<bool>());
  EXPECT_EQ(j["devices"][1]["layer_begin"], 1);
  EXPECT_EQ(j["devices"][1]["layer_end"], 3);
  EXPECT_TRUE(j["devices"][1]["head"].get<bool>());
  EXPECT_EQ(j["cache_pages"], 4);

  r = run(cli_info, {dir.string(), "--backend", "cpu", "--cache-pages", "4", "--gpu-split", split});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  EXPECT_NE(r.out.find("layer split\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device 0       layers 0..0 + embedding"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("device 1       layers 1..2 + head"), std::string::npos) << r.out;

  r = run(cli_info, {dir.string(), "--backend", "cpu", "--cache-pages", "4", "--gpu-split", "0.0001,0.0001"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.out.find("engine: layer split: model '"), std::string::npos) << r.out;
  EXPECT_EQ(run(cli_info, {dir.string(), "--gpu-split", "1,1"}).code, 2);  // needs --backend
  EXPECT_EQ(run(cli_info, {dir.string(), "--backend", "cpu", "--gpu-split", "1,x"}).code, 2);
}

TEST(GpuSplitFlag, FewerCudaDevicesThanTheSplitNamesIsAClearError) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama-gqa/exl2-4.0bpw/config.json");
  const int have = cuda_device_count();
  const std::string dir = (test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw").string();
  std::string split = "1";
  for (int i = 0; i < have; ++i) split += ",1";
  const auto r = run(cli_info, {dir, "--backend", "cuda", "--gpu-split", split});
  EXPECT_EQ(r.code, -1);
  EXPECT_NE(r.error.find(cat("runtime: --gpu-split names ", have + 1, " devices but this machine has ", have)),
            std::string::npos)
      << r.error;
}

TEST(GpuSplitFlag, GenerateOnTwoCpuBackendsMatchesLlama2c) {
  EXL_REQUIRE_SHARED("models/stories260K/reference/expected_greedy_200.txt");
  const auto model = test::shared_dir() / "models/stories260K-hf";
  // The request `generate` plans for a BOS prompt and 200 tokens (cli_generate.cpp).
  MemoryRequest req;
  req.cache_format = KvFormat::f32;
  req.page_size = 64;
  req.cache_pages = 5;
  req.max_batch_seqs = 1;
  req.max_step_tokens = 512;
  req.max_seq_len = 201;
  ModelDir dir(model);
  GpuSplit even;
  even.n_devices = int(dir.config().num_layers);
  const std::vector<std::optional<DeviceMemory>> none(size_t(even.n_devices));
  const int64_t first = plan_layer_split(dir, req, even, none).devices[0].total_bytes();
  auto r = run(cli_generate, {"--model", model.string(), "--temperature", "0", "--max-tokens", "200", "--gpu-split",
                              exact_gb(first) + ",1"});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  EXPECT_EQ(r.out, test::read_file(test::shared_dir() / "models/stories260K/reference/expected_greedy_200.txt"));
  EXPECT_EQ(run(cli_generate, {"--model", model.string(), "--gpu-split", "auto"}).code, 2);  // auto on the CPU
}

TEST(TensorParallelFlag, GenerateOnTwoCpuRanksMatchesLlama2c) {
  EXL_REQUIRE_SHARED("models/stories260K/reference/expected_greedy_200.txt");
  const std::string model = (test::shared_dir() / "models/stories260K-hf").string();
  auto r = run(cli_generate, {"--model", model, "--temperature", "0", "--max-tokens", "200", "--tensor-parallel", "2"});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  EXPECT_EQ(r.out, test::read_file(test::shared_dir() / "models/stories260K/reference/expected_greedy_200.txt"));
  EXPECT_EQ(run(cli_generate, {"--model", model, "--tensor-parallel", "0"}).code, 2);
  EXPECT_EQ(run(cli_generate, {"--model", model, "--tensor-parallel", "2", "--gpu-split", "1,1"}).code, 2);
  const std::string gqa = (test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw").string();
  r = run(cli_info, {gqa, "--json", "--backend", "cpu", "--tensor-parallel", "2", "--cache-pages", "4"});
  ASSERT_EQ(r.code, 0) << r.err << r.error;
  const auto m = nlohmann::json::parse(r.out)["memory_plan"];
  MemoryRequest req;
  req.cache_format = KvFormat::f32;
  req.cache_pages = 4;
  const MemoryPlan whole = plan_memory(ModelDir(gqa), req, std::nullopt);
  EXPECT_EQ(m["cache_pages"], 4);
  EXPECT_LT(m["weight_bytes"].get<int64_t>(), whole.weight_bytes);  // a rank's share
  EXPECT_EQ(run(cli_info, {gqa, "--tensor-parallel", "2"}).code, 2);  // needs --backend
  r = run(cli_generate, {"--model", model, "--tensor-parallel", "4"});  // 4 kv heads, but hidden 64: 2 blocks
  EXPECT_EQ(r.code, -1);
  EXPECT_NE(r.error.find("engine: tensor parallel: "), std::string::npos) << r.error;
}

std::vector<float> read_floats(const std::filesystem::path& p) {
  const std::string b = test::read_file(p);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), v.size() * 4);
  return v;
}

TEST(GpuSplitFlag, LogitsOverTwoCpuBackendsOrRanksMatchOne) {
  EXL_REQUIRE_SHARED("data/exl2-ref/input_ids.json");
  const auto model = test::shared_dir() / "data/exl2-ref/llama-gqa/exl2-4.0bpw";
  const std::string ids = (test::shared_dir() / "data/exl2-ref/input_ids.json").string();
  const auto one = test::binary_dir() / "cli_gpu_split_one.f32", split = test::binary_dir() / "cli_gpu_split_two.f32",
             tp = test::binary_dir() / "cli_gpu_split_tp.f32";
  // The request `logits` plans: 96 ids, prefill, 2 pages of 64, f32.
  MemoryRequest req;
  req.cache_format = KvFormat::f32;
  req.page_size = 64;
  req.cache_pages = 2;
  req.max_batch_seqs = 1;
  req.max_step_tokens = 96;
  req.max_seq_len = 96;
  GpuSplit three;
  three.n_devices = 3;
  const std::vector<std::optional<DeviceMemory>> none(3);
  const int64_t first = plan_layer_split(ModelDir(model), req, three, none).devices[0].total_bytes();
  const std::vector<std::string> base{"--model", model.string(), "--ids-json", ids, "--out"};
  auto args = [&](const std::filesystem::path& out, std::vector<std::string> extra) {
    std::vector<std::string> a = base;
    a.push_back(out.string());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  for (const auto& [out, extra] : std::vector<std::pair<std::filesystem::path, std::vector<std::string>>>{
           {one, {}}, {split, {"--gpu-split", exact_gb(first) + ",1"}}, {tp, {"--tensor-parallel", "2"}}}) {
    const auto r = run(cli_logits, args(out, extra));
    ASSERT_EQ(r.code, 0) << r.err << r.error;
  }
  const auto want = read_floats(one);
  ASSERT_EQ(want.size(), size_t(96 * 512));
  EXPECT_LT(test::rel_l2(read_floats(split), want), 1e-6);
  const auto got = read_floats(tp);
  ASSERT_EQ(got.size(), want.size());
  EXPECT_LT(test::rel_l2(got, want), 1e-5);
}

TEST(GpuSplitFlag, BenchRunsOverTwoCpuBackendsAndRanks) {
  EXL_REQUIRE_SHARED("models/stories260K-hf/model.safetensors");
  const std::string model = (test::shared_dir() / "models/stories260K-hf").string();
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--gpu-split", "1,1"}, std::vector<std::string>{"--tensor-parallel", "2"}}) {
    std::vector<std::string> args{"--model", model, "--prefill", "16", "--batch", "1,2", "--context", "8",
                                  "--decode-steps", "2", "--repeat", "1", "--prefix-len", "64", "--suffix-len", "8",
                                  "--json"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = run(cli_bench, args);
    ASSERT_EQ(r.code, 0) << extra[0] << ": " << r.err << r.error;
    const auto j = nlohmann::json::parse(r.out);
    EXPECT_EQ(j["decode"].size(), 2u) << extra[0];
    EXPECT_GE(j["prefix_cache"]["warm_cached_tokens"].get<int>(), 64) << extra[0];
  }
}

TEST(GpuSplitFlag, JobCommandsTakeTheFlag) {
  const CommandSpec spec{"x", "", {}, with_job_engine_flags({})};
  const std::vector<std::string> args{"--backend", "cpu", "--gpu-split", "2,3"};
  const ParsedArgs a = parse_args(spec, args);
  EXPECT_EQ(job_engine_options(a, "m", 1).gpu_split, "2,3");
  const std::vector<std::string> tp{"--tensor-parallel", "2"};
  EXPECT_EQ(job_engine_options(parse_args(spec, tp), "m", 1).tensor_parallel, 2);
  EXPECT_NE(spec.help().find("--tensor-parallel"), std::string::npos);
  const std::vector<std::string> bad{"--gpu-split", "2,-3"};
  EXPECT_THROW(job_engine_options(parse_args(spec, bad), "m", 1), UsageError);
  EXPECT_NE(spec.help().find("--gpu-split"), std::string::npos);
}

}  // namespace cli_gpu_split_test
}  // namespace exl
