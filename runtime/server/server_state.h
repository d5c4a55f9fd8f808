// What every connection of one server shares: the options, the loaded model with its tokenizer
// and chat template, the Generator (its own engine thread), metrics, and admission control for
// generations (max_sessions in flight; none while draining for shutdown).
// Thread-safety: any thread. The model and tokenizer are immutable once built; Generator::submit
// and cancel are thread-safe; counters are atomics.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/generate/generator.h"
#include "engine/tokenizer/tokenizer.h"
#include "grammar/grammar_budget.h"
#include "runtime/model_host.h"
#include "tools/mcp/mcp_client.h"
#include "runtime/server/metrics.h"
#include "sessions/chat_template.h"

namespace exl {

struct ServerOptions {
  std::string model_dir;
  std::string host = "127.0.0.1";
  uint16_t port = 8421;                      // 0 = any free port
  std::string api_key;                       // empty = no key (loopback only)
  bool metrics_public = false;               // serve /metrics without the key
  std::vector<std::string> allowed_hosts;    // extra Host header values; "*" = any
  std::vector<std::string> allowed_origins;  // extra Origin values ("https://app.example:8443"); "*" = any
  std::string backend = "cpu";
  std::string gpu_split;                     // a layer split (ModelHostOptions::gpu_split); empty = one device
  int tensor_parallel = 0;                   // ranks (ModelHostOptions::tensor_parallel); 0 or 1 = off
  int cpu_threads = 0;
  int cache_pages = 0;                       // 0 = fit the free device memory (512 on cpu)
  int page_size = 64;
  int max_sessions = 64;                     // generations in flight (queued + running)
  int max_batch_seqs = 16;
  Speculation speculate = Speculation::auto_;  // for requests (engine/generate/speculation.h)
  std::string draft_model;  // a draft model directory (ModelHostOptions::draft_model_dir); empty = none
  size_t max_body_bytes = 8u << 20;
  int64_t max_prompt_tokens = 0;             // 0 = context_length(); more is a 400 context_length_exceeded
  size_t max_prompt_bytes = 1u << 20;        // bytes of prompt text (message contents, tool-call arguments,
                                             // a completions prompt), checked before tokenizing
  std::chrono::milliseconds read_timeout{60000};  // one HTTP request (headers and body) must arrive within it
  std::chrono::milliseconds ws_message_timeout{60000};  // one WebSocket message must arrive whole within it
                                                       // of its first frame, else the connection is closed
  int io_threads = 2;
  GrammarBudget grammar_budget;              // per request's constraint; the request's disconnect cancels it
  std::string chat_template;                 // override name; empty = detect
  std::string session_dir;                   // agent transcripts; empty = <temp>/exlagent-sessions-<uid>
  size_t session_retain_files = 1000;        // transcripts kept (oldest deleted first); 0 = no limit
  uint64_t session_retain_bytes = uint64_t(256) << 20;  // bytes of transcripts kept; 0 = no limit
  std::string read_root;                     // directory the read_file tool may read; empty = no read_file
  std::vector<McpServerConfig> mcp_servers;  // MCP servers whose tools agent sessions get (NAME__tool)
  std::vector<McpServerConfig> session_mcp_servers;  // started per session that names it (sessions/create mcpServers)
};

// True for 127.0.0.0/8, ::1 and "localhost".
bool is_loopback_host(std::string_view host);

class SessionHub;

class ServerState {
 public:
  // Loads the model directory; throws exl::Error naming what failed. The generator is not started.
  // `backend`, when given, runs the model instead of the one options.backend names (tests wrap
  // the CPU backend to inject device faults).
  explicit ServerState(ServerOptions options, std::unique_ptr<Backend> backend = nullptr);
  ~ServerState();

  const ServerOptions& options() const { return opts_; }
  const std::string& model_id() const { return host_->model_id(); }
  int64_t created() const { return created_; }
  const Tokenizer& tokenizer() const { return host_->tokenizer(); }
  std::shared_ptr<const ChatTemplate> chat_template() const { return host_->chat_template(); }
  // Tokens one sequence may hold: the model's max_position_embeddings, capped by the KV cache.
  int64_t context_length() const;
  // Tokens a prompt may have: options().max_prompt_tokens capped by context_length().
  int64_t max_prompt_tokens() const;
  Generator& generator() { return *gen_; }
  Metrics& metrics() { return metrics_; }
  // Agent sessions and client tools (WebSocket API); max_sessions live sessions.
  SessionHub& sessions() { return *hub_; }

  // An admission for one generation, released on destruction; nullptr when draining or when
  // max_sessions generations are in flight.
  std::shared_ptr<void> admit_generation();
  int64_t running_generations() const { return running_; }
  void begin_drain() { draining_ = true; }
  // The port the listener is bound to (options().port may be 0): set by Server once bound, read
  // by the Origin check; 0 until then.
  void set_bound_port(uint16_t port) { bound_port_ = port; }
  uint16_t bound_port() const { return bound_port_; }
  bool draining() const { return draining_; }

  // Long-lived connections (WebSocket) that must close cleanly at shutdown register a closer:
  // a non-blocking callable that asks the connection to close (it posts to the connection's
  // strand). close_connections() calls every closer once; connections unregister when they end.
  uint64_t add_closer(std::function<void()> closer);
  void remove_closer(uint64_t id);
  void close_connections();
  size_t open_closers() const;

  // Prompt tokens of a rendered conversation: tokenize_prompt (special tokens only from the
  // template's markup, never from message content).
  std::vector<int32_t> encode_prompt(const RenderedPrompt& prompt) const;
  // Prompt tokens of a raw /v1/completions prompt, which the client templates itself: its
  // special-token text is parsed, bos added as the tokenizer says but never twice.
  std::vector<int32_t> encode_raw_prompt(const std::string& text) const;

 private:
  ServerOptions opts_;
  int64_t created_ = 0;
  std::unique_ptr<ModelHost> host_;
  std::unique_ptr<Generator> gen_;  // after host_: destroyed first
  Metrics metrics_;
  std::atomic<int64_t> running_{0};
  std::atomic<bool> draining_{false};
  std::atomic<uint16_t> bound_port_{0};
  mutable std::mutex closers_mu_;
  std::map<uint64_t, std::function<void()>> closers_;  // guarded by closers_mu_
  uint64_t next_closer_ = 1;                           // guarded by closers_mu_
  std::unique_ptr<SessionHub> hub_;  // after gen_: destroyed first
};

}  // namespace exl
