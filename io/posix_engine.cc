// pread/pwrite engine: each operation runs to completion inside Submit (through the library's one
// pread/pwrite loop, io/fs.h), and Reap hands the results back in order. It is the fallback, so it keeps the exact semantics of the io_uring
// engine (per-operation errors, short transfers resumed, EOF on read is DataLoss).
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
    bool cut = options_.simulate_short_transfers;
    return TransferFullyAt(op.kind == IoKind::kWrite, file.fd(), op.buffer, op.length, op.offset, file.path(),
                           [&](size_t* moved) { return Completed(file, op, moved, &cut); });
  }

  std::deque<std::pair<uint64_t, Status>> done_;
};

}  // namespace

std::unique_ptr<IoEngine> CreatePosixEngine(IoOptions options) {
  return std::make_unique<PosixEngine>(options);
}

}  // namespace shardckpt
