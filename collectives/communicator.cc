#include "shardckpt/collectives/communicator.h"

#include <cstring>

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

Status AgreeOnStatus(Communicator& comm, const Status& local) {
  std::vector<std::string> all;
  SC_RETURN_IF_ERROR(comm.AllGather(EncodeStatus(local), &all));
  Status first;
  std::string message;
  for (size_t r = 0; r < all.size(); ++r) {
    Status status = DecodeStatus(all[r]);
    if (status.ok()) continue;
    if (first.ok()) first = status;
    if (!message.empty()) message += "; ";
    message += "rank " + std::to_string(r) + ": " + status.ToString();
  }
  if (first.ok()) return Status::Ok();
  return Status(first.code(), message);
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

}  // namespace shardckpt
