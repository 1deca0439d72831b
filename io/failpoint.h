// Named failure points, so tests can fail or kill the process at an exact step of a save, on an
// exact rank, without mocking the file system. Set programmatically or through the environment:
//
//   SHARDCKPT_FAILPOINTS="commit.rename_dir=EIO;io.write@2=ENOSPC;io.fsync@1#3=kill"
//
// `name[@rank][#nth]=action`: on `rank` only (default every rank), on the nth hit only (default
// every hit). Actions: an errno name (EIO, ENOSPC, EDQUOT, EACCES, EROFS, EAGAIN, EBUSY), `kill`
// (SIGKILL to itself, the honest model of a node dying), `sleep:MS` (to give a test time to kill
// from outside) or `short` (only the completion points io.read.complete and io.write.complete:
// the kernel is made to stop halfway through the transfer).
// io.read and io.read.complete count a load's read ahead of its own file too
// (engine/core/read_ahead.h); a read ahead that fails is dropped and the file read again, so a
// failpoint that fires once (#nth) there fails that read, not the load.
// arena.block fails the allocation of a block for a decode's chunk lists (engine/model/record_arena.h),
// as if memory ran out: the decode then fails with an out-of-memory Status.
// Each firing is logged; SHARDCKPT_FAILPOINTS_FIRED=FILE also appends "NAME RANK ACTION" to FILE,
// so campaigns count what fired.
#pragma once

#include <string>

#include "shardckpt/io/status.h"

namespace shardckpt {

// Returns OK unless a failpoint named `name` is armed and fires; `context` names the file or
// object and ends up in the error message.
Status Failpoint(const char* name, const std::string& context);

// The action of failpoint `name` when it is armed and fires on this hit, "" otherwise; `kill`
// and `sleep:MS` are carried out here. For points that act on more than an errno (`short`).
std::string FailpointAction(const char* name);
// The errno an action names, 0 for an action that is not an errno.
int FailpointErrno(const std::string& action);

// Replaces the armed set with `spec` (same syntax as the environment variable); "" clears it.
Status SetFailpoints(const std::string& spec);

}  // namespace shardckpt
