// The converter's calibration sources and its resumability: calibration rows from text and JSONL
// files (BOS, row count, lengths, malformed files) and from the model itself (deterministic per
// seed), and a conversion interrupted (by an exception, or killed with SIGKILL) after its first
// layer that, run again, reuses the calibration, the measurement and the finished layer, and
// writes the same files as an uninterrupted run.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <csignal>
#include <map>

#include <sys/wait.h>
#include <unistd.h>

#include "engine/formats/model_dir.h"
#include "engine/quantize/calib_model.h"
#include "engine/quantize/calibration.h"
#include "engine/quantize/quantize_model.h"
#include "engine/rope.h"
#include "engine/tokenizer/tokenizer.h"
#include "kernels/error.h"
#include "test_support.h"

namespace exl {
namespace quantize_resume_test {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

RopeTable rope_of(const ModelConfig& c) { return make_rope_table(c.rope, int(c.head_dim), c.max_position_embeddings); }

// The CPU, two threads and the test's rope table; `cal_rows` (0: the default) rows of `cal_length` calibration tokens.
QuantizeOptions job_options(int64_t cal_rows, int64_t cal_length) {
  QuantizeOptions o;
  o.threads = 2;
  o.rope_table = rope_of;
  o.cal_rows = cal_rows;
  o.cal_length = cal_length;
  o.backend = "cpu";
  return o;
}

struct StopJob {};
// A progress callback that throws StopJob (an interruption that unwinds) once `stage` has done 1.
QuantizeProgress stop_after_first(std::string stage) {
  return [stage = std::move(stage)](std::string_view s, size_t done, size_t) {
    if (s == stage && done == 1) throw StopJob{};
  };
}

TEST(QuantizeCalibration, TextAndJsonlFilesBecomeRowsOfTokens) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf/config.json");
  const auto hf = test::shared_dir() / "data/exl2-ref/qwen2-bias/hf";
  const auto tok = load_tokenizer(hf);
  const auto tmp = test::temp_dir("quantize-calibration");
  std::string text;
  for (int i = 0; i < 40; ++i) text += cat("Once upon a time there was a little dog number ", i, " who liked the sun.\n");
  test::write_file(tmp / "cal.txt", text);
  const CalibrationSet t = calibration_from_file(tmp / "cal.txt", *tok, 3, 32);
  ASSERT_EQ(t.rows.size(), 3u);
  const auto ids = tok->encode(text, false);
  for (size_t r = 0; r < 3; ++r) {
    ASSERT_EQ(t.rows[r].size(), 32u);
    if (tok->add_bos()) {
      EXPECT_EQ(t.rows[r][0], *tok->bos_id());
    }
  }
  const size_t body = tok->add_bos() ? 31 : 32;
  EXPECT_EQ(t.rows[1].back(), ids[2 * body - 1]);
  EXPECT_THAT(t.source, HasSubstr("(text): 3 x 32"));

  nlohmann::json a = {{"text", text.substr(0, text.size() / 2)}}, b = {{"text", text.substr(text.size() / 2)}, {"id", 2}};
  test::write_file(tmp / "cal.jsonl", a.dump() + "\n\n" + b.dump() + "\n");
  const CalibrationSet j = calibration_from_file(tmp / "cal.jsonl", *tok, 100, 32);
  EXPECT_GE(j.rows.size(), 10u);
  EXPECT_LT(j.rows.size(), 100u);  // as many full rows as the text holds
  EXPECT_THAT(j.source, HasSubstr("(JSONL)"));

  test::write_file(tmp / "bad.jsonl", a.dump() + "\n{\"txt\": \"x\"}\n");
  EXPECT_THAT([&] { calibration_from_file(tmp / "bad.jsonl", *tok, 2, 32); },
              ::testing::ThrowsMessage<Error>(HasSubstr("line 2 has no string \"text\"")));
  test::write_file(tmp / "short.txt", "tiny");
  EXPECT_THAT([&] { calibration_from_file(tmp / "short.txt", *tok, 2, 32); },
              ::testing::ThrowsMessage<Error>(HasSubstr("fewer than one row of 32")));
  EXPECT_THAT([&] { calibration_from_file(tmp / "absent.txt", *tok, 2, 32); },
              ::testing::ThrowsMessage<Error>(HasSubstr("cannot read")));
}

TEST(QuantizeCalibration, SelfGeneratedRowsAreSeededSamplesOfTheModel) {
  EXL_REQUIRE_SHARED("data/exl2-ref/llama3-rope/hf/config.json");
  const ModelDir dir(test::shared_dir() / "data/exl2-ref/llama3-rope/hf");
  auto be = make_cpu_backend(2);
  const CalibModel cm(dir, *be, rope_of(dir.config()));
  const CalibrationSet a = self_generated_calibration(cm, 3, 40, 7, 1), b = self_generated_calibration(cm, 3, 40, 7, 1),
                       c = self_generated_calibration(cm, 3, 40, 8, 1);
  ASSERT_EQ(a.rows.size(), 3u);
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_NE(a.rows, c.rows);
  std::set<int32_t> distinct;
  for (const auto& r : a.rows) {
    ASSERT_EQ(r.size(), 40u);
    EXPECT_EQ(r[0], 1);
    for (int32_t id : r) EXPECT_TRUE(id >= 0 && id < 512);
    distinct.insert(r.begin(), r.end());
  }
  EXPECT_GT(distinct.size(), 20u);  // sampled, not a greedy loop
  EXPECT_THAT(a.source, HasSubstr("self-generated"));
}

// Interrupted by the progress callback after the first layer of the quantize pass, the job leaves
// its partial directory; run again, it does not calibrate or measure anew, starts at layer 2, and
// its files equal an uninterrupted run's.
TEST(QuantizeModel, InterruptedJobResumesWithoutRedoingFinishedLayers) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf/config.json");
  const auto hf = test::shared_dir() / "data/exl2-ref/qwen2-bias/hf";
  const auto tmp = test::temp_dir("quantize-resume");
  QuantizeOptions o = job_options(2, 64);
  EXPECT_THROW(quantize_model(hf, tmp / "a", o, stop_after_first("quantize")), StopJob);
  EXPECT_FALSE(fs::exists(tmp / "a"));
  EXPECT_TRUE(fs::exists(tmp / ".a.partial" / "layer_0.safetensors"));
  EXPECT_FALSE(fs::exists(tmp / ".a.partial" / "layer_1.safetensors"));
  EXPECT_TRUE(fs::exists(tmp / ".a.partial" / "hidden_0.safetensors"));

