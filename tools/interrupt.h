// Ctrl-C and SIGTERM during a tool's long work (consolidate, import, reshard, export): the work
// stops at its next progress report and goes out through its error path, which removes the
// partial output (OUT.partial, its lock, an unfinished checkpoint folder). Killed by the
// signal's default action instead, the tool left a partial file the size of what it had written.
// A second signal while the first is being handled kills the process as usual, unless it comes
// within 0.2 s of the first: that is one request delivered twice (timeout(1) signals the tool
// and then its process group).
#pragma once

#include "shardckpt/io/status.h"

namespace shardckpt::tools {

class InterruptScope {
 public:
  // Catches SIGINT and SIGTERM until destroyed (the previous actions back then), unless the
  // process started with them ignored.
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

  // Aborted, naming the signal, once one came; OK before.
  static Status Check();
  // The signal caught, 0 when none: the tool exits with 128 + it, as the shell expects.
  static int Caught();
};

}  // namespace shardckpt::tools
