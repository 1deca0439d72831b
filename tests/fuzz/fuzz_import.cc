// libFuzzer target: the whole .pt path of `shardckpt import` from bytes: the zip reader, the
// restricted unpickler and the tensor records, each tensor then read out as import reads it. A
// hostile file must be refused with a Status; whatever is accepted reads exactly its size, and
// AddressSanitizer checks that no read leaves its buffer.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "shardckpt/engine/formats/torch_file.h"
#include "shardckpt/io/log.h"

using namespace shardckpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SetLogLevel(LogLevel::kOff);
  Result<ZipReader> zip = ZipReader::Open(ByteSource::FromBytes(std::string(reinterpret_cast<const char*>(data), size), "fuzz.pt"));
  if (!zip.ok()) return 0;
  Result<UnpickledStateDict> dict = ReadTorchStateDict(*zip);
  if (!dict.ok()) return 0;
  std::set<std::string> names;
  std::vector<unsigned char> out;
  for (const PickleTensor& t : dict->tensors) {
    if (t.name.empty() || !names.insert(t.name).second) std::abort();  // names are unique, never empty
    // Accepted records read without error (they were checked against their storages), and
    // exactly as many bytes as their shape holds.
    if (!ReadTorchTensor(*zip, t, &out).ok()) std::abort();
    if (out.size() != static_cast<size_t>(NumElements(t.sizes).value()) * DTypeSize(t.dtype)) std::abort();
  }
  return 0;
}
