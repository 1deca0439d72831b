// io_uring engine. One ring per engine, shared by every file the engine has open, with one slot
// per possible in-flight operation; a slot's index is the SQE's user_data.
//
// Completion handling follows liburing's io_uring-cp example: -EAGAIN/-EINTR resubmit the same
// range; a short transfer resubmits the remainder; any other negative result fails that one
// operation (named in the Status) and frees its slot, leaving the others to be reaped.
//
// A slot is free exactly when the kernel holds no request of it, so a failure that frees it must
// first make sure of that: when io_uring_submit fails, the request just prepared may still sit in
// the submission ring, and the next submit would send it with the index of a slot that by then
// belongs to another operation. It is turned into a no-op whose completion is dropped.
#include <liburing.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/io_engine.h"

namespace shardckpt {
namespace {

// user_data of a request voided after a failed submit; never a slot index.
constexpr uint64_t kVoided = ~uint64_t{0};
// Waits in a row that find the ring busy (EBUSY, EAGAIN) before the wait counts as failed:
// about a second.
constexpr int kMaxBusyWaits = 1000;

struct Slot {
  File* file = nullptr;
  IoOp op;
  size_t done = 0;
  uint64_t tag = 0;
  bool cut_pending = false;
};

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(IoOptions options) : IoEngine(options), slots_(options.queue_depth) {
    for (size_t i = slots_.size(); i > 0; --i) free_.push_back(i - 1);
  }
  ~UringEngine() override {
    if (initialized_) {
      Drain().IgnoreError();  // the owner already saw or no longer cares about these results
      io_uring_queue_exit(&ring_);
    }
  }

  Status Init() {
    int rc = io_uring_queue_init(static_cast<unsigned>(queue_depth()), &ring_, 0);
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_queue_init");
    initialized_ = true;
    return Status::Ok();
  }

  const char* name() const override { return "io_uring"; }
  size_t in_flight() const override { return slots_.size() - free_.size(); }

  Status Submit(File* file, const IoOp& op, uint64_t tag) override {
    if (free_.empty()) return Internal("io_uring engine: queue full");
    SC_RETURN_IF_ERROR(CheckSubmit(*file, op));
    size_t index = free_.back();
    free_.pop_back();
    slots_[index] = Slot{file, op, 0, tag, options_.simulate_short_transfers};
    Status queued = Queue(index);
    if (!queued.ok()) free_.push_back(index);
    return queued;
  }

  Result<uint64_t> Reap() override {
    int busy_waits = 0;
    while (true) {
      if (in_flight() == 0) return Internal("io_uring engine: reap with nothing in flight");
      struct io_uring_cqe* cqe = nullptr;
      const int injected = FailpointErrno(FailpointAction("io.uring_wait"));
      const int rc = injected != 0 ? -injected : io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      // A ring short of room for completions clears as soon as the kernel flushes them.
      if ((rc == -EBUSY || rc == -EAGAIN) && ++busy_waits <= kMaxBusyWaits) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        continue;
      }
      if (rc < 0) {
        return ErrnoStatus(-rc, std::string("io_uring_wait_cqe") + (injected ? " [injected at failpoint io.uring_wait]" : ""));
      }
      uint64_t data = io_uring_cqe_get_data64(cqe);
      int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      if (data == kVoided) continue;
      size_t index = static_cast<size_t>(data);
      Slot& slot = slots_[index];
      if (res == -EAGAIN || res == -EINTR) {
        Status queued = Queue(index);
        if (!queued.ok()) return Free(index, queued);
        continue;
      }
      if (res < 0) return Free(index, OpError(*slot.file, slot.op, -res));
      size_t got = static_cast<size_t>(res);
      if (got == 0 && slot.done < slot.op.length) {
        return Free(index, NothingTransferred(*slot.file, slot.op, slot.done));
      }
      Status completed = Completed(*slot.file, slot.op, &got, &slot.cut_pending);
      if (!completed.ok()) return Free(index, completed);
      slot.done += got;
      if (slot.done < slot.op.length) {
        Status queued = Queue(index);
        if (!queued.ok()) return Free(index, queued);
        continue;
      }
      free_.push_back(index);
      return slot.tag;
    }
  }

 private:
  Status Free(size_t index, Status status) {
    free_.push_back(index);
    return status;
  }

  // Sends the rest of slot `index`'s operation (at most kMaxTransferBytes of it) to the kernel.
  // On failure no request of the slot is left in the ring.
  Status Queue(size_t index) {
    Slot& slot = slots_[index];
    struct io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      // Only voided requests can fill the ring: send them on their way.
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return OpError(*slot.file, slot.op, EAGAIN).WithContext("io_uring submission queue full");
    }
    auto* buffer = static_cast<unsigned char*>(slot.op.buffer) + slot.done;
    auto length = static_cast<unsigned>(std::min(slot.op.length - slot.done, kMaxTransferBytes));
    uint64_t offset = slot.op.offset + slot.done;
    if (slot.op.kind == IoKind::kRead) {
      io_uring_prep_read(sqe, slot.file->fd(), buffer, length, offset);
    } else {
      io_uring_prep_write(sqe, slot.file->fd(), buffer, length, offset);
    }
    io_uring_sqe_set_data64(sqe, index);
    int rc;
    do {
      int injected = FailpointErrno(FailpointAction("io.uring_submit"));
      rc = injected != 0 ? -injected : io_uring_submit(&ring_);
    } while (rc == -EINTR);
    // The kernel takes requests in order, so ours was taken iff nothing is left unsubmitted.
    if (io_uring_sq_ready(&ring_) == 0) return Status::Ok();
    io_uring_prep_nop(sqe);
    io_uring_sqe_set_data64(sqe, kVoided);
    return OpError(*slot.file, slot.op, rc < 0 ? -rc : EAGAIN).WithContext("io_uring_submit");
  }

  struct io_uring ring_;
  bool initialized_ = false;
  std::vector<Slot> slots_;
  std::vector<size_t> free_;
};

}  // namespace

Result<std::unique_ptr<IoEngine>> CreateUringEngine(IoOptions options) {
  if (options.queue_depth == 0) options.queue_depth = 1;
  auto engine = std::make_unique<UringEngine>(options);
  SC_RETURN_IF_ERROR(engine->Init());
  return std::unique_ptr<IoEngine>(std::move(engine));
}

}  // namespace shardckpt
