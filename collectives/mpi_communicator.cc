#include "shardckpt/collectives/mpi_communicator.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <system_error>
#include <thread>

#include "shardckpt/collectives/mpi_deadline.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

// MPI counts are int; bulk transfers move in pieces of at most this many bytes.
constexpr size_t kMaxMessage = size_t{1} << 30;


class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, MPI_Comm census)
      : comm_(comm), census_(census), waiter_(census, CollectiveDeadline::FromEnvironment()) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(census_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A broken communicator still has a collective in flight; freeing it could block.
    if (!finalized && !waiter_.broken()) {
      MPI_Comm_free(&comm_);
      MPI_Comm_free(&census_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }
  bool thread_safe() const override {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    return provided == MPI_THREAD_MULTIPLE;
  }

  Status Barrier() override {
    SC_RETURN_IF_ERROR(StillUsable());
    MPI_Request request;
    SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier"));
    return waiter_.Wait(&request, "MPI_Barrier");
  }

  Status Broadcast(void* data, size_t bytes, int root) override {
    SC_RETURN_IF_ERROR(StillUsable());
    auto* p = static_cast<char*>(data);
    for (size_t done = 0; done < bytes; done += kMaxMessage) {
      int n = static_cast<int>(std::min(kMaxMessage, bytes - done));
      MPI_Request request;
      SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Ibcast(p + done, n, MPI_BYTE, root, comm_, &request), "MPI_Ibcast"));
      SC_RETURN_IF_ERROR(waiter_.Wait(&request, "MPI_Bcast"));
    }
    return Status::Ok();
  }

  Status Gather(const std::string& mine, std::vector<std::string>* all, int root) override {
    return GatherImpl(mine, all, root, false);
  }

  Status AllGather(const std::string& mine, std::vector<std::string>* all) override {
    return GatherImpl(mine, all, 0, true);
  }

  Status AllReduceMaxInt64(int64_t* values, size_t count) override {
    SC_RETURN_IF_ERROR(StillUsable());
    MPI_Request request;
    SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Iallreduce(MPI_IN_PLACE, values, static_cast<int>(count),
                                                MPI_INT64_T, MPI_MAX, comm_, &request),
                                 "MPI_Iallreduce"));
    return waiter_.Wait(&request, "MPI_Allreduce");
  }

  Status AllReduceSumDouble(double* values, size_t count) override {
    SC_RETURN_IF_ERROR(StillUsable());
    MPI_Request request;
    SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Iallreduce(MPI_IN_PLACE, values, static_cast<int>(count),
                                                MPI_DOUBLE, MPI_SUM, comm_, &request),
                                 "MPI_Iallreduce"));
    return waiter_.Wait(&request, "MPI_Allreduce");
  }

  Status AllGatherFloat(const float* send, size_t count, float* recv) override {
    SC_RETURN_IF_ERROR(StillUsable());
    MPI_Request request;
    SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Iallgather(send, static_cast<int>(count), MPI_FLOAT, recv,
                                                static_cast<int>(count), MPI_FLOAT, comm_, &request),
                                 "MPI_Iallgather"));
    return waiter_.Wait(&request, "MPI_Allgather");
  }

  Status ReduceScatterSumFloat(const float* send, float* recv, size_t count) override {
    SC_RETURN_IF_ERROR(StillUsable());
    MPI_Request request;
    SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count),
                                                           MPI_FLOAT, MPI_SUM, comm_, &request),
                                 "MPI_Ireduce_scatter_block"));
    return waiter_.Wait(&request, "MPI_Reduce_scatter");
  }

  // MPI_Comm_dup is a collective that blocks: a rank that never calls it (one that failed before
  // AsyncSaver::Create) would hold the others there for good. Started non-blocking instead and
  // waited on with the deadline, as every other collective.
  Result<std::unique_ptr<Communicator>> Duplicate() override {
    SC_RETURN_IF_ERROR(StillUsable());
    MPI_Comm dup = MPI_COMM_NULL, census = MPI_COMM_NULL;
    for (MPI_Comm* out : {&dup, &census}) {
      MPI_Request request;
      SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Comm_idup(comm_, out, &request), "MPI_Comm_idup"));
      SC_RETURN_IF_ERROR(waiter_.Wait(&request, "MPI_Comm_dup"));
    }
    return std::unique_ptr<Communicator>(std::make_unique<MpiCommunicator>(dup, census));
  }

 private:
  // A collective after MPI_Finalize makes Open MPI abort the process: refused as a Status
  // instead (a save, load or preemption check left after the MPI session ended).
  static Status StillUsable() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) return Status::Ok();
    return FailedPrecondition("MPI is already finalized: shardckpt's saves, loads and preemption checks need MPI; "
                              "end them (and wait for async saves) before MPI_Finalize or the MpiSession's end");
  }

  // Sizes first, then the bytes in one gatherv; descriptors are small (kilobytes to megabytes).
  // Every rank learns every size (int64, so an oversized message is reported, not truncated)
  // and refuses an oversized gather by the same check, before any rank posts the gatherv.
  Status GatherImpl(const std::string& mine, std::vector<std::string>* all, int root, bool everyone) {
    SC_RETURN_IF_ERROR(StillUsable());
    int64_t mine_length = static_cast<int64_t>(mine.size());
    std::vector<int64_t> lengths64(size_);
    MPI_Request sizes;
    SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Iallgather(&mine_length, 1, MPI_INT64_T, lengths64.data(), 1, MPI_INT64_T,
                                                    comm_, &sizes),
                                     "MPI_Iallgather"));
    SC_RETURN_IF_ERROR(waiter_.Wait(&sizes, "MPI_Allgather"));
    SC_RETURN_IF_ERROR(CheckGatherSizes(lengths64, std::numeric_limits<int>::max()));
    const int length = static_cast<int>(mine_length);
    std::vector<int> lengths(lengths64.begin(), lengths64.end());
    std::vector<int> displs(size_, 0);
    int64_t total = 0;
    if (everyone || rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        displs[r] = static_cast<int>(total);
        total += lengths[r];
      }
    }
    std::string buffer(static_cast<size_t>(total), '\0');
    if (everyone) {
      MPI_Request request;
      SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Iallgatherv(mine.data(), length, MPI_BYTE, buffer.data(),
                                                   lengths.data(), displs.data(), MPI_BYTE, comm_, &request),
                                   "MPI_Iallgatherv"));
      SC_RETURN_IF_ERROR(waiter_.Wait(&request, "MPI_Allgatherv"));
    } else {
      MPI_Request request;
      SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Igatherv(mine.data(), length, MPI_BYTE, buffer.data(),
                                                lengths.data(), displs.data(), MPI_BYTE, root, comm_, &request),
                                   "MPI_Igatherv"));
      SC_RETURN_IF_ERROR(waiter_.Wait(&request, "MPI_Gatherv"));
    }
    all->clear();
    if (everyone || rank_ == root) {
      for (int r = 0; r < size_; ++r) all->push_back(buffer.substr(displs[r], lengths[r]));
    }
    return Status::Ok();
  }

  MPI_Comm comm_;
  MPI_Comm census_;
  MpiDeadlineWaiter waiter_;
  int rank_ = 0;
  int size_ = 1;
};

