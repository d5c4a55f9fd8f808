#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <optional>
#include <set>

#include "runtime/openai/batch_request.h"
#include "runtime/cli/cli_args.h"
#include "runtime/cli/cli_commands.h"
#include "runtime/job_engine.h"
#include "sessions/batch_line_writer.h"
#include "sessions/batch_output.h"

namespace exl {

namespace {

using ojson = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

constexpr int kBatchExitOutputBusy = 3;

const CommandSpec& batch_spec() {
  static const CommandSpec s{
      "batch",
      "Run every request of a JSONL file and append one result line per request to the output.\n"
      "Input lines are OpenAI batch requests ({custom_id, method, url: /v1/chat/completions, body})\n"
      "or the simple form ({id, prompt | messages, schema?, system?, max_tokens?, temperature?});\n"
      "results use OpenAI's batch output format or the simple one ({id, output, finish_reason,\n"
      "usage} / {id, error}). Each result is written whole and synced, so the job can be killed\n"
      "at any time and re-run: ids already in the output are skipped. A bad line becomes an error\n"
      "line. Progress goes to stderr, then a summary.\n"
      "The output is locked (flock) while the job runs: a second job on it exits 3 at once. A\n"
      "partial last line (a job killed mid-write) is removed on resume and named on stderr. When a\n"
      "write fails (a full disk: ENOSPC; EIO) the job stops at once and exits 1 naming the error;\n"
      "the output keeps every complete line, and running the job again resumes it.\n"
      "With --shard I/N the job runs only the I-th of N contiguous blocks of the input's non-blank\n"
      "lines (0 <= I < N): N replicas (a Kubernetes indexed Job, a Slurm job array; see\n"
      "examples/batch-shards) together write every result exactly once, each line as the unsharded\n"
      "job writes it (duplicate ids are judged against the whole input).\n"
      "Exit codes: 0 done (error lines included), 1 an error, 2 bad flags, 3 output in use.",
      {},
      with_job_engine_flags(
          {{"--model", "DIR", "model directory", true},
           {"--input", "FILE", "JSONL requests", true},
           {"--output", "FILE", "JSONL results (appended; resumed when it exists)", true},
           {"--schema", "FILE", "JSON Schema for requests that ask for no format"},
           {"--concurrency", "N", "requests generated at once (default 16)"}},
          {{"--shard", "I/N", "run only share I of N of the input (0-based; default 0/1: all of it)"},
           {"--quiet", "", "no progress lines (the summary is still printed)"}})};
  return s;
}

std::vector<std::pair<size_t, std::string>> read_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXL_CHECK(in, "runtime: batch: cannot read input '", path, "'");
  std::vector<std::pair<size_t, std::string>> lines;
  std::string line;
  for (size_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") != std::string::npos) lines.emplace_back(n, std::move(line));
  }
  return lines;
}

// The form most lines use, for lines too broken to tell.
BatchForm guess_form(const std::vector<std::pair<size_t, std::string>>& lines) {
  for (const auto& [n, text] : lines) {
    try {
      const auto j = ojson::parse(text);
      if (j.is_object()) return j.contains("custom_id") || j.contains("body") ? BatchForm::openai : BatchForm::simple;
    } catch (const nlohmann::json::exception&) {
    }
  }
  return BatchForm::simple;
}

// --shard I/N: the share [begin, end) of `n_lines` lines.
std::pair<size_t, size_t> shard_range(const ParsedArgs& a, size_t n_lines) {
  if (!a.has("--shard")) return {0, n_lines};
  const std::string v = *a.get("--shard");
  const size_t slash = v.find('/');
  size_t i = 0, n = 0;
  const auto digits = [](std::string_view s) {
    return !s.empty() && s.size() <= 9 && s.find_first_not_of("0123456789") == std::string_view::npos;
  };
  if (slash != std::string::npos && digits(std::string_view(v).substr(0, slash)) &&
      digits(std::string_view(v).substr(slash + 1))) {
    i = std::stoul(v.substr(0, slash));
    n = std::stoul(v.substr(slash + 1));
  }
  if (n == 0 || i >= n)
    throw UsageError(cat("--shard must be I/N with 0 <= I < N (e.g. 0/3, 1/3, 2/3), not '", v, "'"));
  return {i * n_lines / n, (i + 1) * n_lines / n};
}

struct Progress {
  size_t total = 0, resumed = 0, done = 0, ok = 0, errors = 0;
  int64_t tokens = 0, passes = 0, drafted = 0, accepted = 0;
  Clock::time_point start = Clock::now(), last;
  bool quiet = false;
  bool tty = isatty(STDERR_FILENO);

  double elapsed() const { return std::chrono::duration<double>(Clock::now() - start).count(); }
  void show(bool force) {
    if (quiet) return;
    const auto now = Clock::now();
    if (!force && now - last < std::chrono::milliseconds(tty ? 200 : 2000)) return;
    last = now;
    const double t = elapsed();
    const size_t left = total - resumed - done;
    const double eta = done > 0 ? t / double(done) * double(left) : 0;
    char buf[256];
    std::snprintf(buf, sizeof buf, "batch: %zu/%zu done (%zu errors), %.1f tokens/s, ETA %.0f s",
                  resumed + done, total, errors, t > 0 ? double(tokens) / t : 0.0, eta);
    std::cerr << (tty ? "\r" : "") << buf << (tty ? "\x1b[K" : "\n") << std::flush;
  }
};

}  // namespace

