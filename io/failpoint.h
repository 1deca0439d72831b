// Named failure points, so tests can fail or kill the process at an exact step of a save, on an
// exact rank, without mocking the file system. Set programmatically or through the environment:
//
//   SHARDCKPT_FAILPOINTS="commit.rename_dir=EIO;io.write@2=ENOSPC;save.persist@1#3=kill"
//
// `name[@rank][#nth]=action`: on `rank` only (default every rank), on the nth hit only (default
// every hit). Actions: an errno name (EIO, ENOSPC, EDQUOT, EACCES), `kill` (SIGKILL to itself,
// the honest model of a node dying) or `sleep:MS` (to give a test time to kill from outside).
#pragma once

#include <string>

#include "shardckpt/io/status.h"

namespace shardckpt {

// Returns OK unless a failpoint named `name` is armed and fires; `context` names the file or
// object and ends up in the error message.
Status Failpoint(const char* name, const std::string& context);

// Replaces the armed set with `spec` (same syntax as the environment variable); "" clears it.
Status SetFailpoints(const std::string& spec);

}  // namespace shardckpt
