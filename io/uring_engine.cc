// io_uring engine. One ring per engine, shared by every file the engine has open, with one slot
// per possible in-flight operation; a slot's index is the SQE's user_data.
//
// Completion handling follows liburing's io_uring-cp example: -EAGAIN/-EINTR resubmit the same
// range; a short transfer resubmits the remainder; any other negative result fails that one
// operation (named in the Status) and frees its slot, leaving the others to be reaped.
#include <liburing.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/io_engine.h"

namespace shardckpt {
namespace {

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
    while (true) {
      if (in_flight() == 0) return Internal("io_uring engine: reap with nothing in flight");
      struct io_uring_cqe* cqe = nullptr;
      int rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) return ErrnoStatus(-rc, "io_uring_wait_cqe");
      size_t index = static_cast<size_t>(reinterpret_cast<uintptr_t>(io_uring_cqe_get_data(cqe)));
      int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      Slot& slot = slots_[index];
      if (res == -EAGAIN || res == -EINTR) {
        SC_RETURN_IF_ERROR(Queue(index));
        continue;
      }
      if (res < 0) {
        free_.push_back(index);
        return OpError(*slot.file, slot.op, -res);
      }
      size_t remaining = slot.op.length - slot.done;
      if (res == 0 && remaining > 0) {
        free_.push_back(index);
        if (slot.op.kind == IoKind::kRead) {
          return DataLoss("read " + slot.file->path() + ": unexpected end of file at offset " +
                          std::to_string(slot.op.offset + slot.done) + " (file truncated?)");
        }
        return OpError(*slot.file, slot.op, EIO);
      }
      size_t got = static_cast<size_t>(res);
      if (slot.cut_pending && got > 1) {
        // Pretend the kernel stopped halfway; the bytes past the cut are transferred again.
        size_t cut = slot.file->direct() ? AlignDown(got / 2, kBlockSize) : got / 2;
        if (cut > 0) got = cut;
        slot.cut_pending = false;
      }
      slot.done += got;
      if (slot.done < slot.op.length) {
        SC_RETURN_IF_ERROR(Queue(index));
        continue;
      }
      free_.push_back(index);
      return slot.tag;
    }
  }

 private:
  Status Queue(size_t index) {
    Slot& slot = slots_[index];
    struct io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    if (sqe == nullptr) {
      // Cannot happen while slots <= ring entries, but a full SQ must not lose the request.
      io_uring_submit(&ring_);
      sqe = io_uring_get_sqe(&ring_);
      if (sqe == nullptr) return Internal("io_uring submission queue full");
    }
    auto* buffer = static_cast<unsigned char*>(slot.op.buffer) + slot.done;
    unsigned length = static_cast<unsigned>(slot.op.length - slot.done);
    uint64_t offset = slot.op.offset + slot.done;
    if (slot.op.kind == IoKind::kRead) {
      io_uring_prep_read(sqe, slot.file->fd(), buffer, length, offset);
    } else {
      io_uring_prep_write(sqe, slot.file->fd(), buffer, length, offset);
    }
    io_uring_sqe_set_data(sqe, reinterpret_cast<void*>(static_cast<uintptr_t>(index)));
    int rc = io_uring_submit(&ring_);
    if (rc < 0) return ErrnoStatus(-rc, "io_uring_submit " + slot.file->path());
    return Status::Ok();
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
