// The few collective operations shardckpt needs, behind one small interface, so the engine runs
// the same under MPI, in a single process (tools, unit tests) and, for device memory, over NCCL.
//
// Every call is collective: all ranks of the communicator call it in the same order. Errors come
// back as Status (MPI error codes are converted in the MPI implementation, once).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "shardckpt/io/status.h"

namespace shardckpt {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const char* name() const = 0;
  // Whether two threads may run collectives on two communicators of these ranks at once.
  virtual bool thread_safe() const = 0;

  virtual Status Barrier() = 0;
  // In place: `data` on root is sent, on the others overwritten. Any size (split internally).
  virtual Status Broadcast(void* data, size_t bytes, int root) = 0;
  // Variable-sized byte strings from every rank, gathered at root (others get an empty vector).
  virtual Status Gather(const std::string& mine, std::vector<std::string>* all, int root) = 0;
  virtual Status AllGather(const std::string& mine, std::vector<std::string>* all) = 0;
  virtual Status AllReduceMaxInt64(int64_t* values, size_t count) = 0;
  virtual Status AllReduceSumDouble(double* values, size_t count) = 0;
  // Data plane for the demo trainer: equal counts per rank; recv holds size()*count floats.
  virtual Status AllGatherFloat(const float* send, size_t count, float* recv) = 0;
  // Sums `send` (size()*count floats) across ranks and leaves block rank() in recv (count).
  virtual Status ReduceScatterSumFloat(const float* send, float* recv, size_t count) = 0;
  // A communicator over the same ranks whose traffic never mixes with this one's; the
  // background persist of an async save runs on one.
  virtual Result<std::unique_ptr<Communicator>> Duplicate() = 0;
};

// A communicator of one rank, for tools and single-process programs.
std::unique_ptr<Communicator> CreateSingleProcessCommunicator();

// Every rank learns whether every rank succeeded. On failure all ranks get the same Status: the
// code of the first failing rank and a message naming each failing rank and its cause.
Status AgreeOnStatus(Communicator& comm, const Status& local);

// Pure, for AgreeOnStatus: `by_rank[r]` is rank r's status. Ranks that failed with the same code
// and message are named together ("IoError: ranks 0-3, 7: read ..."), so a failure that every
// rank of a large job shares reads as one line, in the order each cause first appears. The result
// has the first failure's code; a cause with another code keeps its code name ("IoError: rank 0:
// read ...; ranks 1-2: NoSpace: write ...").
Status MergeRankStatuses(const std::vector<Status>& by_rank);
// "rank 3", "ranks 0-2, 5, 7-9" (ranks ascending).
std::string RankRanges(const std::vector<int>& ranks);

// Whether a gather of messages of these lengths (one per rank) fits in `limit` bytes per rank
// and in all; the error names the rank. Every rank runs it on the same lengths, so every rank
// refuses the same gather instead of the root alone.
Status CheckGatherSizes(const std::vector<int64_t>& lengths, int64_t limit);

// Broadcasts a string of any length from root; other ranks' strings are replaced.
Status BroadcastString(Communicator& comm, std::string* text, int root);

// Shares root's Status with all ranks, so an error seen only on rank 0 (a bad manifest, a lock)
// ends the collective on every rank with the same code and message.
Status BroadcastStatus(Communicator& comm, const Status& local, int root);

// SHARDCKPT_COLLECTIVE_TIMEOUT_S in seconds: 1800 when unset, 0 for no deadline (0, inf or more
// than 1e9); a value that is not seconds >= 0 is logged once and ignored. Every communicator's
// deadline, and what a rank waiting outside a collective (a save's rank 0 waiting for a prune)
// must finish well within, lest the others blame it.
double CollectiveTimeoutFromEnvironment();

}  // namespace shardckpt
