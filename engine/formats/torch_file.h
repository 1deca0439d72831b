// The tensors of a torch.save file (a zip of data.pkl and one record per storage): the state dict
// unpickled by the restricted reader, every tensor record checked against its storage record the
// way torch's storage and _rebuild_tensor_v2 checks do, then each tensor read out contiguous.
// Nothing is read by a number the file states before that number is checked.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/engine/formats/zip_reader.h"

namespace shardckpt {

// A view may repeat storage elements (stride 0); import materializes it, so the bytes it expands
// to are bounded by this or by its storage's size, whichever is larger.
inline constexpr uint64_t kMaxExpandedTensorBytes = uint64_t{256} << 20;

// What makes two tensors of a .pt one tensor under two names: the same storage, dtype, offset,
// sizes and strides. For each tensor, the index of the first tensor before it that is the same
// view, or -1. Compares the descriptions themselves (no key strings: a file of 100,000 tensors
// made 200,000 of them).
std::vector<int64_t> FirstOfSameView(const std::vector<PickleTensor>& tensors);

// The zip record of a tensor's storage ("<prefix>data/<storage key>"), or null.
const ZipRecord* StorageRecord(const ZipReader& zip, const PickleTensor& t);

// Unpickles data.pkl and validates every tensor record (ValidateTorchTensor, plus: all tensors
// naming one storage agree on its dtype and size). Reads no tensor data.
Result<UnpickledStateDict> ReadTorchStateDict(const ZipReader& zip);

// One tensor record against its storage record of `record_bytes`: element count times element
// size without overflow and equal to the record's size; sizes, strides and storage_offset not
// negative; every element the view addresses inside the storage. Errors name the tensor and field.
Status ValidateTorchTensor(const PickleTensor& t, uint64_t record_bytes);

// Whether a validated tensor's elements lie in its storage in row-major order, one after another
// (what torch.save writes for a plain tensor), so that any range of them is one range of bytes.
bool StoredContiguously(const PickleTensor& t);

// A validated tensor's elements, row-major and contiguous, into `out`: `count` of them from
// element `first` (count -1: to the end). A tensor stored contiguously is read for that range
// only; a strided view is read whole and the range cut from it. With `window` (over the zip's
// source), through it: a loop reading the tensors in file order.
Status ReadTorchTensor(const ZipReader& zip, const PickleTensor& t, std::vector<unsigned char>* out,
                       int64_t first = 0, int64_t count = -1, ReadAheadWindow* window = nullptr);

// The legacy (pre-1.6, non-zip) format: the state dict (UnpickleLegacyHead) and each storage's
// bytes located as a record, every element count checked against the file's size and against
// what the state dict says of that storage, every tensor record validated as for a zip.
bool IsLegacyTorchFile(const ByteSource& source);
struct LegacyTorchFile {
  UnpickledStateDict dict;
  std::map<std::string, ZipRecord> storages;  // by storage key
};
Result<LegacyTorchFile> ReadLegacyTorchFile(const ByteSource& source);
Status ReadTorchTensor(const ByteSource& source, const LegacyTorchFile& file, const PickleTensor& t,
                       std::vector<unsigned char>* out, int64_t first = 0, int64_t count = -1,
                       ReadAheadWindow* window = nullptr);

}  // namespace shardckpt
