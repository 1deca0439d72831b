#include "shardckpt/collectives/mpi_deadline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <thread>
#include <vector>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

constexpr int kQueryTag = 7001;
constexpr int kAnswerTag = 7002;
// Short collectives finish while we spin; only then do we start sleeping between polls.
constexpr int kSpinPolls = 2000;

std::atomic<bool> g_timed_out{false};
// The longest census grace of any waiter that timed out: how long a survivor we woke may still
// take to finish its own census and log its diagnosis.
std::atomic<double> g_census_grace_s{0};

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// Sends whose buffers must outlive this call: the census never waits for them (a send to a
// dead rank may never complete), and the job aborts soon after.
void SendForever(long long value, int to, int tag, MPI_Comm comm) {
  auto* buffer = new long long(value);  // deliberately leaked, see above
  MPI_Request request;
  if (MPI_Isend(buffer, 1, MPI_LONG_LONG, to, tag, comm, &request) == MPI_SUCCESS) {
    MPI_Request_free(&request);
  }
}

// A census answer is a rank's collective number and the call it is in, as one number.
constexpr const char* kCalls[] = {"",          "MPI_Barrier", "MPI_Bcast",          "MPI_Allreduce", "MPI_Allgather",
                                  "MPI_Allgatherv", "MPI_Gatherv", "MPI_Reduce_scatter", "MPI_Comm_dup"};
constexpr long long kCallCount = sizeof(kCalls) / sizeof(kCalls[0]);

long long CensusAnswer(long long sequence, const char* call) {
  long long id = 0;
  for (long long i = 1; i < kCallCount; ++i) {
    const size_t n = std::strlen(kCalls[i]);  // "MPI_Comm_dup (shardckpt's communicator)" too
    if (std::strncmp(call, kCalls[i], n) == 0 && (call[n] == '\0' || call[n] == ' ')) id = i;
  }
  return sequence * kCallCount + id;
}
long long AnsweredSequence(long long answer) { return answer / kCallCount; }
const char* AnsweredCall(long long answer) { return kCalls[answer % kCallCount]; }

std::string RankList(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

}  // namespace

Status MpiCallStatus(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return Status::Ok();
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  return Status(Code::kIoError, std::string(call) + " failed: " + std::string(text, length));
}

CollectiveDeadline CollectiveDeadline::FromEnvironment() {
  CollectiveDeadline deadline;
  deadline.timeout_s = CollectiveTimeoutFromEnvironment();
  deadline.census_grace_s = std::clamp(deadline.timeout_s / 2, 0.5, 5.0);
  return deadline;
}

bool AnyCollectiveTimedOut() { return g_timed_out.load(); }

double SecondsBeforeAbort() {
  // Every survivor that answered our census starts its own and logs after its grace; a second
  // on top covers a loaded machine's scheduling (an abort kills ranks that have not logged yet).
  return g_census_grace_s.load() + 1.0;
}

MpiDeadlineWaiter::MpiDeadlineWaiter(MPI_Comm census, CollectiveDeadline deadline)
    : census_(census), deadline_(deadline) {
  if (census_ == MPI_COMM_NULL) return;
  MPI_Comm_rank(census_, &rank_);
  MPI_Comm_size(census_, &size_);
}

bool MpiDeadlineWaiter::AnswerQueries() {
  if (census_ == MPI_COMM_NULL) return false;
  bool asked = false;
  while (true) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, census_, &flag, &status) != MPI_SUCCESS || !flag) break;
    long long their_sequence = 0;
    MPI_Recv(&their_sequence, 1, MPI_LONG_LONG, status.MPI_SOURCE, kQueryTag, census_, MPI_STATUS_IGNORE);
    SendForever(CensusAnswer(sequence_, call_), status.MPI_SOURCE, kAnswerTag, census_);
    asked = true;
  }
  return asked;
}

