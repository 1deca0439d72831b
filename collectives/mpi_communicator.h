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

// Duplicates `comm` so shardckpt's messages never match the application's.
Result<std::unique_ptr<Communicator>> CreateMpiCommunicator(MPI_Comm comm = MPI_COMM_WORLD);

}  // namespace shardckpt
