// A child process with pipes to its stdin and stdout, for the baselines that are other
// programs (fio, cp, python3 with torch.save). Its stderr is the benchmark's, so a failing
// tool's own message reaches the operator.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "shardckpt/io/status.h"

namespace shardckpt::bench {

struct Child {
  pid_t pid = -1;
  int in = -1;   // writes reach the child's stdin
  int out = -1;  // the child's stdout
};

Result<Child> Spawn(const std::vector<std::string>& argv);
// Up to and without the next '\n' (or what is left at end of stream).
std::string ReadLine(int fd);
std::string ReadAll(int fd);
// Closes the pipes and reaps the child: Ok only for exit status 0.
Status Finish(Child& child, const std::string& what);
// Runs argv to completion; its stdout is returned, a non-zero exit is an error.
Result<std::string> RunCapture(const std::vector<std::string>& argv);

}  // namespace shardckpt::bench
