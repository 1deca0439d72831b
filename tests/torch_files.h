// torch.save files built byte by byte, for the import tests and the fuzz seeds: honest ones, and
// the hostile ones a careful reader must refuse (storages that lie about their size, views that
// reach outside their storage, shared-reference bombs, dicts inside themselves, a pickle that is
// laxer than torch's weights_only rules would let through). Zips are written with the project's
// own ZipWriter, pickles with PickleStateDict or opcode by opcode.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/io/status.h"

namespace shardckpt::testing {

struct TorchRecord {
  std::string key;  // archive/data/<key>
  uint64_t bytes = 0;
};

struct TorchFileCase {
  std::string name;                  // what it is; also its seed file name
  std::string pickle;                // archive/data.pkl
  std::vector<TorchRecord> records;  // filled with RecordByte
  std::string refusal;               // text the refusal must contain; "" for a valid file
  std::string byteorder;             // archive/byteorder, as torch 2.x writes it; "" for none
};

// Byte `k` of storage record `key`.
uint8_t RecordByte(const std::string& key, uint64_t k);

// Writes `c` as a torch.save zip at `path`.
Status WriteTorchFile(const std::string& path, const TorchFileCase& c);

// Valid files, including views (transposed, offset, broadcast, empty, 0-d) into shared storages.
std::vector<TorchFileCase> ValidTorchFiles();
// Files whose tensor records lie; each refusal names the tensor and the field.
std::vector<TorchFileCase> HostileTensorRecords();

// {"a": D, "b": D} nested `levels` deep through BINPUT/BINGET: 2^levels leaves in a few hundred bytes.
std::string SharedReferenceBomb(int levels);
// A dict whose value is the dict itself.
std::string SelfContainingDict();
// A state dict holding a list of `count` Nones: one byte of pickle per object.
std::string ObjectFlood(size_t count);

struct PickleCase {
  std::string name;
  std::string pickle;
  std::string refusal;  // "" when accepted
};
// What torch.load(weights_only=True) refuses and what it accepts, opcode by opcode.
std::vector<PickleCase> WeightsOnlyCases();

}  // namespace shardckpt::testing
