#include "benchmarks/bench_process.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

namespace shardckpt::bench {

Result<Child> Spawn(const std::vector<std::string>& argv) {
  int to_child[2], from_child[2];
  if (::pipe(to_child) != 0) return ErrnoStatus(errno, "pipe");
  if (::pipe(from_child) != 0) {
    int err = errno;
    ::close(to_child[0]);
    ::close(to_child[1]);
    return ErrnoStatus(err, "pipe");
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(to_child[0], 0);
    ::dup2(from_child[1], 1);
    ::close(to_child[1]);
    ::close(from_child[0]);
    ::execvp(args[0], args.data());
    _exit(127);
  }
  int err = errno;
  ::close(to_child[0]);
  ::close(from_child[1]);
  if (pid < 0) {
    ::close(to_child[1]);
    ::close(from_child[0]);
    return ErrnoStatus(err, "fork for " + argv[0]);
  }
  return Child{pid, to_child[1], from_child[0]};
}

std::string ReadLine(int fd) {
  std::string line;
  char c;
  while (::read(fd, &c, 1) == 1 && c != '\n') line += c;
  return line;
}

std::string ReadAll(int fd) {
  std::string text;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

Status Finish(Child& child, const std::string& what) {
  if (child.in >= 0) ::close(child.in);
  if (child.out >= 0) ::close(child.out);
  child.in = child.out = -1;
  int status = 0;
  while (::waitpid(child.pid, &status, 0) < 0) {
    if (errno != EINTR) return ErrnoStatus(errno, "waitpid " + what);
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return Status::Ok();
  if (WIFEXITED(status)) return Internal(what + " exited with status " + std::to_string(WEXITSTATUS(status)));
  return Internal(what + " killed by signal " + std::to_string(WTERMSIG(status)));
}

Result<std::string> RunCapture(const std::vector<std::string>& argv) {
  Result<Child> child = Spawn(argv);
  if (!child.ok()) return child.status();
  ::close(child->in);
  child->in = -1;
  std::string out = ReadAll(child->out);
  Status done = Finish(*child, argv[0]);
  if (!done.ok()) return done;
  return out;
}

}  // namespace shardckpt::bench
