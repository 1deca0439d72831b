// libFuzzer target: the manifest reader. A manifest comes from disk and may be hostile; the
// reader must refuse it with a Status, never crash, hang, or allocate by a number it was told.
// The same bytes are also read as the binary message a load shares (manifest_wire.h).
// Inputs that end like a manifest object ("\n}") are also sealed first, so the fuzzer reaches
// the schema checks behind the checksum (an unsealed mutation almost never passes the seal).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/model/manifest_wire.h"
#include "shardckpt/io/log.h"

using namespace shardckpt;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SetLogLevel(LogLevel::kOff);
  const std::string text(reinterpret_cast<const char*>(data), size);
  DecodeManifest(text, "fuzz/manifest.json").status().IgnoreError();
  // The same bytes as the message a load's rank 0 sends the other ranks: refused or read, never
  // read past or allocated by.
  DecodeManifestMessage(text, "fuzz/message").status().IgnoreError();
  if (size >= 2 && text.compare(size - 2, 2, "\n}") == 0) {
    Result<Manifest> decoded = DecodeManifest(SealManifestText(text), "fuzz/manifest.json");
    if (decoded.ok()) {
      // Whatever the reader accepts must survive a round trip unchanged.
      Result<std::string> again = EncodeManifest(decoded.value());
      if (!again.ok()) std::abort();
      Result<Manifest> twice = DecodeManifest(again.value(), "fuzz/reencoded");
      if (!twice.ok() || EncodeManifest(twice.value()).value() != again.value()) std::abort();
      // ...and so must the message the other ranks of a load read it from.
      Result<Manifest> shared = DecodeManifestMessage(EncodeManifestMessage(decoded.value()), "fuzz/message");
      if (!shared.ok() || EncodeManifest(shared.value()).value() != again.value()) std::abort();
    }
  }
  return 0;
}
