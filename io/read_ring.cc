#include "shardckpt/io/read_ring.h"

#include <algorithm>

namespace shardckpt {

void ReadRing::ReapOne() {
  Result<uint64_t> tag = io_->Reap();
  if (!tag.ok()) {
    if (failure_.ok()) failure_ = tag.status();
    return;
  }
  const size_t buffer = *tag;
  if (failure_.ok()) {
    const unsigned char* data = into_[buffer] != nullptr ? into_[buffer] : pool_->at(buffer).data();
    failure_ = on_read_(request_in_[buffer], data);
  }
  request_in_[buffer] = kFree;
  into_[buffer] = nullptr;
}

Status ReadRing::Read(File* file, uint64_t offset, size_t length, size_t request, unsigned char* into) {
  if (length > pool_->buffer_bytes() && failure_.ok()) failure_ = Internal("read extent larger than a staging buffer");
  if (!failure_.ok()) return failure_;
  const size_t buffer = next_;
  next_ = (next_ + 1) % pool_->count();
  while (request_in_[buffer] != kFree && failure_.ok()) ReapOne();
  if (!failure_.ok()) return failure_;
  request_in_[buffer] = request;
  into_[buffer] = into;
  failure_ = io_->Submit(file, IoOp{IoKind::kRead, offset, into != nullptr ? into : pool_->at(buffer).data(), length}, buffer);
  if (!failure_.ok()) {
    request_in_[buffer] = kFree;
    into_[buffer] = nullptr;
  }
  return failure_;
}

Status ReadRing::Finish() {
  while (io_->in_flight() > 0) ReapOne();
  // A failed read comes back without its tag: nothing is in flight now, so every buffer is free.
  std::fill(request_in_.begin(), request_in_.end(), kFree);
  std::fill(into_.begin(), into_.end(), nullptr);
  Status failure = failure_;
  failure_ = Status::Ok();
  return failure;
}

}  // namespace shardckpt
