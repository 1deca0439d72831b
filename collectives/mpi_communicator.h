// MPI implementation of Communicator. MpiSession owns MPI_Init_thread/MPI_Finalize for programs
// that do not manage MPI themselves; programs that already initialized MPI wrap any MPI_Comm.
#pragma once

#include <mpi.h>

#include <memory>

#include "shardckpt/collectives/communicator.h"

namespace shardckpt {

class MpiSession {
 public:
  // Asks for MPI_THREAD_MULTIPLE (an async save's persist thread calls MPI while the training
  // thread may too); `thread_level()` says what the library granted.
  static Result<std::unique_ptr<MpiSession>> Init(int* argc, char*** argv);
  ~MpiSession();
  int thread_level() const { return provided_; }

 private:
  int provided_ = 0;
  bool owns_ = false;
};

// After any of this process's collectives timed out (AnyCollectiveTimedOut), MPI_Finalize waits
// for the rank that never came: this logs, waits for the other survivors to say which rank is
// missing (SecondsBeforeAbort), and aborts the job with exit code 3. Nothing otherwise, or when
// MPI is not running. MpiSession's destructor calls it, owner of MPI or not; a program that
// started MPI itself and keeps no MpiSession calls it before its MPI_Finalize.
void AbortJobIfACollectiveTimedOut();

// Duplicates `comm` so shardckpt's messages never match the application's.
Result<std::unique_ptr<Communicator>> CreateMpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD);

}  // namespace shardckpt
