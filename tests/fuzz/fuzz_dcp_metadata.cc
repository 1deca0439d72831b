// libFuzzer target: a DCP folder's `.metadata` (engine/formats/dcp_metadata.h), the pickle every
// verb reads first when pointed at a PyTorch DCP folder. Hostile metadata must be refused with a
// Status, within the unpickler's memory budget and without hanging (-rss_limit_mb, -timeout),
// nothing executed. The input is parsed alone, then read as a folder (a scratch folder holding
// only this .metadata, so every data file is missing: the shape, layout and name checks behind
// the parse run, and no count or offset it states is allocated or followed). Checked: a folder
// read without problems is a manifest ValidateManifest accepts, its byte items' bytes inside
// their files; and UnpickleValueBlob (how byte items are read) never crashes on the same bytes.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "shardckpt/engine/formats/dcp_metadata.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

using namespace shardckpt;

namespace {

const std::string& Scratch() {
  static const std::string dir = [] {
    std::string d = "/tmp/fuzz_dcp_metadata." + std::to_string(::getpid());
    if (!MakeDirs(d).ok()) std::abort();
    return d;
  }();
  return dir;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SetLogLevel(LogLevel::kOff);
  const std::string pickle(reinterpret_cast<const char*>(data), size);
  UnpickleValueBlob(pickle).status().IgnoreError();
  if (!ParseDcpMetadata(pickle, "fuzz").ok()) return 0;
  {
    std::ofstream out(JoinPath(Scratch(), kDcpMetadataFile), std::ios::binary | std::ios::trunc);
    out << pickle;
  }
  std::vector<DcpProblem> problems;
  Result<Manifest> m = ReadDcpFolder(Scratch(), &problems);
  if (!m.ok() || !problems.empty()) return 0;
  if (!ValidateManifest(*m).ok()) std::abort();
  for (const BlobRecord& b : m->blobs) {
    if (b.file >= m->files.size() || b.offset + b.bytes > m->files[b.file].size) std::abort();
  }
  return 0;
}
