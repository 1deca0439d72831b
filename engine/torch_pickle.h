// The pickle inside a torch.save zip (docs/format.md): a writer for state dicts of
// contiguous tensors, and a restricted reader that accepts only what torch.load(weights_only=True)
// accepts. The reader executes nothing: GLOBAL is checked against a fixed allowlist and refused
// by name otherwise, and REDUCE is interpreted only for the allowed callables.
#pragma once

#include <string>
#include <vector>

#include "shardckpt/engine/dtype.h"
#include "shardckpt/engine/layout.h"

namespace shardckpt {

struct PickleTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape sizes;
  std::vector<int64_t> strides;  // in elements
  int64_t storage_offset = 0;    // in elements
  std::string storage_key;       // record data/<key>
  int64_t storage_numel = 0;
};

// An OrderedDict of name -> tensor; tensor i uses storage key std::to_string(i), contiguous.
Result<std::string> PickleStateDict(const std::vector<PickleTensor>& tensors);

struct UnpickledStateDict {
  std::vector<PickleTensor> tensors;  // nested dicts flattened to dotted names
  std::vector<std::string> skipped;   // non-tensor leaves (numbers, strings, lists), by name
};

Result<UnpickledStateDict> UnpickleStateDict(const std::string& pickle);

}  // namespace shardckpt
