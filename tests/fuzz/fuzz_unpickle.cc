// libFuzzer target: the restricted unpickler that reads data.pkl of a torch .pt (import). Hostile
// pickles must be refused with a Status, within the memory budget and without hanging (libFuzzer's
// -rss_limit_mb and -timeout catch both). It returns tensor records as the pickle states them, so
// only what it guarantees is checked: unique, non-empty names; and that validating each record
// against a storage of the size it claims is safe (no overflow, UBSan watching) and, when it
// passes, leaves every element inside that storage.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>

#include "shardckpt/engine/formats/torch_file.h"
#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/io/log.h"

using namespace shardckpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SetLogLevel(LogLevel::kOff);
  Result<UnpickledStateDict> dict = UnpickleStateDict(std::string(reinterpret_cast<const char*>(data), size));
  if (!dict.ok()) return 0;
  std::set<std::string> names;
  for (const std::string& name : dict->skipped) {
    if (name.empty() || !names.insert(name).second) std::abort();
  }
  for (const PickleTensor& t : dict->tensors) {
    if (t.name.empty() || !names.insert(t.name).second) std::abort();
    const uint64_t storage_element = t.storage_element_size ? t.storage_element_size : DTypeSize(t.dtype);
    const uint64_t record = static_cast<uint64_t>(t.storage_numel) * storage_element;  // may wrap: a lie to catch
    if (!ValidateTorchTensor(t, record).ok()) continue;
    if (t.storage_offset < 0 || t.storage_numel < 0 || t.strides.size() != t.sizes.size()) std::abort();
    int64_t numel = NumElements(t.sizes).value(), last = t.storage_offset;
    for (size_t d = 0; d < t.sizes.size() && numel > 0; ++d) last += (t.sizes[d] - 1) * t.strides[d];
    if (numel > 0 && static_cast<uint64_t>(last + 1) * DTypeSize(t.dtype) > record) std::abort();
  }
  return 0;
}