  std::map<std::string, std::vector<size_t>> seen;
  const QuantizeReport r = quantize_model(hf, tmp / "a", o, [&](std::string_view stage, size_t done, size_t) {
    seen[std::string(stage)].push_back(done);
  });
  EXPECT_EQ(r.resumed_layers, 1);
  EXPECT_EQ(seen.count("measure"), 0u);
  EXPECT_EQ(seen["quantize"], (std::vector<size_t>{2, 3}));
  EXPECT_FALSE(fs::exists(tmp / ".a.partial"));
  ASSERT_EQ(r.blocks.size(), 4u);  // both layers' blocks reported, the resumed one's from the job state
  EXPECT_EQ(r.layers.size(), 2u * 7u + 1u);

  const QuantizeReport full = quantize_model(hf, tmp / "b", o);
  EXPECT_EQ(full.resumed_layers, 0);
  EXPECT_EQ(test::read_file(tmp / "a" / "output.safetensors"), test::read_file(tmp / "b" / "output.safetensors"));
  EXPECT_EQ(test::read_file(tmp / "a" / "config.json"), test::read_file(tmp / "b" / "config.json"));

  // A partial directory of another job (other options) is replaced, not resumed.
  o.measurement = tmp / "a" / "measurement.json";
  EXPECT_THROW(quantize_model(hf, tmp / "c", o, stop_after_first("quantize")), StopJob);
  o.bpw = 5.0;
  const QuantizeReport other = quantize_model(hf, tmp / "c", o);
  EXPECT_EQ(other.resumed_layers, 0);
}

// Without --cal-rows the rows scale with the widest linear input (qwen2-bias: 768, the MLP's
// down_proj): max(32, 8 · 768 / length) rows, read from the job's saved calibration.
TEST(QuantizeModel, DefaultCalibrationRowsScaleWithTheWidestInput) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf/config.json");
  const auto hf = test::shared_dir() / "data/exl2-ref/qwen2-bias/hf";
  const auto tmp = test::temp_dir("quantize-cal-rows");
  for (auto [length, rows] : {std::pair<int64_t, size_t>{64, 96}, {256, 32}}) {
    const auto out = tmp / cat("q", length);
    EXPECT_THROW(quantize_model(hf, out, job_options(0, length), stop_after_first("calibrate")), StopJob);
    const auto cal = read_json_file(tmp / cat(".q", length, ".partial") / "calibration.json");
    EXPECT_EQ(cal["rows"].size(), rows) << length;
    EXPECT_EQ(cal["rows"][0].size(), size_t(length));
  }
}

// Killed for real (SIGKILL from inside a forked child, right after its first layer was recorded:
// no unwinding, no destructors), the job resumes from what the child left on disk.
TEST(QuantizeModel, KilledJobResumesFromItsPartialDirectory) {
  EXL_REQUIRE_SHARED("data/exl2-ref/qwen2-bias/hf/config.json");
  const auto hf = test::shared_dir() / "data/exl2-ref/qwen2-bias/hf";
  const auto tmp = test::temp_dir("quantize-killed");
  const QuantizeOptions o = job_options(2, 64);
  std::fflush(nullptr);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    try {
      quantize_model(hf, tmp / "q", o, [](std::string_view stage, size_t done, size_t) {
        if (stage == "quantize" && done == 1) std::raise(SIGKILL);
      });
    } catch (...) {
    }
    _exit(3);  // not reached unless the job failed before its first layer
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "child status " << status;
  EXPECT_FALSE(fs::exists(tmp / "q"));
  EXPECT_TRUE(fs::exists(tmp / ".q.partial" / "layer_0.safetensors"));

  std::vector<size_t> quantized;
  bool measured = false;
  const QuantizeReport r = quantize_model(hf, tmp / "q", o, [&](std::string_view stage, size_t done, size_t) {
    if (stage == "quantize") quantized.push_back(done);
    measured = measured || stage == "measure";
  });
  EXPECT_EQ(r.resumed_layers, 1);
  EXPECT_FALSE(measured);
  EXPECT_EQ(quantized, (std::vector<size_t>{2, 3}));
  EXPECT_TRUE(ModelDir(tmp / "q").has("model.layers.1.mlp.down_proj.q_weight"));
}

}  // namespace quantize_resume_test
}  // namespace exl
