// A PyTorch Distributed Checkpoint (DCP) folder, as torch 2.x's dcp.save writes it, read in
// place as a shardckpt Manifest (docs/format.md, "DCP folders"): every verb and the load then
// take it. `.metadata` is parsed by dcp_metadata.h; each tensor chunk in a `.distcp` file is a
// complete torch.save zip at the recorded offset and length, whose one storage record is located
// by parsing that zip (its central directory and data.pkl) and checked against the file size and
// the chunk's shape times dtype. Chunks become Box-layout chunks pointing at those records, so a
// resharded load reads only the bytes it needs. DCP stores no checksums: the files are marked as
// such (FileRecord::checksums), and the reader skips verification for them.
// Byte items (non-tensor values, each a torch.save of the object) become global blobs holding
// that torch.save file; nothing in them is unpickled here. Readers of their bytes turn the plain
// ones into value blobs with DcpByteItemValue.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "shardckpt/engine/model/manifest.h"

namespace shardckpt {

inline constexpr const char* kDcpMetadataFile = ".metadata";

// A folder holding `.metadata` and no manifest.json.
bool IsDcpFolder(const std::string& path);

struct DcpProblem {
  std::string file;
  uint64_t offset = 0;
  std::string what;
  // What is stored there: the tensors, and the byte items (blobs); a missing file's, all of them.
  std::vector<std::string> entries, blobs;
  // Could not be read (a permission, an I/O error): not known to be damaged.
  bool unreadable = false;
};

// Reads and validates the folder. With `problems`, damage in the data files (a missing or
// truncated file, a chunk whose record is not where or what .metadata says) is collected there,
// that chunk left out, instead of failing at the first; `verify` uses that. Errors in .metadata
// itself always fail.
Result<Manifest> ReadDcpFolder(const std::string& dir, std::vector<DcpProblem>* problems = nullptr);

// Files of the folder that have a `<file>.sha256` beside them (`sha256sum` form, as
// `shardckpt export --format dcp` writes them): each read whole and compared; a mismatch or an
// unreadable .sha256 is a problem. `checked` gets how many files had one, `bytes` their size.
std::vector<DcpProblem> CheckDcpSha256Files(const std::string& dir, const Manifest& m, uint64_t* checked, uint64_t* bytes);

// Byte items whose torch.save pickle holds anything but plain values (None, bool, int, float,
// str, bytes, and lists, tuples and dicts of them: what UnpickleValueBlob takes), by name with
// the reason: listed by inspect, restored by nobody. Empty for a manifest that is not a DCP
// folder's (BuiltFromDcpFolder).
Result<std::map<std::string, std::string>> DcpOpaqueByteItems(const std::string& dir, const Manifest& m);
// How consolidate and import name such an item among what they did not write.
std::string OpaqueByteItemSkipped(const std::string& name, const std::string& reason);

// A byte item's bytes (its torch.save zip) as the value blob shardckpt stores plain values in
// (kPickleValueTag and typed JSON, torch_pickle.h), so consolidate writes it into a .pt and
// import keeps it typed; an error saying why when its pickle holds more than plain values.
Result<std::string> DcpByteItemValue(const std::string& item, const std::string& name);

// What ReadDcpFolder records in the manifest's creation metadata, so that ranks that received
// the manifest rather than reading the folder know it came from one (BuiltFromDcpFolder).
inline constexpr const char* kDcpSourceKey = "source_format";
inline constexpr const char* kDcpSourceValue = "torch.distributed.checkpoint (DCP)";
// Whether `m` is ReadDcpFolder's: its mark, and only .distcp data files (a checkpoint imported
// from a DCP folder may keep the mark among its metadata, but its files are shardckpt's).
bool BuiltFromDcpFolder(const Manifest& m);

// A byte item as a load hands it out: a Python bytes object as its bytes (`is_bytes`: what the
// C++ API's raw blobs are, and what `shardckpt export` makes of them), any other plain value as
// its value blob (DcpByteItemValue); an error saying why not.
struct DcpByteItemBlob {
  bool is_bytes = false;
  std::string bytes;
};
Result<DcpByteItemBlob> DecodeDcpByteItem(const std::string& item, const std::string& name);
// The same from the value blob DcpByteItemValue (CheckpointReader::ReadBlob) gave, which is what
// `import` and `reshard` of a DCP folder store: a load hands such a bytes object out as its bytes.
Result<DcpByteItemBlob> DcpValueAsLoaded(std::string value_blob);

}  // namespace shardckpt