int cli_batch(std::span<const std::string> args) {
  return run_command(batch_spec(), args, [](const ParsedArgs& a) {
    const long long conc = a.get_int("--concurrency", 16);
    if (conc <= 0) throw UsageError("--concurrency must be positive");
    const std::optional<ojson> default_schema =
        a.has("--schema") ? std::optional<ojson>(read_schema_file(*a.get("--schema"), "batch")) : std::nullopt;
    const auto lines = read_lines(*a.get("--input"));
    const BatchForm fallback = guess_form(lines);
    const auto [shard_begin, shard_end] = shard_range(a, lines.size());
    std::optional<BatchOutputFile> opened;
    try {
      opened.emplace(*a.get("--output"));
    } catch (const BatchOutputBusy& e) {
      std::cerr << "exlagent batch: error: " << e.what() << " (or choose another --output)\n";
      return kBatchExitOutputBusy;
    }
    BatchOutputFile& out = *opened;
    std::set<std::string> done_keys;
    for (const auto& l : out.existing_lines())
      if (auto k = batch_result_key(l)) done_keys.insert(*k);
    if (out.truncated_bytes() > 0)
      std::cerr << "batch: output '" << *a.get("--output") << "': removed a partial last line ("
                << out.truncated_bytes() << " bytes, no newline) left by an interrupted write; it began "
                << ojson(out.truncated_head()).dump(-1, ' ', false, ojson::error_handler_t::replace)
                << "; its request runs again\n";

    JobEngine engine(job_engine_options(a, *a.get("--model"), int(conc)));
    if (default_schema) {
      try {
        engine.check_schema(*default_schema);
      } catch (const Error& e) {
        fail("runtime: batch: --schema '", *a.get("--schema"), "': ", e.what());
      }
    }

    Progress pg;
    pg.total = shard_end - shard_begin;
    pg.quiet = a.has("--quiet");
    std::vector<BatchItem> todo;
    std::set<std::string> seen;
    for (size_t k = 0; k < shard_end; ++k) {
      const auto& [n, text] = lines[k];
      BatchItem it = parse_batch_line(text, n, fallback, default_schema, engine.tokenizer().vocab_size());
      if (!it.key.starts_with("#") && !seen.insert(it.key).second) mark_duplicate(it);
      if (k < shard_begin) continue;
      if (done_keys.count(it.key)) ++pg.resumed;
      else todo.push_back(std::move(it));
    }

    // Result lines are written (each fsynced) on the writer's thread, which also keeps the
    // progress, so that the generator does not wait for the disk. Runs inside engine.step(), so it
    // must not throw: after a failed write nothing more is queued (no result is buffered) and the
    // loop below stops the job.
    BatchLineWriter writer(out);
    auto record = [&](std::string line, bool ok, const GenerationStats& stats) {
      writer.push(std::move(line), [&pg, ok, stats] {
        ++pg.done;
        (ok ? pg.ok : pg.errors) += 1;
        pg.tokens += stats.n_generated;
        pg.passes += stats.n_decode_passes;
        pg.drafted += stats.n_drafted;
        pg.accepted += stats.n_accepted;
        pg.show(false);
      });
    };
    std::string write_error;
    auto writing = [&] {
      if (write_error.empty()) write_error = writer.failure();
      return write_error.empty();
    };
    // The next request's job (prompt tokens, grammar matcher) is built on a helper thread while
    // the generator runs, so that a freed slot does not leave the device idle during its set-up.
    size_t next = 0, ahead_at = todo.size();
    std::future<PreparedJob> ahead;
    auto prepare_ahead = [&](size_t from) {
      while (from < todo.size() && todo[from].error) ++from;
      if (from == todo.size()) return;
      ahead_at = from;
      ahead = std::async(std::launch::async, [&engine, &spec = todo[from].spec] { return engine.prepare(spec); });
    };
    while ((next < todo.size() || engine.in_flight() > 0) && writing()) {
      while (next < todo.size() && engine.in_flight() < conc && writing()) {
        BatchItem& it = todo[next++];
        if (it.error) {
          record(batch_error_line(it), false, GenerationStats{});
          continue;
        }
        PreparedJob job = ahead_at == next - 1 ? ahead.get() : engine.prepare(it.spec);
        ahead_at = todo.size();
        prepare_ahead(next);
        engine.submit(std::move(job), [&, item = &it](JobOutcome o) {
          record(batch_result_line(*item, o, engine.model_id(), engine.chat_template()), o.ok, o.stats);
        });
      }
      if (engine.in_flight() > 0) engine.step();
    }
    if (ahead.valid()) ahead.wait();
    writer.finish();
    writing();
    pg.show(true);
    if (pg.tty && !pg.quiet) std::cerr << "\n";
    const double t = pg.elapsed();
    std::cerr << "batch: " << pg.total << " requests: " << pg.ok << " ok, " << pg.errors << " errors, " << pg.resumed
              << " already done; " << pg.tokens << " tokens in " << t << " s ("
              << (t > 0 ? double(pg.tokens) / t : 0.0) << " tokens/s)\n";
    if (pg.drafted > 0)
      std::cerr << "batch: speculation: " << pg.accepted << " of " << pg.drafted << " drafted tokens accepted, "
                << (pg.passes > 0 ? double(pg.tokens) / double(pg.passes) : 0.0) << " tokens per forward pass\n";
    if (!write_error.empty())
      fail("runtime: batch: stopped: ", write_error, "; the output keeps its ", out.existing_lines().size() + pg.done,
           " complete result lines, ", pg.total - pg.resumed - pg.done,
           " requests are not done; run the job again to resume");
    return 0;
  });
}

}  // namespace exl