Status MpiDeadlineWaiter::Wait(MPI_Request* request, const char* call) {
  if (broken()) return broken_status_;
  ++sequence_;
  call_ = call;
  if (deadline_.timeout_s <= 0) return MpiCallStatus(MPI_Wait(request, MPI_STATUS_IGNORE), call);
  const auto start = Clock::now();
  auto pause = std::chrono::microseconds(10);
  for (int poll = 0;; ++poll) {
    int done = 0;
    SC_RETURN_IF_ERROR(MpiCallStatus(MPI_Test(request, &done, MPI_STATUS_IGNORE), call));
    if (done) return Status::Ok();
    if (poll < kSpinPolls) continue;
    // A peer that timed out asks us whether we are here; we answer and fail with it, so the
    // survivors stop together instead of one by one as their own deadlines pass.
    if (AnswerQueries() || Seconds(start) >= deadline_.timeout_s) return RunCensus(call, Seconds(start));
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
}

Status MpiDeadlineWaiter::RunCensus(const char* call, double waited_s) {
  g_timed_out = true;
  // The abort waits this grace (SecondsBeforeAbort): the other survivors finish their census, or,
  // with no census, one that came a little late reports first.
  double grace = g_census_grace_s.load();
  while (grace < deadline_.census_grace_s && !g_census_grace_s.compare_exchange_weak(grace, deadline_.census_grace_s)) {
  }
  if (census_ == MPI_COMM_NULL) {  // no private communicator yet to ask the others on
    std::ostringstream message;
    message << call << " gave up after " << static_cast<int64_t>(waited_s * 10) / 10.0
            << " s (SHARDCKPT_COLLECTIVE_TIMEOUT_S=" << deadline_.timeout_s
            << "): some rank never reached it (exited, crashed, or took another path before its first "
               "shardckpt call)";
    broken_status_ = Status(Code::kDeadlineExceeded, message.str());
    SC_LOG(kError) << broken_status_.message();
    return broken_status_;
  }
  // Receives from silent ranks stay posted after we give up (MPI cannot be relied on to cancel
  // them), so their buffer must never be freed: a late answer would land in freed memory.
  std::vector<long long>& answers = *new std::vector<long long>(size_, -1);
  std::vector<MPI_Request> receives(size_, MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    SendForever(sequence_, r, kQueryTag, census_);
    MPI_Irecv(&answers[r], 1, MPI_LONG_LONG, r, kAnswerTag, census_, &receives[r]);
  }
  const auto start = Clock::now();
  std::vector<bool> answered(size_, false);
  answered[rank_] = true;
  answers[rank_] = CensusAnswer(sequence_, call);
  // Every answer in, this rank still answers until the grace is over: a rank it asked, or one
  // whose own deadline passed a moment later, starts its census now, and a query that came after
  // this rank stopped listening named it as "never reached it" (seen under a loaded CI run).
  bool all = false;
  while (Seconds(start) < deadline_.census_grace_s) {
    AnswerQueries();
    if (!all) {
      all = true;
      for (int r = 0; r < size_; ++r) {
        if (answered[r]) continue;
        int done = 0;
        MPI_Test(&receives[r], &done, MPI_STATUS_IGNORE);
        answered[r] = done != 0;
        all = all && answered[r];
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  AnswerQueries();

  std::vector<int> missing, elsewhere, other_call;
  for (int r = 0; r < size_; ++r) {
    if (!answered[r]) {
      missing.push_back(r);
    } else if (AnsweredSequence(answers[r]) != sequence_) {
      elsewhere.push_back(r);
    } else if (answers[r] != answers[rank_]) {
      other_call.push_back(r);
    }
  }
  constexpr size_t kNamed = 8;  // a job of thousands of ranks: a line, not 100 KB per rank
  std::ostringstream message;
  message << call << " on rank " << rank_ << " gave up after " << static_cast<int64_t>(waited_s * 10) / 10.0
          << " s (collective #" << sequence_ << ", SHARDCKPT_COLLECTIVE_TIMEOUT_S=" << deadline_.timeout_s << "): ";
  if (!missing.empty()) {
    // Sequence numbers are not compared here: a rank may legitimately run ahead past rooted
    // collectives (a gather's senders finish before its root), so only silence is evidence.
    message << (missing.size() == 1 ? "rank " : "ranks ") << RankList(missing)
            << " never reached it (exited, crashed, or stuck outside the collective)";
  } else if (!elsewhere.empty()) {
    // Not always a program bug: a rank slower than the deadline (I/O stalled in a save) makes
    // another give up on an earlier collective, after which the two stand at different numbers.
    message << "every rank is alive, but";
    for (size_t i = 0; i < std::min(elsewhere.size(), kNamed); ++i) {
      const char* theirs = AnsweredCall(answers[elsewhere[i]]);
      message << (i == 0 ? " " : ", ") << "rank " << elsewhere[i] << " is at collective #"
              << AnsweredSequence(answers[elsewhere[i]]) << (*theirs ? " (" : "") << theirs << (*theirs ? ")" : "");
    }
    if (elsewhere.size() > kNamed) message << " and " << elsewhere.size() - kNamed << " more ranks elsewhere";
    message << " where this rank is at #" << sequence_ << " (" << call << ")";
    message << ": a rank slower than the deadline (raise SHARDCKPT_COLLECTIVE_TIMEOUT_S), which made a rank give "
               "up on an earlier collective, or a rank that skipped or added a call";
  } else if (!other_call.empty()) {
    // The same number of collectives, but not the same one: the ranks run different code (one
    // in a save, another in a load), so no transport is to blame.
    message << "every rank is alive at collective #" << sequence_ << ", but";
    for (size_t i = 0; i < std::min(other_call.size(), kNamed); ++i) {
      const char* theirs = AnsweredCall(answers[other_call[i]]);
      message << (i == 0 ? " " : ", ") << "rank " << other_call[i] << " is in " << (*theirs ? theirs : "another call");
    }
    if (other_call.size() > kNamed) message << " and " << other_call.size() - kNamed << " more ranks in other calls";
    message << " where this rank is in " << call
            << ": the ranks are making different calls (one saving while another loads, or a rank that skipped "
               "or added a call)";
  } else {
    message << "every rank is alive and in this collective, yet it did not complete (the MPI transport is stuck)";
  }
  broken_status_ = Status(Code::kDeadlineExceeded, message.str());
  SC_LOG(kError) << broken_status_.message();
  return broken_status_;
}

}  // namespace shardckpt