// MPI_Init_thread waits for every rank of the job with no deadline of its own: a rank stuck
// before its first checkpoint call (Python starts MPI at world() or its first save) held the
// others there for good, silently. This gives the start the collectives' deadline: past it, the
// process says why and exits (there is no communicator yet to abort through), and the launcher
// ends the job as it does for a rank that fails.
class InitWatchdog {
 public:
  explicit InitWatchdog(double timeout_s) {
    if (timeout_s <= 0) return;
    try {
      thread_ = std::thread([this, timeout_s] {
        std::unique_lock<std::mutex> lock(mutex_);
        if (done_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return done_; })) return;
        SC_LOG(kError) << "MPI_Init_thread has not finished after " << timeout_s
                       << " s (SHARDCKPT_COLLECTIVE_TIMEOUT_S): a rank of the job has not started MPI "
                          "(stuck or failed before its first checkpoint call, or never launched), or MPI's start "
                          "takes longer than that here (raise the timeout); ending this process";
        std::_Exit(3);
      });
    } catch (const std::system_error& e) {  // no thread to be had: the start waits as MPI's does
      SC_LOG(kInfo) << "MPI_Init_thread without a deadline: " << e.what();
    }
  }
  ~InitWatchdog() {
    if (!thread_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }
  InitWatchdog(const InitWatchdog&) = delete;
  InitWatchdog& operator=(const InitWatchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<MpiSession>> MpiSession::Init(int* argc, char*** argv) {
  auto session = std::unique_ptr<MpiSession>(new MpiSession());
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) {
    MPI_Query_thread(&session->provided_);
    return session;
  }
  int rc;
  {
    InitWatchdog watchdog(CollectiveDeadline::FromEnvironment().timeout_s);
    rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &session->provided_);
  }
  if (rc != MPI_SUCCESS) return MpiCallStatus(rc, "MPI_Init_thread");
  session->owns_ = true;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  SetProcessRank(rank);
  return session;
}

