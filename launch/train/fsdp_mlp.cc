#include "launch/train/fsdp_mlp.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <cmath>

#include "shardckpt/engine/torch/torch_adapter.h"

namespace shardckpt::train {

double LearningRate(const AdamWConfig& c, int64_t step) {
  if (step <= c.warmup_steps) return c.peak_lr * static_cast<double>(step) / static_cast<double>(c.warmup_steps);
  double progress = std::min(1.0, static_cast<double>(step - c.warmup_steps) /
                                      static_cast<double>(std::max<int64_t>(1, c.horizon_steps - c.warmup_steps)));
  double cosine = 0.5 * (1.0 + std::cos(M_PI * progress));
  return c.peak_lr * (c.min_lr_ratio + (1.0 - c.min_lr_ratio) * cosine);
}

FsdpMlp::FsdpMlp(Communicator* comm, Communicator* data_comm, at::Device device, int64_t features, int64_t hidden,
                 int64_t classes, double dropout, uint64_t seed)
    : comm_(comm), data_comm_(data_comm), device_(device), dropout_(dropout) {
  const std::vector<std::pair<std::string, std::vector<int64_t>>> layers = {
      {"fc1.weight", {hidden, features}}, {"fc1.bias", {hidden}},  {"fc2.weight", {hidden, hidden}},
      {"fc2.bias", {hidden}},             {"fc3.weight", {hidden, hidden}}, {"fc3.bias", {hidden}},
      {"head.weight", {classes, hidden}}, {"head.bias", {classes}}};
  for (const auto& [name, shape] : layers) {
    int64_t numel = 1;
    for (int64_t d : shape) numel *= d;
    params_.push_back(ParamSpec{name, shape, total_, numel});
    total_ += numel;
  }
  const int world = comm->size(), rank = comm->rank();
  chunk_ = (total_ + world - 1) / world;
  begin_ = std::min(total_, chunk_ * rank);
  end_ = std::min(total_, begin_ + chunk_);
  // Every rank draws the same full initialization, then keeps its shard.
  at::Generator init = at::detail::createCPUGenerator(seed);
  at::Tensor flat = at::zeros({chunk_ * world});
  for (const ParamSpec& p : params_) {
    double scale = p.shape.size() == 2 ? 1.0 / std::sqrt(static_cast<double>(p.shape[1])) : 0.0;
    flat.slice(0, p.offset, p.offset + p.numel).copy_(at::randn({p.numel}, init) * scale);
  }
  shard_ = flat.slice(0, chunk_ * rank, chunk_ * (rank + 1)).clone().to(device_);
  ResetOptimizer();
  dropout_gen_ = at::detail::createCPUGenerator(seed * 7919 + 1);
}

void FsdpMlp::AfterLoad() { optimizer_step_ = optimizer_step_tensor_.item<int64_t>(); }

void FsdpMlp::ResetOptimizer() {
  exp_avg_ = at::zeros({chunk_}, at::TensorOptions().device(device_));
  exp_avg_sq_ = at::zeros({chunk_}, at::TensorOptions().device(device_));
  optimizer_step_ = 0;
  optimizer_step_tensor_ = at::zeros({}, at::kLong);
}

at::Tensor FsdpMlp::Forward(const std::vector<at::Tensor>& p, const Batch& batch) {
  at::Tensor h = batch.x.to(device_);
  for (int layer = 0; layer < 3; ++layer) {
    h = at::gelu(at::linear(h, p[2 * layer], p[2 * layer + 1]));
    if (dropout_ > 0) {
      at::Tensor all = at::bernoulli(at::full({batch.global_rows, h.size(1)}, 1.0 - dropout_), dropout_gen_);
      at::Tensor keep = all.slice(0, batch.first_row, batch.first_row + h.size(0)).to(device_);
      h = h * keep / (1.0 - dropout_);
    }
  }
  return at::linear(h, p[6], p[7]);
}

Result<std::vector<at::Tensor>> FsdpMlp::GatherParameters() {
  const int world = comm_->size();
  at::Tensor flat = at::empty({chunk_ * world}, at::TensorOptions().device(device_));
  SC_RETURN_IF_ERROR(data_comm_->AllGatherFloat(shard_.data_ptr<float>(), static_cast<size_t>(chunk_), flat.data_ptr<float>()));
  std::vector<at::Tensor> out;
  for (const ParamSpec& p : params_) out.push_back(flat.slice(0, p.offset, p.offset + p.numel).view(p.shape));
  return out;
}

Result<float> FsdpMlp::TrainStep(const Batch& batch, int64_t global_batch, int64_t step, const AdamWConfig& c,
                                 const std::function<Status()>& before_update) {
  SC_ASSIGN_OR_RETURN(std::vector<at::Tensor> full, GatherParameters());
  for (at::Tensor& p : full) p = p.detach().requires_grad_(true);
  at::Tensor logits = Forward(full, batch);
  // Sum over this rank's rows / global batch: the reduce-scatter sum is then the global mean.
  at::Tensor loss = at::cross_entropy_loss(logits, batch.y.to(device_), {}, at::Reduction::Sum) / static_cast<double>(global_batch);
  loss.backward();
  const int world = comm_->size();
  at::Tensor grads = at::zeros({chunk_ * world}, at::TensorOptions().device(device_));
  for (size_t i = 0; i < params_.size(); ++i) {
    grads.slice(0, params_[i].offset, params_[i].offset + params_[i].numel).copy_(full[i].grad().reshape({-1}));
  }
  at::Tensor grad = at::empty({chunk_}, at::TensorOptions().device(device_));
  SC_RETURN_IF_ERROR(data_comm_->ReduceScatterSumFloat(grads.data_ptr<float>(), grad.data_ptr<float>(), static_cast<size_t>(chunk_)));
  double loss_sum = loss.item<double>();
  SC_RETURN_IF_ERROR(comm_->AllReduceSumDouble(&loss_sum, 1));
  if (before_update) SC_RETURN_IF_ERROR(before_update());

  // AdamW on this rank's shard; padding elements stay zero (their gradient is zero).
  ++optimizer_step_;
  optimizer_step_tensor_.fill_(optimizer_step_);
  double lr = LearningRate(c, step);
  double bias1 = 1.0 - std::pow(c.beta1, static_cast<double>(optimizer_step_));
  double bias2 = 1.0 - std::pow(c.beta2, static_cast<double>(optimizer_step_));
  exp_avg_.mul_(c.beta1).add_(grad, 1.0 - c.beta1);
  exp_avg_sq_.mul_(c.beta2).addcmul_(grad, grad, 1.0 - c.beta2);
  shard_.mul_(1.0 - lr * c.weight_decay);
  at::Tensor denom = (exp_avg_sq_ / bias2).sqrt_().add_(c.eps);
  shard_.addcdiv_(exp_avg_, denom, -lr / bias1);
  return static_cast<float>(loss_sum);
}

Status FsdpMlp::AddToState(ShardedState& state, bool model_only) {
  // Each parameter's part of [begin_, end_) as a FlatRange of that parameter.
  for (const ParamSpec& p : params_) {
    int64_t lo = std::max(begin_, p.offset), hi = std::min(end_, p.offset + p.numel);
    const bool empty = hi <= lo;
    if (empty) hi = lo = std::clamp(begin_, p.offset, p.offset + p.numel);
    Layout layout = Layout::FlatRange(lo - p.offset, hi - p.offset);
    Shape shape(p.shape.begin(), p.shape.end());
    auto piece = [&](const at::Tensor& t) { return empty ? t.slice(0, 0, 0) : t.slice(0, lo - begin_, hi - begin_); };
    SC_RETURN_IF_ERROR(AddTorchTensor(state, "model." + p.name, piece(shard_), layout, shape));
    if (model_only) continue;
    SC_RETURN_IF_ERROR(AddTorchTensor(state, "optim." + p.name + ".exp_avg", piece(exp_avg_), layout, shape));
    SC_RETURN_IF_ERROR(AddTorchTensor(state, "optim." + p.name + ".exp_avg_sq", piece(exp_avg_sq_), layout, shape));
  }
  if (!model_only) SC_RETURN_IF_ERROR(AddTorchTensor(state, "optim.step", optimizer_step_tensor_));
  return Status::Ok();
}

}  // namespace shardckpt::train
