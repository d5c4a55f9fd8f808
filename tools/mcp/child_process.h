// ChildProcess: a program started without a shell, its stdin, stdout and stderr connected to pipes
// that this process owns (close-on-exec, so other children do not inherit them). The child gets
// only those three: every other descriptor of ours is closed at its exec (sockets included).
//
// spawn() searches argv[0] in PATH (as execvp) and reports a program that cannot be started as
// exl::Error naming it and the errno text (the exec error travels back on a close-on-exec pipe).
// The child asks the kernel for SIGTERM when the thread that spawned it exits
// (PR_SET_PDEATHSIG), so spawn it from a thread that lives as long as the child should; with the
// stop() of the destructor, programs started by exlagent end with it.
//
// stop(): closes stdin (an MCP server exits on end of input), waits up to `grace`, then SIGTERM,
// waits up to `grace` again, then SIGKILL, and reaps. Idempotent; the destructor calls it with a
// 2 s grace. Not thread-safe: one owner; the fds may be read and written from other threads while
// it is alive.
#pragma once
#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace exl {

class ChildProcess {
 public:
  static std::unique_ptr<ChildProcess> spawn(const std::vector<std::string>& argv);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  int stdin_fd() const { return in_; }    // -1 after close_stdin()
  int stdout_fd() const { return out_; }
  int stderr_fd() const { return err_; }
  void close_stdin();

  // Ends the child as described above; returns how it ended ("exit status 3", "killed by signal 9").
  std::string stop(std::chrono::milliseconds grace);
  // How it ended if it has already ended (reaping it), else an empty string.
  std::string try_reap();

 private:
  ChildProcess() = default;
  pid_t pid_ = -1;
  int in_ = -1, out_ = -1, err_ = -1;
  std::string ended_;  // non-empty once reaped
};

}  // namespace exl
