// libFuzzer target: the restricted unpickler that reads data.pkl of a torch .pt (import,
// reshard and verify of foreign files). Hostile pickles must be refused with a Status.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "shardckpt/engine/torch_pickle.h"
#include "shardckpt/io/log.h"

using namespace shardckpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SetLogLevel(LogLevel::kOff);
  Result<UnpickledStateDict> dict = UnpickleStateDict(std::string(reinterpret_cast<const char*>(data), size));
  if (dict.ok()) {
    for (const PickleTensor& t : dict.value().tensors) {
      // Accepted tensors have sizes the rest of the engine can trust.
      if (t.storage_offset < 0 || t.storage_numel < 0) std::abort();
    }
  }
  return 0;
}
