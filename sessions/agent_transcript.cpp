#include "sessions/agent_transcript.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <type_traits>

#include "kernels/error.h"

namespace exl {

namespace {

using Json = nlohmann::ordered_json;

// A field of type T, or fallback when absent or null. Numbers are range-checked, never wrapped
// or truncated: an integer must be a JSON integer within T's range, a float finite and within
// float's range.
template <class T>
T field(const Json& j, const char* key, T fallback, const char* what) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const Json& v = j[key];
  if constexpr (std::is_integral_v<T>) {
    using lim = std::numeric_limits<T>;
    auto out_of_range = [&] {
      fail("sessions: agent config: '", key, "' must be an integer in [", +lim::min(), ", ", +lim::max(), "], got ",
           v.dump());
    };
    if (!v.is_number_integer()) fail("sessions: agent config: '", key, "' must be ", what);
    if (v.is_number_unsigned()) {
      if (v.get<uint64_t>() > uint64_t(lim::max())) out_of_range();
      return T(v.get<uint64_t>());
    }
    const int64_t x = v.get<int64_t>();
    if (x < 0 ? (!lim::is_signed || x < int64_t(lim::min())) : uint64_t(x) > uint64_t(lim::max())) out_of_range();
    return T(x);
  } else if constexpr (std::is_floating_point_v<T>) {
    if (!v.is_number()) fail("sessions: agent config: '", key, "' must be ", what);
    const double d = v.get<double>();
    if (!std::isfinite(d) || std::fabs(d) > double(std::numeric_limits<T>::max()))
      fail("sessions: agent config: '", key, "' is out of range, got ", v.dump());
    return T(d);
  } else {
    try {
      return v.get<T>();
    } catch (const Json::exception&) {
      fail("sessions: agent config: '", key, "' must be ", what);
    }
  }
}

}  // namespace

AgentConfig agent_config_from_json(const Json& j) {
  EXL_CHECK(j.is_object() || j.is_null(), "sessions: agent config: params must be an object");
  AgentConfig c;
  if (j.is_null()) return c;
  c.system = field<std::string>(j, "system", "", "a string");
  if (j.contains("tools") && !j["tools"].is_null()) {
    EXL_CHECK(j["tools"].is_array(), "sessions: agent config: 'tools' must be an array of tool names");
    for (const auto& t : j["tools"]) {
      EXL_CHECK(t.is_string(), "sessions: agent config: 'tools' must be an array of tool names");
      c.tools.push_back(t.get<std::string>());
    }
  }
  if (j.contains("finalAnswerSchema") && !j["finalAnswerSchema"].is_null()) {
    EXL_CHECK(j["finalAnswerSchema"].is_object() || j["finalAnswerSchema"].is_boolean(),
              "sessions: agent config: 'finalAnswerSchema' must be a JSON Schema object");
    c.final_answer_schema = j["finalAnswerSchema"];
  }
  c.max_turns = field<int>(j, "maxTurns", c.max_turns, "an integer");
  EXL_CHECK(c.max_turns >= 1 && c.max_turns <= 100, "sessions: agent config: 'maxTurns' must be in [1, 100], got ",
            c.max_turns);
  c.max_new_tokens = field<int>(j, "maxTokens", c.max_new_tokens, "an integer");
  EXL_CHECK(c.max_new_tokens >= 1, "sessions: agent config: 'maxTokens' must be positive, got ", c.max_new_tokens);
  const int64_t timeout = field<int64_t>(j, "toolTimeoutMs", c.tool_timeout.count(), "an integer");
  EXL_CHECK(timeout >= 1 && timeout <= 3600000, "sessions: agent config: 'toolTimeoutMs' must be in [1, 3600000], got ",
            timeout);
  c.tool_timeout = std::chrono::milliseconds(timeout);
  if (j.contains("sampling") && !j["sampling"].is_null()) {
    const Json& s = j["sampling"];
    EXL_CHECK(s.is_object(), "sessions: agent config: 'sampling' must be an object");
    c.sampling.temperature = field<float>(s, "temperature", c.sampling.temperature, "a number");
    c.sampling.top_p = field<float>(s, "top_p", c.sampling.top_p, "a number");
    c.sampling.top_k = field<int32_t>(s, "top_k", c.sampling.top_k, "an integer");
    if (s.contains("seed") && !s["seed"].is_null()) c.sampling.seed = field<uint64_t>(s, "seed", 0, "an integer");
    validate(c.sampling, 0);
  }
  return c;
}

