#include "shardckpt/io/status.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace shardckpt {

const char* CodeName(Code code) {
  switch (code) {
    case Code::kOk: return "OK";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kNotFound: return "NotFound";
    case Code::kAlreadyExists: return "AlreadyExists";
    case Code::kDataLoss: return "DataLoss";
    case Code::kIoError: return "IoError";
    case Code::kNoSpace: return "NoSpace";
    case Code::kFailedPrecondition: return "FailedPrecondition";
    case Code::kUnimplemented: return "Unimplemented";
    case Code::kInternal: return "Internal";
    case Code::kAborted: return "Aborted";
    case Code::kDeadlineExceeded: return "DeadlineExceeded";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

Status ErrnoStatus(int err, const std::string& what) {
  Code code = Code::kIoError;
  switch (err) {
    case ENOSPC:
    case EDQUOT: code = Code::kNoSpace; break;
    case ENOENT: code = Code::kNotFound; break;
    case EEXIST: code = Code::kAlreadyExists; break;
    case EINVAL: code = Code::kInvalidArgument; break;
    default: break;
  }
  // A checkpoint of thousands of rank files meets the default `ulimit -n` of 1024 first.
  const char* hint = err == EMFILE ? " (the process's open-file limit: raise it with `ulimit -n`)"
                     : err == ENFILE ? " (the system's open-file limit, fs.file-max)"
                                     : "";
  return Status(code, what + ": " + std::strerror(err) + " (errno " + std::to_string(err) + ")" + hint);
}

void AbortOnValueOfError(const Status& status) {
  // Not through the logger: a program error, said whatever the log level, as assert would.
  std::fprintf(stderr, "shardckpt: value() of a Result that holds an error: %s\n", status.ToString().c_str());
  std::abort();
}

}  // namespace shardckpt
