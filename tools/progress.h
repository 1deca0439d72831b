// A progress bar for long tool work: bytes done, rate and time left, redrawn in place on stderr
// when it is a terminal (and at most 10 times a second); silent otherwise, so scripts and
// --json output stay clean.
#pragma once

#include <cstdint>
#include <string>

namespace shardckpt::tools {

class ProgressBar {
 public:
  // `unit`: what is counted, bytes (shown in KiB, MiB, ...) or the items named (import and reshard
  // count tensors).
  explicit ProgressBar(std::string label, bool enabled, std::string unit = "");
  void Update(uint64_t done, uint64_t total);
  void Finish();

 private:
  std::string label_;
  bool enabled_;
  std::string unit_;  // "" for bytes
  double start_ = 0, last_draw_ = 0;
  bool drawn_ = false;
};

}  // namespace shardckpt::tools
