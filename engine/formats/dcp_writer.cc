#include "shardckpt/engine/formats/dcp_writer.h"

#include <openssl/evp.h>

#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>

#include "shardckpt/engine/formats/pickle_writer.h"

namespace shardckpt {
namespace {

constexpr const char* kMetadataModule = "torch.distributed.checkpoint.metadata";
constexpr const char* kFilesystemModule = "torch.distributed.checkpoint.filesystem";

void TorchSize(PickleWriter& p, const std::vector<int64_t>& dims) {
  p.Global("torch", "Size");
  p.Mark();  // torch.Size((d0, d1, ...)): the dims tuple is the one argument
  p.IntTuple(dims);
  p.Tuple();
  p.Reduce();
}

// TensorProperties' state is the 5-tuple every torch 2.x reads (the 6th field, strides, is
// optional and only recorded, never needed to load).
void TensorProperties(PickleWriter& p, DType dtype) {
  p.NewObject(kMetadataModule, "TensorProperties");
  p.Mark();
  p.Global("torch", DTypeName(dtype));
  p.Global("torch.serialization", "_get_layout");
  p.Mark();
  p.String("torch.strided");
  p.Tuple();
  p.Reduce();
  p.Bool(false);  // requires_grad
  p.Global("builtins", "getattr");
  p.Mark();
  p.Global(kMetadataModule, "_MEM_FORMAT_ENCODING");
  p.String("TORCH_CONTIGUOUS_FORMAT");
  p.Tuple();
  p.Reduce();
  p.Bool(false);  // pin_memory
  p.Tuple();
  p.Build();
}

// A dataclass instance whose __dict__ the caller fills: NewObject, EmptyDict, Mark, then
// key/value pairs, then EndObject.
void BeginObject(PickleWriter& p, const char* module, const char* name) {
  p.NewObject(module, name);
  p.EmptyDict();
  p.Mark();
}
void EndObject(PickleWriter& p) {
  p.SetItems();
  p.Build();
}

void StorageInfo(PickleWriter& p, const DcpStorage& s) {
  BeginObject(p, kFilesystemModule, "_StorageInfo");
  p.String("relative_path");
  p.String(s.file);
  p.String("offset");
  p.UInt(s.offset);
  p.String("length");
  p.UInt(s.length);
  EndObject(p);
}

void MetadataIndex(PickleWriter& p, const std::string& fqn, const std::vector<int64_t>* offset, int64_t index) {
  BeginObject(p, kMetadataModule, "MetadataIndex");
  p.String("fqn");
  p.String(fqn);
  p.String("offset");
  if (offset) {
    TorchSize(p, *offset);
  } else {
    p.None();
  }
  p.String("index");
  if (offset) {
    p.Int(index);
  } else {
    p.None();
  }
  EndObject(p);
}

// ---- blobs: the Python package's typed JSON (python/shardckpt/_state.py) as a pickle

}  // namespace

std::string EncodeDcpMetadata(const DcpMetadata& m) {
  PickleWriter p(3);
  BeginObject(p, kMetadataModule, "Metadata");
  p.String("state_dict_metadata");
  p.EmptyDict();
  p.Mark();
  // Each key in the order given (or tensors, then byte items): state_dict_metadata's order is the
  // state dict's, and planner_data follows it.
  auto in_order = [&](const std::function<void(const DcpTensor&)>& tensor, const std::function<void(const DcpBytes&)>& item) {
    if (m.order.empty()) {
      for (const DcpTensor& t : m.tensors) tensor(t);
      for (const DcpBytes& b : m.bytes) item(b);
      return;
    }
    for (const auto& [is_bytes, index] : m.order) {
      if (is_bytes) item(m.bytes[index]);
      else tensor(m.tensors[index]);
    }
  };
  auto tensor_metadata = [&](const DcpTensor& t) {
    p.String(t.fqn);
    BeginObject(p, kMetadataModule, "TensorStorageMetadata");
    p.String("properties");
    TensorProperties(p, t.dtype);
    p.String("size");
    TorchSize(p, t.shape);
    p.String("chunks");
    p.EmptyList();
    if (!t.chunks.empty()) {
      p.Mark();
      for (const DcpChunk& c : t.chunks) {
        BeginObject(p, kMetadataModule, "ChunkStorageMetadata");
        p.String("offsets");
        TorchSize(p, c.offsets);
        p.String("sizes");
        TorchSize(p, c.sizes);
        EndObject(p);
      }
      p.Appends();
    }
    EndObject(p);
  };
  in_order(tensor_metadata, [&](const DcpBytes& b) {
    p.String(b.fqn);
    p.NewObject(kMetadataModule, "BytesStorageMetadata");
  });
  p.SetItems();
  p.String("planner_data");
  p.EmptyDict();
  p.Mark();
  auto flat = [&](const std::string& fqn) {
    p.String(fqn);
    p.Mark();
    auto path = m.paths.find(fqn);
    if (path == m.paths.end()) {
      p.String(fqn);
    } else {
      for (const StatePathStep& step : path->second) {
        // A dict's int key as DCP's own flattening records it, as a string (str(k)): an int step
        // is a list index to dcp_to_torch_save, which turned an optimizer's state into a list.
        if (step.is_index) p.Int(std::stoll(step.key));
        else p.String(step.key);
      }
    }
    p.Tuple();
  };
  in_order([&](const DcpTensor& t) { flat(t.fqn); }, [&](const DcpBytes& b) { flat(b.fqn); });
  p.SetItems();
  p.String("storage_data");
  p.EmptyDict();
  p.Mark();
  for (const DcpBytes& b : m.bytes) {
    MetadataIndex(p, b.fqn, nullptr, 0);
    StorageInfo(p, b.storage);
  }
  for (const DcpTensor& t : m.tensors) {
    for (size_t i = 0; i < t.chunks.size(); ++i) {
      MetadataIndex(p, t.fqn, &t.chunks[i].offsets, static_cast<int64_t>(i));
      StorageInfo(p, t.chunks[i].storage);
    }
  }
  p.SetItems();
  p.String("storage_meta");
  BeginObject(p, kMetadataModule, "StorageMeta");
  p.String("checkpoint_id");
  p.String(m.checkpoint_id);
  p.String("save_id");
  p.String("shardckpt-export");
  p.String("load_id");
  p.None();
  p.String("modules");
  p.EmptyList();
  EndObject(p);
  p.String("version");
  p.String(kDcpVersion);
  EndObject(p);
  return p.Finish();
}

std::string PickleContiguousTensor(DType dtype, const Shape& sizes) {
  // torch 2.x has no storage class for float8 or uint16/32/64 (TorchStorageName is null): it
  // writes an UntypedStorage (counted in bytes) that _rebuild_tensor_v3 views as the dtype.
  const bool v3 = TorchStorageName(dtype) == nullptr;
  const int64_t numel = NumElements(sizes).value();
  std::vector<int64_t> strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) strides[d - 1] = strides[d] * sizes[d];
  PickleWriter p(2);
  p.Global("torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
  p.Mark();
  p.Mark();
  p.String("storage");
  if (v3) {
    p.Global("torch.storage", "UntypedStorage");
  } else {
    p.Global("torch", TorchStorageName(dtype));
  }
  p.String("0");
  p.String("cpu");
  p.Int(v3 ? numel * static_cast<int64_t>(DTypeSize(dtype)) : numel);
  p.Tuple();
  p.PersistentId();
  p.Int(0);  // storage_offset
  p.IntTuple(sizes);
  p.IntTuple(strides);
  p.Bool(false);  // requires_grad
  p.Global("collections", "OrderedDict");
  p.EmptyTuple();
  p.Reduce();  // backward hooks
  if (v3) p.Global("torch", DTypeName(dtype));
  p.Tuple();
  p.Reduce();
  return p.Finish();
}

Result<std::string> PickleBlobValue(const std::string& blob) {
  PickleWriter p(2);  // as torch.save writes: its bytes are what torch 2.x's weights_only reads
  if (blob.size() >= 2 && blob[0] == '\0') {
    const char tag = blob[1];
    if (tag == 'B' || tag == 'b') {  // bytes, or a bytearray's bytes (written as bytes)
      SC_RETURN_IF_ERROR(p.Bytes(blob.substr(2)));
    } else if (tag == 'J') {
      nlohmann::ordered_json value = nlohmann::ordered_json::parse(blob.begin() + 2, blob.end(), nullptr, false);
      if (value.is_discarded()) return InvalidArgument("its JSON does not parse");
      SC_RETURN_IF_ERROR(WriteTypedJson(p, value));
    } else if (tag == 'T') {
      return Status(Code::kUnimplemented, "it is a per-rank tensor, which a DCP folder has no place for");
    } else {
      return InvalidArgument("its tag \\x00" + std::string(1, tag) + " is unknown");
    }
  } else {
    SC_RETURN_IF_ERROR(p.Bytes(blob));  // the C++ API's blobs are bytes
  }
  return p.Finish();
}

}  // namespace shardckpt