Json to_json(const AgentConfig& c) {
  Json s = {{"temperature", c.sampling.temperature}, {"top_p", c.sampling.top_p}, {"top_k", c.sampling.top_k}};
  if (c.sampling.seed) s["seed"] = *c.sampling.seed;
  return {{"system", c.system},
          {"tools", c.tools},
          {"finalAnswerSchema", c.final_answer_schema},
          {"maxTurns", c.max_turns},
          {"maxTokens", c.max_new_tokens},
          {"toolTimeoutMs", c.tool_timeout.count()},
          {"sampling", s}};
}

Json messages_to_json(const std::vector<ChatMessage>& messages) {
  Json out = Json::array();
  for (const auto& m : messages) {
    Json j = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls.empty()) {
      j["tool_calls"] = Json::array();
      for (const auto& c : m.tool_calls)
        j["tool_calls"].push_back(
            {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    }
    if (!m.tool_call_id.empty()) j["tool_call_id"] = m.tool_call_id;
    out.push_back(std::move(j));
  }
  return out;
}

std::vector<ChatMessage> messages_from_json(const Json& j) {
  EXL_CHECK(j.is_array(), "sessions: transcript: 'messages' must be an array");
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < j.size(); ++i) {
    const Json& m = j[i];
    EXL_CHECK(m.is_object() && m.contains("role") && m["role"].is_string(), "sessions: transcript: message ", i,
              " has no role");
    ChatMessage c;
    c.role = m["role"];
    if (m.contains("content") && m["content"].is_string()) c.content = m["content"];
    if (m.contains("tool_call_id") && m["tool_call_id"].is_string()) c.tool_call_id = m["tool_call_id"];
    if (m.contains("tool_calls")) {
      EXL_CHECK(m["tool_calls"].is_array(), "sessions: transcript: message ", i, ": tool_calls must be an array");
      for (const auto& tc : m["tool_calls"]) {
        EXL_CHECK(tc.is_object() && tc.contains("function") && tc["function"].is_object(), "sessions: transcript: message ",
                  i, ": malformed tool call");
        ToolCall call;
        call.id = tc.value("id", "");
        call.name = tc["function"].value("name", "");
        call.arguments = tc["function"].value("arguments", "{}");
        c.tool_calls.push_back(std::move(call));
      }
    }
    out.push_back(std::move(c));
  }
  return out;
}

bool valid_session_id(std::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char ch : id)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-')) return false;
  return true;
}

std::filesystem::path transcript_path(const std::filesystem::path& dir, std::string_view id) {
  EXL_CHECK(valid_session_id(id), "sessions: transcript: invalid session id '", id, "'");
  return dir / (std::string(id) + ".json");
}

namespace {

// Creates dir with mode 0700 (its parents as usual) when it does not exist; st gets its lstat.
void create_private_dir(const std::filesystem::path& dir, struct stat& st) {
  const std::string shown = dir.string();
  if (::lstat(dir.c_str(), &st) == 0) return;
  EXL_CHECK(errno == ENOENT, "sessions: transcript: cannot inspect directory '", shown, "': ", std::strerror(errno));
  if (dir.has_parent_path()) {
    std::error_code ec;
    std::filesystem::create_directories(dir.parent_path(), ec);
    EXL_CHECK(!ec, "sessions: transcript: cannot create '", dir.parent_path().string(), "': ", ec.message());
  }
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
    fail("sessions: transcript: cannot create directory '", shown, "': ", std::strerror(errno));
  EXL_CHECK(::lstat(dir.c_str(), &st) == 0, "sessions: transcript: cannot inspect directory '", shown, "': ",
            std::strerror(errno));
}

}  // namespace

void prepare_private_dir(const std::filesystem::path& dir) {
  const std::string shown = dir.string();
  struct stat st {};
  create_private_dir(dir, st);
  EXL_CHECK(!S_ISLNK(st.st_mode), "sessions: transcript: directory '", shown,
            "' is a symlink; refusing to keep transcripts there (give a real directory with --session-dir)");
  EXL_CHECK(S_ISDIR(st.st_mode), "sessions: transcript: '", shown, "' is not a directory");
  EXL_CHECK(st.st_uid == ::geteuid(), "sessions: transcript: directory '", shown, "' belongs to uid ", st.st_uid,
            ", not to this user (uid ", ::geteuid(), "); refusing to keep transcripts there");
  char mode[8];
  std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
  EXL_CHECK((st.st_mode & 077) == 0, "sessions: transcript: directory '", shown, "' has mode ", mode,
            "; transcripts need a private directory (chmod 700 it, or give another --session-dir)");
}

