// libFuzzer target: the safetensors header parser. The first 8 input bytes are the data-area
// size the parser is told; the rest is the header JSON.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "shardckpt/engine/formats/safetensors.h"
#include "shardckpt/io/log.h"

using namespace shardckpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SetLogLevel(LogLevel::kOff);
  if (size < 8) return 0;
  uint64_t data_bytes = 0;
  std::memcpy(&data_bytes, data, 8);
  data_bytes %= uint64_t{1} << 40;
  std::string header(reinterpret_cast<const char*>(data) + 8, size - 8);
  auto entries = ParseSafetensorsHeader(header, data_bytes, "fuzz.safetensors");
  if (entries.ok()) {
    for (const SafetensorsEntry& e : entries.value()) {
      // Accepted entries lie inside the data area and match their shape's size.
      if (e.begin > e.end || e.end > data_bytes) std::abort();
      Result<int64_t> bytes = NumBytes(e.shape, DTypeSize(e.dtype));
      if (!bytes.ok() || static_cast<uint64_t>(bytes.value()) != e.end - e.begin) std::abort();
    }
  }
  return 0;
}
