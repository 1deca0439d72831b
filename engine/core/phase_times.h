// Where a save's or a load's time went on this rank, phase by phase.
//
// Why: a slow checkpoint on a cluster is slow in one place (the shared filesystem's metadata
// calls, rank 0's commit, the planner, the reads, waiting for a late rank) and an operator needs
// to know which without a profiler; the benchmarks print the same figures to explain their
// ratios. Taking a lap costs one clock read.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace shardckpt {

struct PhaseTime {
  std::string name;
  double seconds = 0;
};

// Appends, at each Lap, the time since the previous lap (or since construction).
class PhaseClock {
 public:
  explicit PhaseClock(std::vector<PhaseTime>* out) : out_(out), last_(std::chrono::steady_clock::now()) {}
  void Lap(const char* name) {
    const auto now = std::chrono::steady_clock::now();
    if (out_ != nullptr) out_->push_back(PhaseTime{name, std::chrono::duration<double>(now - last_).count()});
    last_ = now;
  }

 private:
  std::vector<PhaseTime>* out_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace shardckpt