void save_transcript(const std::filesystem::path& dir, const Transcript& t) {
  const auto path = transcript_path(dir, t.id);
  struct stat st {};
  create_private_dir(dir, st);
  static thread_local std::mt19937_64 rng(std::random_device{}());
  auto tmp = path;
  tmp += ".tmp" + std::to_string(rng() % 1000000000);
  Json j = {{"version", 1}, {"id", t.id}, {"config", to_json(t.config)}, {"messages", messages_to_json(t.messages)}};
  const std::string text = j.dump(1, ' ', false, Json::error_handler_t::replace);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  EXL_CHECK(fd >= 0, "sessions: transcript: cannot write '", tmp.string(), "': ", std::strerror(errno));
  size_t done = 0;
  int err = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      err = n < 0 ? errno : EIO;
      break;
    }
    done += size_t(n);
  }
  if (::close(fd) != 0 && err == 0) err = errno;
  std::error_code ec;
  if (err != 0) {
    std::filesystem::remove(tmp, ec);
    fail("sessions: transcript: write to '", tmp.string(), "' failed: ", std::strerror(err));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::filesystem::remove(tmp);
  EXL_CHECK(!ec, "sessions: transcript: cannot rename '", tmp.string(), "' to '", path.string(), "': ", ec.message());
}

size_t prune_transcripts(const std::filesystem::path& dir, const TranscriptRetention& r,
                         const std::vector<std::string>& keep) {
  namespace fs = std::filesystem;
  struct Entry {
    fs::file_time_type mtime;
    std::string id;
    uint64_t bytes;
  };
  std::vector<Entry> entries;
  size_t kept = 0;
  uint64_t kept_bytes = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    const std::string name = p.filename().string();
    std::error_code fec;
    if (!it->is_regular_file(fec) || fec) continue;
    const auto mtime = it->last_write_time(fec);
    if (fec) continue;
    if (name.find(".json.tmp") != std::string::npos) {
      if (now - mtime > std::chrono::minutes(1)) fs::remove(p, fec);
      continue;
    }
    if (p.extension() != ".json") continue;
    const std::string id = p.stem().string();
    if (!valid_session_id(id)) continue;
    const uint64_t bytes = it->file_size(fec);
    if (fec) continue;
    if (std::find(keep.begin(), keep.end(), id) != keep.end()) {
      ++kept;
      kept_bytes += bytes;
      continue;
    }
    entries.push_back({mtime, id, bytes});
  }
  std::sort(entries.begin(), entries.end(),
            [](const Entry& a, const Entry& b) { return a.mtime != b.mtime ? a.mtime < b.mtime : a.id < b.id; });
  uint64_t total = kept_bytes;
  for (const auto& e : entries) total += e.bytes;
  size_t count = entries.size() + kept, removed = 0;
  for (const auto& e : entries) {
    const bool over_count = r.max_files > 0 && count > r.max_files;
    const bool over_bytes = r.max_bytes > 0 && total > r.max_bytes;
    if (!over_count && !over_bytes) break;
    std::error_code fec;
    if (fs::remove(dir / (e.id + ".json"), fec)) ++removed;
    --count;
    total -= e.bytes;
  }
  return removed;
}

Transcript load_transcript(const std::filesystem::path& dir, std::string_view id) {
  const auto path = transcript_path(dir, id);
  std::ifstream f(path, std::ios::binary);
  EXL_CHECK(bool(f), "sessions: transcript: no transcript '", path.string(), "'");
  std::stringstream ss;
  ss << f.rdbuf();
  Json j = Json::parse(ss.str(), nullptr, false);
  EXL_CHECK(j.is_object() && j.value("version", 0) == 1 && j.contains("messages"), "sessions: transcript: '",
            path.string(), "' is not a version 1 transcript");
  Transcript t;
  t.id = std::string(id);
  try {
    t.config = agent_config_from_json(j.value("config", Json::object()));
    t.messages = messages_from_json(j["messages"]);
  } catch (const Error& e) {
    fail("sessions: transcript: '", path.string(), "': ", e.what());
  }
  return t;
}

}  // namespace exl
