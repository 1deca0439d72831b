// One error type for the whole library. errno and MPI codes are converted into it once, at the
// boundary where they arise; everything above passes Status/Result by value and never throws.
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace shardckpt {

enum class Code {
  kOk = 0,
  kInvalidArgument,    // the caller's input is wrong (bad layout, name, flag)
  kNotFound,           // a file, entry or checkpoint does not exist
  kAlreadyExists,      // a checkpoint of that step is committed already
  kDataLoss,           // bytes on disk are corrupt or truncated (checksum, size)
  kIoError,            // the OS refused an I/O call
  kNoSpace,            // ENOSPC / EDQUOT: kept apart so operators see "disk full" at once
  kFailedPrecondition, // state is wrong for the call (lock held, wrong world size)
  kUnimplemented,
  kInternal,
  kAborted,            // another rank failed; this rank stopped with it
  kDeadlineExceeded,   // a collective timed out waiting for a rank
};

const char* CodeName(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;
  // Prefixes the message with where it happened ("rank 2: ", "load model.w: ") and keeps the code.
  Status WithContext(const std::string& context) const;
  // Makes ignoring an error explicit and greppable.
  void IgnoreError() const {}

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return Status(Code::kInvalidArgument, std::move(m)); }
inline Status NotFound(std::string m) { return Status(Code::kNotFound, std::move(m)); }
inline Status DataLoss(std::string m) { return Status(Code::kDataLoss, std::move(m)); }
inline Status Internal(std::string m) { return Status(Code::kInternal, std::move(m)); }
inline Status FailedPrecondition(std::string m) {
  return Status(Code::kFailedPrecondition, std::move(m));
}

// Converts an errno value into a Status; `what` names the call and the file.
Status ErrnoStatus(int err, const std::string& what);

// What Result::value() of an error does: prints the Status to stderr and aborts. A caller that
// takes the value without checking (`Create(...).value()`) learns why, where std::get's
// bad_variant_access said only "wrong index for variant".
[[noreturn]] void AbortOnValueOfError(const Status& status);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design, like absl::StatusOr
  Result(Status status) : v_(std::move(status)) { assert(!std::get<Status>(v_).ok()); }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }
  T& value() & {
    HasValueOrAbort();
    return std::get<T>(v_);
  }
  const T& value() const& {
    HasValueOrAbort();
    return std::get<T>(v_);
  }
  // By value, so `for (x : F().value())` does not dangle.
  T value() && {
    HasValueOrAbort();
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T operator*() && { return std::move(*this).value(); }

 private:
  void HasValueOrAbort() const {
    if (!ok()) AbortOnValueOfError(std::get<Status>(v_));
  }
  std::variant<T, Status> v_;
};

}  // namespace shardckpt

#define SC_CONCAT_INNER(a, b) a##b
#define SC_CONCAT(a, b) SC_CONCAT_INNER(a, b)

#define SC_RETURN_IF_ERROR(expr)                  \
  do {                                            \
    ::shardckpt::Status sc_status_ = (expr);      \
    if (!sc_status_.ok()) return sc_status_;      \
  } while (0)

#define SC_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

#define SC_ASSIGN_OR_RETURN(lhs, expr) \
  SC_ASSIGN_OR_RETURN_IMPL(SC_CONCAT(sc_result_, __LINE__), lhs, expr)
