// The job commands (batch, run, extract) end to end on the tiny stories260K model: its replies
// are meaningless, so these tests check the machinery — durable and resumable batch output
// (including a SIGKILL mid-job), error lines, workflow files, traces and outputs.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "runtime/cli/cli_commands.h"
#include "runtime/batch_job_support.h"
#include "runtime/cli_runner.h"
#include "runtime/job_engine.h"
#include "test_support.h"

namespace exl {
namespace cli_jobs_test {

using ojson = nlohmann::ordered_json;
namespace fs = std::filesystem;

std::vector<ojson> read_jsonl(const fs::path& p) {
  std::vector<ojson> out;
  const std::string s = test::read_file(p);
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t nl = s.find('\n', pos);
    EXPECT_NE(nl, std::string::npos) << "partial last line in " << p;
    if (nl == std::string::npos) break;
    out.push_back(ojson::parse(s.substr(pos, nl - pos)));
    pos = nl + 1;
  }
  return out;
}

TEST(CliBatch, SimpleFormErrorLinesAndResume) {
  EXL_REQUIRE_SHARED(test::k_job_model);
  const auto dir = test::temp_dir("CliBatch_simple");
  std::string in = test::batch_simple_lines(5, 8);
  in += "{broken\n\n";
  in += R"({"id":"r1","prompt":"again"})" "\n";
  in += R"({"custom_id":"o1","method":"POST","url":"/v1/chat/completions","body":{"messages":[{"role":"user","content":"Hi"}],"max_tokens":5}})" "\n";
  in += R"({"id":"bad-schema","prompt":"x","schema":{"type":"nonsense"}})" "\n";
  test::write_file(dir / "in.jsonl", in);
  const std::vector<std::string> args = {"--model", test::job_model_dir(), "--input", (dir / "in.jsonl").string(),
                                         "--output", (dir / "out.jsonl").string(), "--concurrency", "3", "--threads", "1"};
  auto r = test::run_cli(cli_batch, args);
  ASSERT_EQ(r.code, 0) << r.error << r.err;
  EXPECT_NE(r.err.find("batch: 9 requests: 6 ok, 3 errors, 0 already done"), std::string::npos) << r.err;
  const auto lines = read_jsonl(dir / "out.jsonl");
  ASSERT_EQ(lines.size(), 9u);
  std::map<std::string, ojson> by_key;
  for (const auto& l : lines) {
    std::string key = l.contains("line") ? "#" + l["line"].dump() : (l.contains("custom_id") ? l["custom_id"] : l["id"]).get<std::string>();
    EXPECT_TRUE(by_key.emplace(key, l).second) << "twice: " << key;
  }
  for (int i = 0; i < 5; ++i) {
    const auto& l = by_key.at("r" + std::to_string(i));
    EXPECT_TRUE(l["output"].is_string()) << l;
    EXPECT_LE(l["usage"]["completion_tokens"].get<int>(), 8);
  }
  EXPECT_EQ(by_key.at("#6")["error"]["code"], "invalid_json_line");
  EXPECT_EQ(by_key.at("#8")["error"]["code"], "duplicate_id");
  EXPECT_EQ(by_key.at("o1")["response"]["status_code"], 200);
  EXPECT_EQ(by_key.at("o1")["response"]["body"]["object"], "chat.completion");
  EXPECT_NE(by_key.at("bad-schema")["error"]["message"].get<std::string>().find("unknown type"), std::string::npos);

  r = test::run_cli(cli_batch, args);
  ASSERT_EQ(r.code, 0) << r.error;
  EXPECT_NE(r.err.find("0 ok, 0 errors, 9 already done"), std::string::npos) << r.err;
  EXPECT_EQ(read_jsonl(dir / "out.jsonl").size(), 9u);
}

// Three replicas (--shard 0/3, 1/3, 2/3) of a 300-line job write every id exactly once, each line
// as the unsharded job writes it; an id repeated across shards is a duplicate in the later one.
TEST(CliBatch, ShardsTogetherWriteTheUnshardedResult) {
  EXL_REQUIRE_SHARED(test::k_job_model);
  const auto dir = test::temp_dir("CliBatch_shards");
  std::string in = test::batch_simple_lines(299, 3);
  in += R"({"id":"r7","prompt":"the same id as an early line"})" "\n";
  test::write_file(dir / "in.jsonl", in);
  auto run = [&](const fs::path& out, const std::string& shard) {
    std::vector<std::string> args = {"--model", test::job_model_dir(), "--input", (dir / "in.jsonl").string(), "--output",
                                     out.string(), "--concurrency", "16", "--threads", "1", "--quiet"};
    if (!shard.empty()) args.insert(args.end(), {"--shard", shard});
    return test::run_cli(cli_batch, args);
  };
  auto whole = run(dir / "whole.jsonl", "");
  ASSERT_EQ(whole.code, 0) << whole.error << whole.err;
  std::map<std::string, std::string> expected;
  for (const auto& l : read_jsonl(dir / "whole.jsonl")) {
    const std::string key = l.contains("line") ? "#" + l["line"].dump() : l["id"].get<std::string>();
    expected[key] = l.dump();
  }
  ASSERT_EQ(expected.size(), 300u);
  std::map<std::string, std::string> got;
  for (int i = 0; i < 3; ++i) {
    const auto out = dir / ("shard" + std::to_string(i) + ".jsonl");
    auto r = run(out, std::to_string(i) + "/3");
    ASSERT_EQ(r.code, 0) << r.error << r.err;
    EXPECT_NE(r.err.find("batch: 100 requests"), std::string::npos) << r.err;
    for (const auto& l : read_jsonl(out)) {
      const std::string key = l.contains("line") ? "#" + l["line"].dump() : l["id"].get<std::string>();
      EXPECT_TRUE(got.emplace(key, l.dump()).second) << "written twice: " << key;
    }
  }
  EXPECT_EQ(got, expected);
  EXPECT_NE(got.at("#300").find("duplicate_id"), std::string::npos) << got.at("#300");
  for (const char* bad : {"3/3", "1/0", "x", "1/", "-1/3", "1/3/4"}) {
    auto r = run(dir / "bad.jsonl", bad);
    EXPECT_EQ(r.code, 2) << bad;
    EXPECT_NE((r.err + r.error).find("--shard must be I/N"), std::string::npos) << bad << ": " << r.err;
  }
}

TEST(CliBatch, SurvivesSigkillAndResumesEveryIdExactlyOnce) {
  EXL_REQUIRE_SHARED(test::k_job_model);
  const fs::path bin = test::binary_dir() / "exlagent";
  if (!fs::exists(bin)) GTEST_SKIP() << "the exlagent binary is not built: " << bin;
  const auto dir = test::temp_dir("CliBatch_sigkill");
  const int n = 120;
  test::write_file(dir / "in.jsonl", test::batch_simple_lines(n, 32));
  const std::string out = (dir / "out.jsonl").string();
  const std::vector<std::string> args = {"batch", "--model", test::job_model_dir(), "--input", (dir / "in.jsonl").string(),
                                         "--output", out, "--concurrency", "4", "--threads", "1", "--quiet"};
  const pid_t pid = test::spawn_quiet(bin, args);
  ASSERT_GE(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (test::count_file_lines(out) < 5 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the batch finished before it could be killed (exit " << WEXITSTATUS(status) << ")";
  const size_t at_kill = test::count_file_lines(out);
  ASSERT_GE(at_kill, 5u);
  ASSERT_LT(at_kill, size_t(n)) << "nothing left to resume";

  auto r = test::run_cli(cli_batch, {args.begin() + 1, args.end()});
  ASSERT_EQ(r.code, 0) << r.error << r.err;
  EXPECT_NE(r.err.find(std::to_string(at_kill) + " already done"), std::string::npos) << r.err;
  const auto lines = read_jsonl(out);
  ASSERT_EQ(lines.size(), size_t(n));
  std::map<std::string, int> count;
  for (const auto& l : lines) {
    EXPECT_TRUE(l["output"].is_string()) << l;
    ++count[l["id"].get<std::string>()];
  }
  ASSERT_EQ(count.size(), size_t(n));
  for (const auto& [id, c] : count) EXPECT_EQ(c, 1) << id;
}

TEST(CliRun, WorkflowWritesStepOutputsAndTrace) {
  EXL_REQUIRE_SHARED(test::k_job_model);
  const auto dir = test::temp_dir("CliRun_workflow");
  test::write_file(dir / "wf.json", R"J({"name":"t","inputs":{"names":["Ann","Bo","Cy"],"mode":"short"},
    "defaults":{"max_tokens":6},
    "steps":[
      {"name":"intro","system":"You tell stories.","prompt":"A story about {{inputs.names.0}}."},
      {"name":"each","prompt":"Item {{index}}: {{item}} ({{steps.intro}})","for_each":"inputs.names"},
      {"name":"more","prompt":"Go on.","continue":"intro","if":{"path":"inputs.mode","equals":"short"}},
      {"name":"never","prompt":"x","if":"steps.intro.missing"}]})J");
  const fs::path out = dir / "out";
  auto r = test::run_cli(cli_run, {(dir / "wf.json").string(), "--model", test::job_model_dir(), "--out", out.string(), "--threads", "1"});
  ASSERT_EQ(r.code, 0) << r.error << r.err;
  const auto outputs = ojson::parse(test::read_file(out / "outputs.json"));
  EXPECT_EQ(ojson::parse(r.out), outputs);
  EXPECT_TRUE(outputs["intro"].is_string());
  ASSERT_TRUE(outputs["each"].is_array());
  EXPECT_EQ(outputs["each"].size(), 3u);
  EXPECT_TRUE(outputs["more"].is_string());
  EXPECT_TRUE(outputs["never"].is_null());
  EXPECT_EQ(ojson::parse(test::read_file(out / "steps" / "each.json")), outputs["each"]);
  EXPECT_FALSE(fs::exists(out / "steps" / "never.json"));

  const auto trace = read_jsonl(out / "trace.jsonl");
  ASSERT_EQ(trace.size(), 6u);  // intro, 3 x each, more, never (skipped)
  EXPECT_EQ(trace[0]["messages"][0]["content"], "You tell stories.");
  EXPECT_EQ(trace[0]["messages"][1]["content"], "A story about Ann.");
  EXPECT_EQ(trace[2]["index"], 1);
  EXPECT_EQ(trace[2]["messages"][0]["content"], "Item 1: Bo (" + outputs["intro"].get<std::string>() + ")");
  // The continued conversation: intro's turns, its reply, the new prompt (a prefix-cache hit) and
  // this step's reply.
  const auto& more = trace[4]["messages"];
  ASSERT_EQ(more.size(), 5u);
  EXPECT_EQ(more[2]["role"], "assistant");
  EXPECT_EQ(more[2]["content"], outputs["intro"]);
  EXPECT_EQ(more[3]["content"], "Go on.");
  EXPECT_EQ(more[4]["content"], outputs["more"]);
  EXPECT_GT(trace[4]["cached_tokens"].get<int>(), 0);
  EXPECT_EQ(trace[5]["skipped"], true);
}

TEST(CliRun, BadToolsAndInvalidFilesAreClearErrors) {
  EXL_REQUIRE_SHARED(test::k_job_model);
  const auto dir = test::temp_dir("CliRun_errors");
  test::write_file(dir / "tools.json", R"({"steps":[{"name":"a","prompt":"p","tools":[{"type":"function"}]}]})");
  auto r = test::run_cli(cli_run, {(dir / "tools.json").string(), "--model", test::job_model_dir()});
  EXPECT_EQ(r.code, -1);
  EXPECT_NE(r.error.find("/steps/0/tools/0"), std::string::npos) << r.error;
  test::write_file(dir / "unknown.json", R"({"steps":[{"name":"a","prompt":"p","tools":["calculator","nope"]}]})");
  r = test::run_cli(cli_run, {(dir / "unknown.json").string(), "--model", test::job_model_dir()});
  EXPECT_NE(r.error.find("runtime: run: step 'a': no tool 'nope' (built-ins: calculator"), std::string::npos) << r.error;
  const std::string fake_mcp = "fake=python3 " + std::string(EXL_SOURCE_DIR) + "/tests/tools/fake_mcp_server.py";
  r = test::run_cli(cli_run, {(dir / "unknown.json").string(), "--model", test::job_model_dir(), "--mcp", fake_mcp});
  EXPECT_NE(r.error.find("no tool 'nope'"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("MCP tools are NAME__tool"), std::string::npos) << r.error;
  r = test::run_cli(cli_run, {(dir / "unknown.json").string(), "--model", test::job_model_dir(), "--mcp", "nope"});
  EXPECT_EQ(r.code, 2) << r.error;
  EXPECT_NE(r.err.find("--mcp wants NAME=COMMAND ARGS... or NAME=URL, got 'nope'"), std::string::npos) << r.err;
  test::write_file(dir / "mcp.json", R"({"mcp":{"fake":"python3 )" + std::string(EXL_SOURCE_DIR) +
                                         R"(/tests/tools/fake_mcp_server.py"},"steps":[{"name":"a","prompt":"p","tools":["fake__nope"]}]})");
  r = test::run_cli(cli_run, {(dir / "mcp.json").string(), "--model", test::job_model_dir()});
  EXPECT_NE(r.error.find("no tool 'fake__nope'"), std::string::npos) << r.error;
  r = test::run_cli(cli_run, {(dir / "mcp.json").string(), "--model", test::job_model_dir(), "--mcp", fake_mcp});
  EXPECT_EQ(r.code, 2) << r.error;
  EXPECT_NE(r.err.find("--mcp fake: the workflow's \"mcp\" already names a server 'fake'"), std::string::npos) << r.err;
  test::write_file(dir / "read.json", R"({"steps":[{"name":"a","prompt":"p","tools":["read_file"]}]})");
  r = test::run_cli(cli_run, {(dir / "read.json").string(), "--model", test::job_model_dir()});
  EXPECT_NE(r.error.find("read_file needs --read-root"), std::string::npos) << r.error;
  test::write_file(dir / "bad.json", R"({"steps":[{"name":"a","promt":"p"}]})");
  r = test::run_cli(cli_run, {(dir / "bad.json").string(), "--model", test::job_model_dir()});
  EXPECT_NE(r.error.find("/steps/0: missing required property 'prompt'"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("/steps/0: unknown property 'promt'"), std::string::npos) << r.error;
  r = test::run_cli(cli_run, {(dir / "bad.json").string()});
  EXPECT_EQ(r.code, -1);
}

// A step with tools runs the agent loop on the demo model (unscripted: it answers without calling
// the calculator, which it never saw in training; tests/runtime/workflow_agent_test.cpp scripts
// the calls): the final answer is schema-valid, the conversation is in the trace and its
// transcript under OUT/agents.
TEST(CliRun, StepWithToolsRunsTheAgentLoop) {
  const fs::path demo = test::source_dir() / "examples" / "demo-model" / "model";
  if (!fs::exists(demo / "config.json")) GTEST_SKIP() << "examples/demo-model/model is absent";
  const auto dir = test::temp_dir("CliRun_tools");
  test::write_file(dir / "wf.json", R"J({"inputs":{"items":["3 * 120.50","2 + 2"]},"steps":[
    {"name":"sum","tools":["calculator","current_time"],"max_turns":2,"for_each":"inputs.items",
     "system":"You are a helpful assistant.","prompt":"What is {{item}}?",
     "schema":{"type":"object","properties":{"total":{"type":"number"}},"required":["total"],"additionalProperties":false}}]})J");
  const fs::path out = dir / "out";
  auto r = test::run_cli(cli_run, {(dir / "wf.json").string(), "--model", demo.string(), "--out", out.string(), "--threads", "1"});
  ASSERT_EQ(r.code, 0) << r.error << r.err;
  const auto outputs = ojson::parse(test::read_file(out / "outputs.json"));
  ASSERT_EQ(outputs["sum"].size(), 2u) << outputs;
  for (const auto& o : outputs["sum"]) {
    ASSERT_TRUE(o.is_object() && o.size() == 1 && o["total"].is_number()) << o;
  }
  const auto trace = read_jsonl(out / "trace.jsonl");
  ASSERT_EQ(trace.size(), 2u);
  for (const auto& t : trace) {
    EXPECT_GE(t["turns"].get<int>(), 1) << t;
    EXPECT_EQ(t["messages"].back()["role"], "assistant") << t;
    EXPECT_EQ(ojson::parse(t["messages"].back()["content"].get<std::string>()), t["output"]) << t;
  }
  EXPECT_TRUE(fs::exists(out / "agents" / "sum-0.json"));
  EXPECT_TRUE(fs::exists(out / "agents" / "sum-1.json"));
}

