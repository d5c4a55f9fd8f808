#include "tools/mcp/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "kernels/error.h"

namespace exl {

namespace {

struct PipePair {
  int fd[2] = {-1, -1};
  PipePair() {
    if (::pipe2(fd, O_CLOEXEC) != 0) fail("tools: mcp: pipe: ", std::strerror(errno));
  }
  ~PipePair() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
  int take(int i) {
    int f = fd[i];
    fd[i] = -1;
    return f;
  }
};

std::string describe_status(int status) {
  if (WIFEXITED(status)) return cat("exit status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return cat("killed by signal ", WTERMSIG(status));
  return cat("wait status ", status);
}

}  // namespace

std::unique_ptr<ChildProcess> ChildProcess::spawn(const std::vector<std::string>& argv) {
  EXL_CHECK(!argv.empty() && !argv[0].empty(), "tools: mcp: no command to start");
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  PipePair in, out, err, exec_err;
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) fail("tools: mcp: cannot start '", argv[0], "': fork: ", std::strerror(errno));
  if (pid == 0) {
    // Only async-signal-safe calls until exec.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    if (::dup2(in.fd[0], 0) < 0 || ::dup2(out.fd[1], 1) < 0 || ::dup2(err.fd[1], 2) < 0) ::_exit(127);
    // Nothing else of ours crosses the exec: not the server's listening socket nor its connections
    // (an inherited connection stays open while the child runs, however its client closes it).
    if (::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
      for (int fd = 3; fd < 65536; ++fd) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    ::execvp(cargv[0], cargv.data());
    const int e = errno;
    [[maybe_unused]] ssize_t w = ::write(exec_err.fd[1], &e, sizeof e);
    ::_exit(127);
  }
  auto c = std::unique_ptr<ChildProcess>(new ChildProcess);
  c->pid_ = pid;
  c->in_ = in.take(1);
  c->out_ = out.take(0);
  c->err_ = err.take(0);
  ::close(exec_err.take(1));
  int e = 0;
  ssize_t n;
  do n = ::read(exec_err.fd[0], &e, sizeof e);
  while (n < 0 && errno == EINTR);
  if (n == ssize_t(sizeof e)) {
    c->stop(std::chrono::milliseconds(0));
    fail("tools: mcp: cannot start '", argv[0], "': ", std::strerror(e));
  }
  return c;
}

void ChildProcess::close_stdin() {
  if (in_ >= 0) ::close(in_);
  in_ = -1;
}

std::string ChildProcess::try_reap() {
  if (!ended_.empty() || pid_ < 0) return ended_;
  int status = 0;
  pid_t r;
  do r = ::waitpid(pid_, &status, WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == pid_) ended_ = describe_status(status);
  else if (r < 0) ended_ = cat("not waitable: ", std::strerror(errno));
  return ended_;
}

std::string ChildProcess::stop(std::chrono::milliseconds grace) {
  close_stdin();
  auto wait_for = [&](std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (try_reap().empty()) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  };
  if (pid_ >= 0 && !wait_for(grace)) {
    ::kill(pid_, SIGTERM);
    if (!wait_for(grace)) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      pid_t r;
      do r = ::waitpid(pid_, &status, 0);
      while (r < 0 && errno == EINTR);
      ended_ = r == pid_ ? describe_status(status) : "killed";
    }
  }
  for (int* f : {&out_, &err_})
    if (*f >= 0) {
      ::close(*f);
      *f = -1;
    }
  return ended_;
}

ChildProcess::~ChildProcess() { stop(std::chrono::milliseconds(2000)); }

}  // namespace exl
