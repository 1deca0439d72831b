// The pickle inside a torch.save zip (docs/format.md): a writer for state dicts of
// contiguous tensors, and a restricted reader that accepts only what torch.load(weights_only=True)
// accepts. The reader executes nothing: GLOBAL is checked against a fixed allowlist and refused
// by name otherwise, and REDUCE is interpreted only for the allowed callables, with the arity and
// argument types torch's own calls take. Its memory is bounded by UnpickleMemoryBudget.
#pragma once

#include "shardckpt/engine/model/state.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "shardckpt/engine/formats/state_path.h"
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

// An OrderedDict of name -> tensor, each as its storage_key, sizes, strides and offset say (two
// tensors naming one key share one storage, as tied weights do in torch).
Result<std::string> PickleStateDict(const std::vector<PickleTensor>& tensors);

// A value of a state dict to pickle: a tensor (by index), a plain value (the typed JSON of a
// PickleValue blob, after its tag), or a dict, list or tuple of nodes.
struct PickleNode {
  enum Kind : uint8_t { kTensor, kValue, kDict, kList, kTuple };
  Kind kind = kDict;
  size_t tensor = 0;
  std::string json;
  std::vector<std::pair<std::string, PickleNode>> items;  // dict: key, value; list, tuple: items in order
  bool int_key = false;  // its key in the dict holding it is an int (written in decimal above)
};
// `root` (a dict) as an OrderedDict; values in opcodes torch's weights_only unpickler accepts.
Result<std::string> PickleTree(const std::vector<PickleTensor>& tensors, const PickleNode& root);

// A non-tensor value of the state dict (an int, a string, None, a list of them ...), as the
// Python package stores it in a blob: kPickleValueTag, then its typed JSON.
inline constexpr const auto& kPickleValueTag = kValueBlobTag;  // engine/model/state.h
struct PickleValue {
  std::string name;
  std::string blob;
  size_t tensors_before = 0;  // tensors flattened before it: where it sits among them
};

struct UnpickledStateDict {
  // Nested dicts flattened to dotted names; lists and tuples holding tensors by index ("lst.0").
  std::vector<PickleTensor> tensors;
  std::vector<PickleValue> values;   // non-tensor leaves, in the state dict's order
  // Leaves the blob encoding cannot hold, each "name (why)": a torch.dtype or torch.device value.
  std::vector<std::string> skipped;
  // The lists and tuples walked for their tensors: (dotted path, "list" or "tuple").
  std::vector<std::pair<std::string, std::string>> containers;
  // Every leaf (tensor or value) below the top level, with where it sat: its dict keys (ints
  // marked), list and tuple indices.
  std::vector<std::pair<std::string, StatePath>> paths;
};

// The pickle of one plain value (None, bool, int of any width, float, str, bytes, and lists,
// tuples and dicts of them) as a PickleValue blob: kPickleValueTag, then its typed JSON. A pickle
// holding anything else (a tensor, a global, a call other than protocol 2's bytes: an
// OrderedDict or torch.Size would lose its type) is refused.
Result<std::string> UnpickleValueBlob(const std::string& pickle);

// Tensor records are returned as the pickle states them: their sizes, strides and offsets are
// checked against the storage records by the reader of the zip (torch_file.h), not here.
Result<UnpickledStateDict> UnpickleStateDict(const std::string& pickle);

// The pickles at the start of a legacy (pre-1.6, _use_new_zipfile_serialization=False) torch.save
// file, read from its first bytes `head`: the magic number, protocol version 1001, the system info
// (little-endian only), the state dict (its persistent ids ('storage', class, key, location,
// numel, None)), the storage keys. After them each storage follows in key order as an 8-byte
// little-endian element count and its elements. `need_more`: `head` ended first (read more).
struct LegacyHead {
  UnpickledStateDict dict;
  std::vector<std::string> storage_keys;
  std::map<std::string, size_t> element_size;  // bytes per element of each storage named, by key
  uint64_t data_offset = 0;                    // of the first storage's element count
};
Result<LegacyHead> UnpickleLegacyHead(const std::string& head, bool* need_more);

// The most memory the reader may use (objects, stack, memo, flattened names) for a pickle of
// `pickle_bytes`; past it the pickle is refused with an error saying so.
uint64_t UnpickleMemoryBudget(size_t pickle_bytes);

// The pickle of torch.save(tensor) (one bare tensor, as each chunk of a DCP folder holds), by
// the same rules.
Result<PickleTensor> UnpickleTensor(const std::string& pickle);

}  // namespace shardckpt