// A workflow file's "mcp" servers are started and their tools offered to its steps: the demo model
// calls the fake server's only tool of this step by itself (the grammar allows an answer as well).
TEST(CliRun, WorkflowMcpServersOfferTheirTools) {
  const fs::path demo = test::source_dir() / "examples" / "demo-model" / "model";
  if (!fs::exists(demo / "config.json")) GTEST_SKIP() << "examples/demo-model/model is absent";
  const auto dir = test::temp_dir("CliRun_mcp");
  test::write_file(dir / "wf.json", R"J({"mcp":{"fake":"python3 )J" + std::string(EXL_SOURCE_DIR) + R"J(/tests/tools/fake_mcp_server.py"},
    "steps":[{"name":"sum","tools":["fake__add"],"max_turns":2,"system":"You are a helpful assistant.",
              "prompt":"What is 2 plus 3?"}]})J");
  const fs::path out = dir / "out";
  auto r = test::run_cli(cli_run, {(dir / "wf.json").string(), "--model", demo.string(), "--out", out.string(), "--threads", "1"});
  ASSERT_EQ(r.code, 0) << r.error << r.err;
  const auto trace = read_jsonl(out / "trace.jsonl");
  ASSERT_EQ(trace.size(), 1u);
  std::vector<ojson> tool_messages;
  for (const auto& m : trace[0]["messages"])
    if (m["role"] == "tool") tool_messages.push_back(m);
  ASSERT_FALSE(tool_messages.empty()) << trace[0];
  EXPECT_TRUE(tool_messages[0]["content"].get<std::string>().find_first_not_of("0123456789-") == std::string::npos)
      << "the fake server's sum: " << tool_messages[0];
}

