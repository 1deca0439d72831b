// A deterministic synthetic classification stream: batch `step` is a pure function of (seed,
// step), so the data position in a checkpoint is just the step, and any rank count sees the same
// global batch (each rank takes its torch.chunk part of it).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace shardckpt::train {

struct Batch {
  at::Tensor x;  // [rows, features] float32
  at::Tensor y;  // [rows] int64 class labels
  int64_t first_row = 0;     // of this rank's rows in the global batch
  int64_t global_rows = 0;
};

class SyntheticData {
 public:
  SyntheticData(uint64_t seed, int64_t features, int64_t classes);
  // This rank's rows of global batch `step` (global_batch rows split torch.chunk style).
  Batch Get(int64_t step, int64_t global_batch, int world, int rank) const;

 private:
  uint64_t seed_;
  int64_t features_;
  at::Tensor teacher_;  // [classes, features]
};

}  // namespace shardckpt::train
