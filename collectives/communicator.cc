#include "shardckpt/collectives/communicator.h"

#include <cstdlib>
#include <cstring>

#include "shardckpt/io/log.h"

namespace shardckpt {
namespace {

std::string EncodeStatus(const Status& status) {
  std::string out(1, static_cast<char>(status.code()));
  out += status.message();
  return out;
}

Status DecodeStatus(const std::string& bytes) {
  if (bytes.empty()) return Internal("empty status message from a peer");
  Code code = static_cast<Code>(static_cast<unsigned char>(bytes[0]));
  if (code == Code::kOk) return Status::Ok();
  return Status(code, bytes.substr(1));
}

class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* name() const override { return "single-process"; }
  bool thread_safe() const override { return true; }
  Status Barrier() override { return Status::Ok(); }
  Status Broadcast(void*, size_t, int) override { return Status::Ok(); }
  Status Gather(const std::string& mine, std::vector<std::string>* all, int) override {
    *all = {mine};
    return Status::Ok();
  }
  Status AllGather(const std::string& mine, std::vector<std::string>* all) override {
    *all = {mine};
    return Status::Ok();
  }
  Status AllReduceMaxInt64(int64_t*, size_t) override { return Status::Ok(); }
  Status AllReduceSumDouble(double*, size_t) override { return Status::Ok(); }
  Status AllGatherFloat(const float* send, size_t count, float* recv) override {
    if (send != recv) std::memmove(recv, send, count * sizeof(float));
    return Status::Ok();
  }
  Status ReduceScatterSumFloat(const float* send, float* recv, size_t count) override {
    if (send != recv) std::memmove(recv, send, count * sizeof(float));
    return Status::Ok();
  }
  Result<std::unique_ptr<Communicator>> Duplicate() override {
    return std::unique_ptr<Communicator>(new SingleProcessCommunicator());
  }
};

}  // namespace

std::unique_ptr<Communicator> CreateSingleProcessCommunicator() {
  return std::make_unique<SingleProcessCommunicator>();
}

std::string RankRanges(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

Status MergeRankStatuses(const std::vector<Status>& by_rank) {
  std::vector<const Status*> causes;         // distinct failures, in order of first appearance
  std::vector<std::vector<int>> ranks_of;    // by cause
  for (size_t r = 0; r < by_rank.size(); ++r) {
    const Status& status = by_rank[r];
    if (status.ok()) continue;
    size_t c = 0;
    while (c < causes.size() && !(causes[c]->code() == status.code() && causes[c]->message() == status.message())) ++c;
    if (c == causes.size()) {
      causes.push_back(&status);
      ranks_of.emplace_back();
    }
    ranks_of[c].push_back(static_cast<int>(r));
  }
  if (causes.empty()) return Status::Ok();
  // The merged status carries the first failure's code; a cause with that code is given by its
  // message alone, so it does not read "NoSpace: rank 2: NoSpace: ...".
  const Code code = causes[0]->code();
  std::string message;
  for (size_t c = 0; c < causes.size(); ++c) {
    if (c > 0) message += "; ";
    const Status& cause = *causes[c];
    message += RankRanges(ranks_of[c]) + ": ";
    if (cause.message().empty()) message += CodeName(cause.code());
    else message += cause.code() == code ? cause.message() : cause.ToString();
  }
  return Status(code, message);
}

Status AgreeOnStatus(Communicator& comm, const Status& local) {
  std::vector<std::string> all;
  SC_RETURN_IF_ERROR(comm.AllGather(EncodeStatus(local), &all));
  std::vector<Status> by_rank;
  by_rank.reserve(all.size());
  for (const std::string& bytes : all) by_rank.push_back(DecodeStatus(bytes));
  return MergeRankStatuses(by_rank);
}

Status CheckGatherSizes(const std::vector<int64_t>& lengths, int64_t limit) {
  int64_t total = 0;
  for (size_t r = 0; r < lengths.size(); ++r) {
    if (lengths[r] > limit) {
      return InvalidArgument("gather: rank " + std::to_string(r) + " sends " + std::to_string(lengths[r]) +
                             " bytes, over the limit of " + std::to_string(limit) + " bytes per message");
    }
    total += lengths[r];
    if (total > limit) {
      return InvalidArgument("gather: " + std::to_string(total) + " bytes from ranks 0.." + std::to_string(r) +
                             " together, over the limit of " + std::to_string(limit) + " bytes per gather");
    }
  }
  return Status::Ok();
}

Status BroadcastString(Communicator& comm, std::string* text, int root) {
  uint64_t length = text->size();
  SC_RETURN_IF_ERROR(comm.Broadcast(&length, sizeof(length), root));
  if (comm.rank() != root) text->assign(length, '\0');
  if (length > 0) SC_RETURN_IF_ERROR(comm.Broadcast(text->data(), length, root));
  return Status::Ok();
}

Status BroadcastStatus(Communicator& comm, const Status& local, int root) {
  std::string bytes = comm.rank() == root ? EncodeStatus(local) : std::string();
  SC_RETURN_IF_ERROR(BroadcastString(comm, &bytes, root));
  return DecodeStatus(bytes);
}

double CollectiveTimeoutFromEnvironment() {
  const char* text = std::getenv("SHARDCKPT_COLLECTIVE_TIMEOUT_S");
  if (text == nullptr) return 1800;
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  // A deadline past 30 years (or "inf") is meant as none: as a wait's duration in nanoseconds it
  // would overflow and expire at once.
  constexpr double kNoDeadlineAbove = 1e9;
  if (end != text && *end == '\0' && value >= 0) return value > kNoDeadlineAbove ? 0 : value;
  LogOnce(LogLevel::kWarn, "collective-timeout-env",
          std::string("ignoring SHARDCKPT_COLLECTIVE_TIMEOUT_S='") + text + "' (want seconds >= 0); using 1800");
  return 1800;
}

}  // namespace shardckpt