// On the demo model (stories260K's replies under a flexible-whitespace grammar are mostly newlines).
TEST(CliExtract, PrintsOneValidObjectPerInputInOrder) {
  const fs::path demo = test::source_dir() / "examples" / "demo-model" / "model";
  if (!fs::exists(demo / "config.json")) GTEST_SKIP() << "examples/demo-model/model is absent";
  const auto dir = test::temp_dir("CliExtract_valid");
  test::write_file(dir / "schema.json", R"({"type":"object","properties":{"name":{"type":"string"},
    "age":{"type":"integer"},"city":{"type":"string"}},"required":["name","age","city"]})");
  test::write_file(dir / "a.txt", "Keiko Tanaka is a 29-year-old chef. Home for Keiko is Osaka.\n");
  test::write_file(dir / "b.txt", "Meet Victor Dahl, a pilot who is 51 years old. Victor moved to Oslo some years ago.");
  auto r = test::run_cli(cli_extract, {"--model", demo.string(), "--schema", (dir / "schema.json").string(),
                                       (dir / "a.txt").string(), (dir / "b.txt").string()});
  ASSERT_EQ(r.code, 0) << r.error << r.err;
  std::istringstream lines(r.out);
  std::vector<ojson> got;
  for (std::string line; std::getline(lines, line);) got.push_back(ojson::parse(line));
  ASSERT_EQ(got.size(), 2u) << r.out;
  for (const auto& j : got) {
    ASSERT_TRUE(j.is_object());
    EXPECT_TRUE(j["name"].is_string());
    EXPECT_TRUE(j["age"].is_number_integer());
    EXPECT_TRUE(j["city"].is_string());
  }
  // The demo model reads these right (it scores ~97% field exact match on its held-out set).
  EXPECT_EQ(got[0]["name"], "Keiko Tanaka");
  EXPECT_EQ(got[1]["age"], 51);
  // Speculation changes how many forward passes, never the output; the demo model drafting for
  // itself is the draft-model path.
  for (const char* mode : {"none", "ngram", "draft"}) {
    std::vector<std::string> args{"--model", demo.string(), "--schema", (dir / "schema.json").string(), "--speculate", mode};
    if (std::string(mode) == "draft") args.insert(args.end(), {"--draft-model", demo.string()});
    args.insert(args.end(), {(dir / "a.txt").string(), (dir / "b.txt").string()});
    auto s = test::run_cli(cli_extract, args);
    ASSERT_EQ(s.code, 0) << s.error << s.err;
    EXPECT_EQ(s.out, r.out) << mode;
  }
  auto bad = test::run_cli(cli_extract, {"--model", demo.string(), "--schema", (dir / "schema.json").string(),
                                         "--speculate", "medusa", (dir / "a.txt").string()});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE((bad.err + bad.error).find("--speculate must be none, ngram, draft or auto, not 'medusa'"), std::string::npos)
      << bad.err;
  auto no_draft = test::run_cli(cli_extract, {"--model", demo.string(), "--schema", (dir / "schema.json").string(),
                                              "--speculate", "draft", (dir / "a.txt").string()});
  EXPECT_EQ(no_draft.code, 2);
  EXPECT_NE((no_draft.err + no_draft.error).find("--speculate draft needs --draft-model"), std::string::npos) << no_draft.err;
  auto wrong_vocab = test::run_cli(cli_extract, {"--model", demo.string(), "--schema", (dir / "schema.json").string(),
                                                 "--draft-model", (test::shared_dir() / "models/stories260K-hf").string(),
                                                 (dir / "a.txt").string()});
  EXPECT_NE(wrong_vocab.code, 0);
  EXPECT_NE((wrong_vocab.err + wrong_vocab.error).find("same tokenizer"), std::string::npos) << wrong_vocab.err;
}

TEST(CliExtract, BadSchemaAndInputsAreClearErrors) {
  EXL_REQUIRE_SHARED(test::k_job_model);
  const auto dir = test::temp_dir("CliExtract_errors");
  test::write_file(dir / "bad.json", R"({"type":"nonsense"})");
  test::write_file(dir / "a.txt", "x");
  auto r = test::run_cli(cli_extract, {"--model", test::job_model_dir(), "--schema", (dir / "bad.json").string(), (dir / "a.txt").string()});
  EXPECT_EQ(r.code, -1);
  EXPECT_NE(r.error.find("runtime: extract: '" + (dir / "bad.json").string() + "': runtime: job: schema:"), std::string::npos)
      << r.error;
  r = test::run_cli(cli_extract, {"--model", test::job_model_dir(), "--schema", (dir / "bad.json").string(), (dir / "nope.txt").string()});
  EXPECT_NE(r.error.find("cannot read input"), std::string::npos) << r.error;
  r = test::run_cli(cli_extract, {"--model", test::job_model_dir(), "--schema", (dir / "bad.json").string()});
  EXPECT_EQ(r.code, 2);
}

}  // namespace cli_jobs_test
}  // namespace exl