void AbortJobIfACollectiveTimedOut() {
  if (!AnyCollectiveTimedOut()) return;
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  // MPI_Finalize would wait for the rank that never came. Give the other survivors time to
  // finish their census and log their own diagnosis, then end the job.
  SC_LOG(kError) << "aborting the job: a collective timed out (see the message above)";
  std::this_thread::sleep_for(std::chrono::duration<double>(SecondsBeforeAbort()));
  MPI_Abort(MPI_COMM_WORLD, 3);
}

MpiSession::~MpiSession() {
  // Whoever started MPI: when mpi4py or the program did, its own MPI_Finalize hung for good after
  // a timeout (a Python job's survivors sat in ompi_mpi_finalize until the allocation ended).
  AbortJobIfACollectiveTimedOut();
  if (owns_) MPI_Finalize();
}

Result<std::unique_ptr<Communicator>> CreateMpiCommunicator(MPI_Comm comm) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    return Status(Code::kFailedPrecondition, std::string("MPI is ") + (finalized ? "already finalized" : "not initialized") +
                                                 ": create shardckpt's communicator between MpiSession::Init (or "
                                                 "MPI_Init_thread) and MPI_Finalize");
  }
  // The duplicates are collectives: a rank that never makes them (one that failed or took
  // another path before its first checkpoint call) held the others in MPI_Comm_dup for good.
  // Started non-blocking and waited on with the deadline, as every other collective; the first
  // has no census communicator yet to say which rank is missing.
  const CollectiveDeadline deadline = CollectiveDeadline::FromEnvironment();
  MPI_Comm census = MPI_COMM_NULL, dup = MPI_COMM_NULL;
  MPI_Request request;
  SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Comm_idup(comm, &census, &request), "MPI_Comm_idup"));
  SC_RETURN_IF_ERROR(MpiDeadlineWaiter(MPI_COMM_NULL, deadline).Wait(&request, "MPI_Comm_dup (shardckpt's communicator)"));
  MPI_Comm_set_errhandler(census, MPI_ERRORS_RETURN);
  MpiDeadlineWaiter waiter(census, deadline);
  SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Comm_idup(comm, &dup, &request), "MPI_Comm_idup"));
  SC_RETURN_IF_ERROR(waiter.Wait(&request, "MPI_Comm_dup (shardckpt's communicator)"));
  auto result = std::make_unique<MpiCommunicator>(dup, census);
  SetProcessRank(result->rank());
  return std::unique_ptr<Communicator>(std::move(result));
}

}  // namespace shardckpt
