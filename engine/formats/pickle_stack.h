// The object stack, MARKs, arena and memory budget shared by the restricted unpicklers (the
// torch.save reader in torch_pickle.cc, the DCP .metadata reader in dcp_metadata.cc): one copy of
// the bookkeeping a hostile pickle attacks first. Each reader derives from it with its own Value
// (a struct with a `Kind` enum, `kind` and an int64 `i`) and keeps its own opcodes and globals.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardckpt/io/status.h"

namespace shardckpt {

uint64_t UnpickleMemoryBudget(size_t pickle_bytes);  // torch_pickle.h

// The protocols both readers take (2 to 5), refused by number: PROTO's argument, and a pickle
// that opens without PROTO (protocols 0 and 1), whose text opcodes would otherwise be refused
// one by one, naming an opcode or a global instead of the protocol.
inline Status CheckPickleProtocol(unsigned proto) {
  if (proto >= 2 && proto <= 5) return Status::Ok();
  return InvalidArgument("pickle protocol " + std::to_string(proto) + " is not supported (2 to 5 are)");
}
inline Status RefuseProtocolZeroOrOne() {
  // Garbage lands here too: the message says both, not only the protocol.
  return InvalidArgument("not a pickle of protocol 2 to 5, which open with PROTO: a pickle of protocol 0 or 1 "
                         "(no PROTO opcode) is not supported, and the bytes may not be a pickle at all");
}

// FRAME's argument (protocol 4 and up): the frame's length, which the bytes after it must hold,
// as Python's unpickler requires ("pickle exhausted before end of frame"). Frames are read whole,
// so the header is all there is to skip.
inline Status CheckPickleFrame(uint64_t frame_length, size_t bytes_after) {
  if (frame_length <= bytes_after) return Status::Ok();
  return DataLoss("a FRAME of " + std::to_string(frame_length) + " bytes with " + std::to_string(bytes_after) +
                  " bytes left in the pickle (truncated, or not a pickle)");
}

template <typename Value>
class PickleStack {
 public:
  // Every allocation is charged here first, so a hostile pickle stops at the budget.
  Status Charge(uint64_t bytes) {
    used_ += bytes;
    if (used_ <= budget_) return Status::Ok();
    return InvalidArgument("the pickle needs more than " + std::to_string(budget_) +
                           " bytes of memory, the budget for a pickle of " + std::to_string(pickle_bytes_) +
                           " bytes (a flood of objects, or shared references fanning out); refused");
  }

 protected:
  explicit PickleStack(size_t pickle_bytes) : pickle_bytes_(pickle_bytes), budget_(UnpickleMemoryBudget(pickle_bytes)) {}

  Result<Value*> New(typename Value::Kind kind, size_t extra = 0) {
    SC_RETURN_IF_ERROR(Charge(sizeof(Value) + extra));
    if (arena_used_ == arena_block_) {
      // Small pickles (a DCP chunk's one tensor) get a small first block; large ones 1024 a block.
      const size_t block = arena_.size() < 6 ? size_t{16} << arena_.size() : kArenaBlock;
      arena_.push_back(std::make_unique<Value[]>(block));
      arena_block_ = block;  // only once the block is there
      arena_used_ = 0;
    }
    Value* v = &arena_.back()[arena_used_++];
    v->kind = kind;
    return v;
  }
  Status Push(Value* v) {
    SC_RETURN_IF_ERROR(Charge(sizeof(Value*)));
    stack_.push_back(v);
    return Status::Ok();
  }
  Status PushNew(typename Value::Kind kind, int64_t i = 0) {
    SC_ASSIGN_OR_RETURN(Value* v, New(kind));
    v->i = i;
    return Push(v);
  }
  // Objects below the innermost MARK are out of reach, as in torch's unpickler (which gives
  // each MARK a fresh stack): popping, building or filling them is refused.
  bool Reachable() const { return !stack_.empty() && (marks_.empty() || stack_.size() > marks_.back()); }
  Result<Value*> Pop() {
    if (!Reachable()) return DataLoss("stack underflow (nothing above the last MARK)");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Result<Value*> Top(const char* op) {
    if (!Reachable()) return DataLoss(std::string(op) + " with no object above the last MARK");
    return stack_.back();
  }
  Result<std::vector<Value*>> PopToMark() {
    if (marks_.empty()) return DataLoss("no MARK on the stack");
    size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<Value*> items(stack_.begin() + static_cast<long>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  // After STOP: exactly the result on the stack, no MARK open.
  Result<Value*> Final() {
    if (stack_.size() != 1 || !marks_.empty()) {
      return DataLoss("pickle ended with " + std::to_string(stack_.size()) + " values and " +
                      std::to_string(marks_.size()) + " marks on the stack");
    }
    return stack_.back();
  }

  // The memo: BINPUT, LONG_BINPUT and MEMOIZE store, BINGET and LONG_BINGET fetch. Pickles number
  // their memo 0, 1, 2, ...: those keys index a vector (8 bytes an object, where a hash map took
  // about 40 more on a .metadata of millions of memoized objects), any others a map.
  Status MemoPut(uint64_t key, Value* v) {
    if (key < memo_dense_.size()) {
      memo_dense_[key] = v;
      return Status::Ok();
    }
    if (key == memo_dense_.size()) {
      SC_RETURN_IF_ERROR(Charge(2 * sizeof(Value*)));
      memo_dense_.push_back(v);
      if (memo_sparse_.erase(key) == 0) memo_count_++;
      return Status::Ok();
    }
    SC_RETURN_IF_ERROR(Charge(64));
    if (memo_sparse_.insert_or_assign(key, v).second) memo_count_++;
    return Status::Ok();
  }
  Value* MemoGet(uint64_t key) const {
    if (key < memo_dense_.size()) return memo_dense_[key];
    auto it = memo_sparse_.find(key);
    return it == memo_sparse_.end() ? nullptr : it->second;
  }
  uint64_t memo_count() const { return memo_count_; }  // MEMOIZE's next key

  // GLOBAL's module or name: a line of at most 256 bytes from `*pos`, which moves past it.
  static Result<std::string> GlobalLine(const std::string& data, size_t* pos) {
    const size_t end = data.find('\n', *pos);
    if (end == std::string::npos || end - *pos > 256) return DataLoss("unterminated GLOBAL");
    std::string s = data.substr(*pos, end - *pos);
    *pos = end + 1;
    return s;
  }

  // Values in blocks of stable addresses (values point at each other). A std::deque's 512-byte
  // blocks held six values each: a .pt of 100,000 tensors made 250,000 of them.
  static constexpr size_t kArenaBlock = 1024;
  std::vector<std::unique_ptr<Value[]>> arena_;
  size_t arena_block_ = 0;  // values in the last block
  size_t arena_used_ = 0;   // of them, in use
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;

 private:
  std::vector<Value*> memo_dense_;
  std::map<uint64_t, Value*> memo_sparse_;
  uint64_t memo_count_ = 0;
  size_t pickle_bytes_;
  uint64_t budget_;
  uint64_t used_ = 0;
};

}  // namespace shardckpt
