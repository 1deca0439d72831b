#include "collectives/mpi_communicator.h"

#include <algorithm>
#include <limits>

#include "io/log.h"

namespace shardckpt {
namespace {

// MPI counts are int; bulk transfers move in pieces of at most this many bytes.
constexpr size_t kMaxMessage = size_t{1} << 30;

Status MpiStatus(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  return Status(Code::kIoError, std::string(call) + " failed: " + std::string(text, length));
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "mpi"; }
  bool thread_safe() const override {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    return provided == MPI_THREAD_MULTIPLE;
  }

  Status Barrier() override { return MpiStatus(MPI_Barrier(comm_), "MPI_Barrier"); }

  Status Broadcast(void* data, size_t bytes, int root) override {
    auto* p = static_cast<char*>(data);
    for (size_t done = 0; done < bytes; done += kMaxMessage) {
      int n = static_cast<int>(std::min(kMaxMessage, bytes - done));
      SC_RETURN_IF_ERROR(MpiStatus(MPI_Bcast(p + done, n, MPI_BYTE, root, comm_), "MPI_Bcast"));
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
    return MpiStatus(MPI_Allreduce(MPI_IN_PLACE, values, static_cast<int>(count), MPI_INT64_T,
                                   MPI_MAX, comm_),
                     "MPI_Allreduce");
  }

  Status AllReduceSumDouble(double* values, size_t count) override {
    return MpiStatus(MPI_Allreduce(MPI_IN_PLACE, values, static_cast<int>(count), MPI_DOUBLE,
                                   MPI_SUM, comm_),
                     "MPI_Allreduce");
  }

  Status AllGatherFloat(const float* send, size_t count, float* recv) override {
    return MpiStatus(MPI_Allgather(send, static_cast<int>(count), MPI_FLOAT, recv,
                                   static_cast<int>(count), MPI_FLOAT, comm_),
                     "MPI_Allgather");
  }

  Status ReduceScatterSumFloat(const float* send, float* recv, size_t count) override {
    return MpiStatus(MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), MPI_FLOAT,
                                              MPI_SUM, comm_),
                     "MPI_Reduce_scatter_block");
  }

  Result<std::unique_ptr<Communicator>> Duplicate() override { return CreateMpiCommunicator(comm_); }

 private:
  // Sizes first, then the bytes in one gatherv; descriptors are small (kilobytes to megabytes).
  Status GatherImpl(const std::string& mine, std::vector<std::string>* all, int root, bool everyone) {
    if (mine.size() > static_cast<size_t>(std::numeric_limits<int>::max())) {
      return InvalidArgument("gather of a message over 2 GiB");
    }
    int length = static_cast<int>(mine.size());
    std::vector<int> lengths(size_);
    if (everyone) {
      SC_RETURN_IF_ERROR(MpiStatus(
          MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm_), "MPI_Allgather"));
    } else {
      SC_RETURN_IF_ERROR(MpiStatus(
          MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm_), "MPI_Gather"));
    }
    std::vector<int> displs(size_, 0);
    int64_t total = 0;
    if (everyone || rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        displs[r] = static_cast<int>(total);
        total += lengths[r];
      }
      if (total > std::numeric_limits<int>::max()) return InvalidArgument("gather over 2 GiB");
    }
    std::string buffer(static_cast<size_t>(total), '\0');
    if (everyone) {
      SC_RETURN_IF_ERROR(MpiStatus(MPI_Allgatherv(mine.data(), length, MPI_BYTE, buffer.data(),
                                                  lengths.data(), displs.data(), MPI_BYTE, comm_),
                                   "MPI_Allgatherv"));
    } else {
      SC_RETURN_IF_ERROR(MpiStatus(MPI_Gatherv(mine.data(), length, MPI_BYTE, buffer.data(),
                                               lengths.data(), displs.data(), MPI_BYTE, root, comm_),
                                   "MPI_Gatherv"));
    }
    all->clear();
    if (everyone || rank_ == root) {
      for (int r = 0; r < size_; ++r) all->push_back(buffer.substr(displs[r], lengths[r]));
    }
    return Status::Ok();
  }

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
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
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &session->provided_);
  if (rc != MPI_SUCCESS) return MpiStatus(rc, "MPI_Init_thread");
  session->owns_ = true;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  SetProcessRank(rank);
  return session;
}

MpiSession::~MpiSession() {
  if (owns_) MPI_Finalize();
}

Result<std::unique_ptr<Communicator>> CreateMpiCommunicator(MPI_Comm comm) {
  MPI_Comm dup;
  SC_RETURN_IF_ERROR(MpiStatus(MPI_Comm_dup(comm, &dup), "MPI_Comm_dup"));
  auto result = std::make_unique<MpiCommunicator>(dup);
  SetProcessRank(result->rank());
  return std::unique_ptr<Communicator>(std::move(result));
}

}  // namespace shardckpt
