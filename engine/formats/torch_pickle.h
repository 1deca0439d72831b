// The pickle inside a torch.save zip (docs/format.md): a writer for state dicts of
// contiguous tensors, and a restricted reader that accepts only what torch.load(weights_only=True)
// accepts. The reader executes nothing: GLOBAL is checked against a fixed allowlist and refused
// by name otherwise, and REDUCE is interpreted only for the allowed callables, with the arity and
// argument types torch's own calls take. Its memory is bounded by UnpickleMemoryBudget.
#pragma once

#include <string>
#include <vector>

#include "shardckpt/engine/model/dtype.h"
#include "shardckpt/engine/model/layout.h"

namespace shardckpt {

struct PickleTensor {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape sizes;
  std::vector<int64_t> strides;  // in elements
  int64_t storage_offset = 0;    // in elements
  std::string storage_key;       // record data/<key>
  int64_t storage_numel = 0;     // in storage elements
  // Bytes per storage element: 0 for the tensor's own dtype (a typed storage), 1 for torch 2.x's
  // UntypedStorage, which _rebuild_tensor_v3 views as the tensor's dtype.
  size_t storage_element_size = 0;
};

// An OrderedDict of name -> tensor; tensor i uses storage key std::to_string(i), contiguous.
Result<std::string> PickleStateDict(const std::vector<PickleTensor>& tensors);

struct UnpickledStateDict {
  std::vector<PickleTensor> tensors;  // nested dicts flattened to dotted names
  std::vector<std::string> skipped;   // non-tensor leaves (numbers, strings, lists), by name
};

// Tensor records are returned as the pickle states them: their sizes, strides and offsets are
// checked against the storage records by the reader of the zip (torch_file.h), not here.
Result<UnpickledStateDict> UnpickleStateDict(const std::string& pickle);

// The most memory the reader may use (objects, stack, memo, flattened names) for a pickle of
// `pickle_bytes`; past it the pickle is refused with an error saying so.
uint64_t UnpickleMemoryBudget(size_t pickle_bytes);

// The pickle of torch.save(tensor) (one bare tensor, as each chunk of a DCP folder holds), by
// the same rules.
Result<PickleTensor> UnpickleTensor(const std::string& pickle);

}  // namespace shardckpt
