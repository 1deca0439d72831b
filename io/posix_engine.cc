// pread/pwrite engine: each operation runs to completion inside Submit, and Reap hands the
// results back in order. It is the fallback, so it keeps the exact semantics of the io_uring
// engine (per-operation errors, short transfers resumed, EOF on read is DataLoss).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <utility>

#include "shardckpt/io/io_engine.h"

namespace shardckpt {
namespace {

class PosixEngine final : public IoEngine {
 public:
  explicit PosixEngine(IoOptions options) : IoEngine(options) {}
  const char* name() const override { return "posix"; }
  size_t in_flight() const override { return done_.size(); }

  Status Submit(File* file, const IoOp& op, uint64_t tag) override {
    if (in_flight() >= queue_depth()) return Internal("posix engine: queue full");
    SC_RETURN_IF_ERROR(CheckSubmit(*file, op));
    done_.emplace_back(tag, Run(*file, op));
    return Status::Ok();
  }

  Result<uint64_t> Reap() override {
    if (done_.empty()) return Internal("posix engine: reap with nothing in flight");
    auto [tag, status] = std::move(done_.front());
    done_.pop_front();
    if (!status.ok()) return status;
    return tag;
  }

 private:
  Status Run(const File& file, const IoOp& op) {
    auto* bytes = static_cast<unsigned char*>(op.buffer);
    size_t done = 0;
    bool cut = options_.simulate_short_transfers;
    while (done < op.length) {
      size_t want = std::min(op.length - done, kMaxTransferBytes);
      ssize_t n = op.kind == IoKind::kRead
                      ? ::pread(file.fd(), bytes + done, want, op.offset + done)
                      : ::pwrite(file.fd(), bytes + done, want, op.offset + done);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return OpError(file, op, errno);
      }
      if (n == 0) return NothingTransferred(file, op, done);
      size_t got = static_cast<size_t>(n);
      SC_RETURN_IF_ERROR(Completed(file, op, &got, &cut));
      done += got;
    }
    return Status::Ok();
  }

  std::deque<std::pair<uint64_t, Status>> done_;
};

}  // namespace

std::unique_ptr<IoEngine> CreatePosixEngine(IoOptions options) {
  return std::make_unique<PosixEngine>(options);
}

}  // namespace shardckpt
