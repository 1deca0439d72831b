// A small MLP trained fully sharded, ZeRO-3 / FSDP1 style. All parameters live in one flat
// vector of P elements; rank r owns elements [r*ceil(P/W), ...) of it (the flat parameter, cut
// through parameters and rows) together with the AdamW moments of those elements. Each step
// all-gathers the flat parameter, runs forward and backward on the rank's part of the batch, and
// reduce-scatters the flat gradient so every rank updates only its own shard.
//
// For checkpoints, each parameter's part of a rank's shard is a FlatRange piece of that
// parameter (possibly empty), so any world size can load it in any layout.
//
// On a CUDA device (a CUDA build of libtorch), the shard, the moments and the compute live on
// the device, the all-gather and reduce-scatter run over `data_comm` (NCCL) on device memory,
// and checkpoints save those device tensors through shardckpt's pinned staging path.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/model/state.h"
#include "launch/train/synthetic_data.h"

namespace shardckpt::train {

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in the flat parameter
  int64_t numel = 0;
};

struct AdamWConfig {
  double peak_lr = 3e-3, min_lr_ratio = 0.1, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.01;
  int64_t warmup_steps = 5, horizon_steps = 100;
};

// Linear warmup to peak, then cosine decay to min_lr_ratio * peak at horizon_steps.
double LearningRate(const AdamWConfig& config, int64_t step);

class FsdpMlp {
 public:
  // `comm` carries host data (the loss), `data_comm` the parameter and gradient collectives on
  // `device`'s memory (the same MPI communicator on the CPU, NCCL on a GPU).
  FsdpMlp(Communicator* comm, Communicator* data_comm, at::Device device, int64_t features, int64_t hidden,
          int64_t classes, double dropout, uint64_t seed);

  // One optimizer step on this rank's part of `batch`; returns the global mean loss.
  // `before_update`, when given, runs after the backward pass and the gradient reduce-scatter,
  // right before the AdamW update changes the shard, the moments and optim.step (an async save's
  // Fence: the copy of the state may run until then); its error fails the step unchanged.
  Result<float> TrainStep(const Batch& batch, int64_t global_batch, int64_t step, const AdamWConfig& config,
                          const std::function<Status()>& before_update = nullptr);

  // Adds this rank's shards: model.<name>, optim.<name>.exp_avg, optim.<name>.exp_avg_sq and
  // optim.step. `model_only` adds just the weights (for --resume-weights-only).
  Status AddToState(ShardedState& state, bool model_only);
  // The full parameters, gathered (every rank gets them).
  Result<std::vector<at::Tensor>> GatherParameters();

  const std::vector<ParamSpec>& params() const { return params_; }
  // Dropout draws masks for the whole global batch from one stream that is identical on every
  // rank, and each rank applies its rows: the masks do not depend on the world size, so a run
  // resumed at another world size differs only in the order of floating-point reductions.
  at::Generator& dropout_generator() { return dropout_gen_; }
  int64_t optimizer_step() const { return optimizer_step_; }
  void ResetOptimizer();
  // Call after a load has written into the buffers AddToState handed out.
  void AfterLoad();

 private:
  at::Tensor Forward(const std::vector<at::Tensor>& p, const Batch& batch);

  Communicator* comm_;
  Communicator* data_comm_;
  at::Device device_;
  double dropout_;
  std::vector<ParamSpec> params_;
  int64_t total_ = 0, chunk_ = 0, begin_ = 0, end_ = 0;
  at::Tensor shard_, exp_avg_, exp_avg_sq_;  // [chunk_] each; elements past end_-begin_ are padding
  int64_t optimizer_step_ = 0;
  at::Tensor optimizer_step_tensor_;  // int64 scalar mirror of optimizer_step_ for checkpoints
  at::Generator dropout_gen_;
};

}  // namespace shardckpt::train
