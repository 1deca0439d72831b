// Collectives that cannot hang forever. A rank that died, exited early or is stuck outside the
// collective would leave plain MPI_Barrier/MPI_Bcast waiting with no end (mpirun only notices a
// rank that exits abnormally; one that finalized early or hangs in I/O is never noticed).
//
// Every MpiCommunicator collective is started non-blocking and waited on here. After the timeout
// (SHARDCKPT_COLLECTIVE_TIMEOUT_S, default 1800 s, 0 = wait forever) the rank runs a census on a
// private communicator: it asks every rank "are you inside a collective?" and waits a short grace
// period for the answers. Ranks still waiting answer at once from their own poll loops (and
// start their own census, so every survivor fails within moments of the first one, each with the
// same diagnosis); ranks that are dead or stuck elsewhere do not, and the error names them.
//
// A timed-out collective cannot be cancelled in MPI, so the communicator is broken afterwards:
// every later call fails at once, and MpiSession aborts the job instead of finalizing (a
// finalize would wait for the missing rank too).
#pragma once

#include <mpi.h>

#include <string>

#include "shardckpt/io/status.h"

namespace shardckpt {

struct CollectiveDeadline {
  double timeout_s = 1800;  // 0: no deadline
  double census_grace_s = 2;
  static CollectiveDeadline FromEnvironment();
};

class MpiDeadlineWaiter {
 public:
  // `census` must be a communicator over the same ranks used only by this waiter; MPI_COMM_NULL
  // where there is none yet (the duplicate that makes it): a timeout then names no rank.
  MpiDeadlineWaiter(MPI_Comm census, CollectiveDeadline deadline);

  // Waits for `request` (from the collective named `call`) until the deadline.
  Status Wait(MPI_Request* request, const char* call);
  bool broken() const { return !broken_status_.ok(); }

 private:
  Status RunCensus(const char* call, double waited_s);
  bool AnswerQueries();

  MPI_Comm census_;
  CollectiveDeadline deadline_;
  int rank_ = 0;
  int size_ = 1;
  long long sequence_ = 0;  // collectives started through this waiter, for the diagnosis
  const char* call_ = "";   // the one being waited for: ranks at the same number in other calls
                            // skipped or added one
  Status broken_status_;
};

// The one place MPI error codes become Status.
Status MpiCallStatus(int rc, const char* call);

// True once any communicator in this process broke on a timeout; MpiSession then aborts.
bool AnyCollectiveTimedOut();

// How long MpiSession waits, after a timeout, before it aborts the job: long enough for the
// other survivors to finish their census and say which rank is missing.
double SecondsBeforeAbort();

}  // namespace shardckpt
