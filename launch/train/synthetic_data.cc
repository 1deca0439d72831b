#include "launch/train/synthetic_data.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>

namespace shardckpt::train {

SyntheticData::SyntheticData(uint64_t seed, int64_t features, int64_t classes) : seed_(seed), features_(features) {
  at::Generator gen = at::detail::createCPUGenerator(seed ^ 0x7eac4e7ull);
  teacher_ = at::randn({classes, features}, gen);
}

Batch SyntheticData::Get(int64_t step, int64_t global_batch, int world, int rank) const {
  at::Generator gen = at::detail::createCPUGenerator(seed_ * 1000003ull + static_cast<uint64_t>(step));
  at::Tensor x = at::randn({global_batch, features_}, gen);
  at::Tensor y = at::matmul(x, teacher_.t()).argmax(1);
  int64_t per = (global_batch + world - 1) / world;
  int64_t begin = std::min(global_batch, per * rank), end = std::min(global_batch, begin + per);
  return Batch{x.slice(0, begin, end), y.slice(0, begin, end), begin, global_batch};
}

}  // namespace shardckpt::train
