#include "shardckpt/engine/formats/torch_pickle.h"

#include <array>
#include <cstdio>
#include <cstring>
#include <cmath>
#include <deque>
#include <map>
#include <set>
#include <string_view>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "shardckpt/engine/formats/byte_text.h"
#include "shardckpt/engine/formats/pickle_stack.h"
#include "shardckpt/engine/formats/pickle_writer.h"

namespace shardckpt {

// ---------------------------------------------------------------- writer

namespace {

void PutTensor(PickleWriter& w, const PickleTensor& t) {
  // dtypes without a legacy storage class (float8, uint16/32/64) are written as torch 2.x
  // writes them: an UntypedStorage (counted in bytes) that _rebuild_tensor_v3 views as the
  // dtype it names. The others keep the typed storage and _rebuild_tensor_v2 torch 1.13 reads.
  const char* storage_class = TorchStorageName(t.dtype);
  const bool v3 = storage_class == nullptr;
  w.Global("torch._utils", v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
  w.Mark();
  w.Mark();
  w.String("storage");
  // torch.storage.UntypedStorage: the name torch.load(weights_only=True) allows.
  if (v3) {
    w.Global("torch.storage", "UntypedStorage");
  } else {
    w.Global("torch", storage_class);
  }
  w.String(t.storage_key);
  w.String("cpu");
  w.Int(v3 ? t.storage_numel * static_cast<int64_t>(DTypeSize(t.dtype)) : t.storage_numel);
  w.Tuple();
  w.PersistentId();
  w.Int(t.storage_offset);
  w.IntTuple(t.sizes);
  w.IntTuple(t.strides);
  w.Bool(false);  // requires_grad
  w.Global("collections", "OrderedDict");
  w.EmptyTuple();
  w.Reduce();  // backward hooks
  if (v3) w.Global("torch", DTypeName(t.dtype));
  w.Tuple();
  w.Reduce();
}

// Deeper than torch's own converters need (dcp_to_torch_save takes 65 levels), short of the
// pickle writer's own bound.
constexpr int kMaxPickleDepth = 128;

// Whether a container lies more than kMaxPickleDepth levels down; `path` gets its keys (list
// items by index), dotted. A walk of the whole tree, bounded in depth.
bool TooDeep(const PickleNode& node, int depth, std::string* path) {
  if (node.kind != PickleNode::kDict && node.kind != PickleNode::kList && node.kind != PickleNode::kTuple) return false;
  if (depth > kMaxPickleDepth) return true;
  for (size_t i = 0; i < node.items.size(); ++i) {
    if (TooDeep(node.items[i].second, depth + 1, path)) {
      const std::string key = node.kind == PickleNode::kDict ? node.items[i].first : std::to_string(i);
      *path = path->empty() ? key : key + "." + *path;
      return true;
    }
  }
  return false;
}

Status PutNode(PickleWriter& w, const std::vector<PickleTensor>& tensors, const PickleNode& node, int depth) {
  if (depth > kMaxPickleDepth + 1) return Internal("a state dict deeper than PickleTree checked");
  switch (node.kind) {
    case PickleNode::kTensor:
      if (node.tensor >= tensors.size()) return Internal("a pickle node names tensor " + std::to_string(node.tensor));
      PutTensor(w, tensors[node.tensor]);
      return Status::Ok();
    case PickleNode::kValue: {
      nlohmann::ordered_json v = nlohmann::ordered_json::parse(node.json, nullptr, false);
      if (v.is_discarded()) return InvalidArgument("a value's JSON does not parse");
      return WriteTypedJson(w, v);
    }
    case PickleNode::kDict:
      if (depth == 0) {
        w.Global("collections", "OrderedDict");
        w.EmptyTuple();
        w.Reduce();
      } else {
        w.EmptyDict();
      }
      if (node.items.empty()) return Status::Ok();
      w.Mark();
      for (const auto& [key, child] : node.items) {
        if (child.int_key) {
          w.Int(std::stoll(key));
        } else {
          w.String(key);
        }
        SC_RETURN_IF_ERROR(PutNode(w, tensors, child, depth + 1));
      }
      w.SetItems();
      return Status::Ok();
    case PickleNode::kList:
    case PickleNode::kTuple:
      if (node.kind == PickleNode::kList) w.EmptyList();
      w.Mark();
      for (const auto& item : node.items) SC_RETURN_IF_ERROR(PutNode(w, tensors, item.second, depth + 1));
      if (node.kind == PickleNode::kList) {
        w.Appends();
      } else {
        w.Tuple();
      }
      return Status::Ok();
  }
  return Internal("unknown pickle node kind");
}

}  // namespace

Result<std::string> PickleTree(const std::vector<PickleTensor>& tensors, const PickleNode& root) {
  if (root.kind != PickleNode::kDict) return InvalidArgument("a state dict's root must be a dict");
  PickleWriter w(2);
  // About 150 bytes a tensor besides its name and key (20,000 small tensors: 3 MB).
  size_t estimate = 64;
  for (const PickleTensor& t : tensors) estimate += 160 + t.name.size() + t.storage_key.size() + 20 * t.sizes.size();
  w.Reserve(estimate);
  if (std::string path; TooDeep(root, 0, &path)) {
    return InvalidArgument("the state dict is nested more than " + std::to_string(kMaxPickleDepth) + " levels deep, at '" +
                           path + "': a .pt of it is not written (safetensors output keeps flat names)");
  }
  SC_RETURN_IF_ERROR(PutNode(w, tensors, root, 0));
  return w.Finish();
}

Result<std::string> PickleStateDict(const std::vector<PickleTensor>& tensors) {
  PickleNode root;
  for (size_t i = 0; i < tensors.size(); ++i) {
    PickleNode leaf;
    leaf.kind = PickleNode::kTensor;
    leaf.tensor = i;
    root.items.emplace_back(tensors[i].name, std::move(leaf));
  }
  return PickleTree(tensors, root);
}

// ---------------------------------------------------------------- restricted reader

uint64_t UnpickleMemoryBudget(size_t pickle_bytes) {
  // A state dict torch writes costs about 17 bytes of this reader's memory per pickle byte
  // (measured with torch 1.13's pickles: 16 for 20,000 tensors, 17 with an optimizer state); a
  // flood of one-byte opcodes costs 64, a BINGET fan-out without bound: both stop here.
  return (uint64_t{64} << 20) + uint64_t{32} * pickle_bytes;
}

namespace {

// One pickled object. Values live in the unpickler's arena and point at each other with plain
// pointers, so a cycle (a dict holding itself) neither leaks nor recurses on destruction.
struct Value {
  // kBigInt: an integer wider than 64 bits (a uint64 seed pickles as 9 bytes), kept only as a leaf.
  // kBytes: a bytes value (BINBYTES, or protocol 2's _codecs.encode(str, "latin1")), a leaf.
  enum Kind : uint8_t { kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict, kGlobal, kStorage, kTensor, kBigInt, kBytes };
  Kind kind = kNone;
  bool ordered = false;  // an OrderedDict (BUILD may set its attributes), not a plain dict
  bool on_path = false;  // the flattening is inside this dict: meeting it again is a cycle
  bool bytearray = false;  // kBytes made by bytearray(): its type is kept in the typed JSON
  DType dtype = DType::kFloat32;  // storage
  int64_t i = 0;                  // int, bool, storage element count, tensor index
  double f = 0;                   // float
  std::string_view s;             // string and storage key (into the pickle), global (into the allowlist)
  const char* unsupported = nullptr;  // storage, tensor: the torch dtype shardckpt has no type for
  std::vector<Value*> items;      // tuple, list; dict as key, value, key, value, ...
};

const char* KindName(Value::Kind kind) {
  static const char* const kNames[] = {"None", "bool", "int", "float", "string", "tuple",
                                       "list", "dict", "global", "storage", "tensor", "big int", "bytes"};
  return kNames[kind];
}

// What a tensor's `unsupported` says when it is not a dtype or a layout: a view whose stored
// values are not its values (RefusedTensorText says why and what to do).
constexpr const char* kNegativeView = "a negative view";
constexpr const char* kConjugateView = "a conjugate view";
constexpr const char* kOtherTensorMetadata = "tensor metadata";

// Why a tensor whose `unsupported` is `what` is refused, and what to do, after "tensor 'NAME': ".
std::string RefusedTensorText(std::string_view what) {
  if (what == kNegativeView || what == kConjugateView) {
    const bool neg = what == kNegativeView;
    return std::string("it is ") + std::string(what) + " (" + (neg ? "{'neg': True}" : "{'conj': True}") +
           " in the file): its storage holds the values before " + (neg ? "negation" : "conjugation") +
           ", which shardckpt does not apply (save t.resolve_neg().resolve_conj() instead)";
  }
  if (what == kOtherTensorMetadata) {
    return "the file sets tensor metadata other than the neg and conj flags, which shardckpt does not know";
  }
  if (what.substr(0, 12) == "torch.sparse") {
    return "layout " + std::string(what) + " is not supported by shardckpt (convert it with .to_dense() before importing)";
  }
  return "dtype " + std::string(what) + " is not supported by shardckpt (convert the tensor before importing)";
}

// torch dtypes (as torch 2.x's _rebuild_tensor_v3 names them) that shardckpt has no type for.
const char* const kUnsupportedDTypes[] = {"complex32", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
                                          "float4_e2m1fn_x2", "bits8", "bits16"};

const std::set<std::string>& AllowedGlobals() {
  static const std::set<std::string> kAllowed = [] {
    std::set<std::string> s = {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
                               "torch._utils._rebuild_tensor_v3", "torch._utils._rebuild_parameter",
                               // A Parameter with Python attributes (Megatron's tensor_model_parallel).
                               "torch._utils._rebuild_parameter_with_state",
                               // torch 2.x's name for it; the bare one is what shardckpt <= 0.x wrote.
                               "torch.storage.UntypedStorage", "torch.UntypedStorage",
                               // How protocol 2 pickles bytes (torch 2.x's weights_only takes it too).
                               "_codecs.encode", "__builtin__.bytes", "builtins.bytes",
                               // bytearray(b"..."), as torch.save pickles one (torch 2.x's weights_only takes it).
                               "__builtin__.bytearray", "builtins.bytearray",
                               // Sparse tensors (and the layout and Size they are rebuilt with):
                               // recognised only to be refused by name and layout.
                               "torch._utils._rebuild_sparse_tensor", "torch.serialization._get_layout", "torch.Size",
                               // Quantized tensors: recognised only to be refused by name and dtype.
                               "torch._utils._rebuild_qtensor", "torch.per_tensor_affine", "torch.per_channel_affine",
                               "torch.per_tensor_symmetric", "torch.per_channel_symmetric",
                               "torch.per_channel_affine_float_qparams",
                               // A torch.device value (weights_only takes it): read, then skipped
                               // as a value with no typed-JSON form, like a torch.dtype value.
                               "torch.device"};
    for (int d = 0; d < kNumDTypes; ++d) {
      if (const char* storage = TorchStorageName(static_cast<DType>(d))) s.insert(std::string("torch.") + storage);
      s.insert(std::string("torch.") + DTypeName(static_cast<DType>(d)));  // torch.float8_e4m3fn: the same names
    }
    for (const char* name : kUnsupportedDTypes) s.insert(std::string("torch.") + name);
    for (const char* name : {"torch.ComplexHalfStorage", "torch.QInt8Storage", "torch.QUInt8Storage", "torch.QInt32Storage", "torch.QUInt4x2Storage",
                             "torch.QUInt2x4Storage"}) {
      s.insert(name);
    }
    return s;
  }();
  return kAllowed;
}

// Storage classes torch.load(weights_only=True) accepts for dtypes shardckpt has no type for:
// allowed as globals, so the refusal can name the tensor and its dtype instead of the class.
const char* UnsupportedStorageDType(std::string_view global) {
  static const std::pair<const char*, const char*> kUnsupported[] = {
      {"torch.ComplexHalfStorage", "complex32"}, {"torch.QInt8Storage", "qint8"},
      {"torch.QUInt8Storage", "quint8"}, {"torch.QInt32Storage", "qint32"},
      {"torch.QUInt4x2Storage", "quint4x2"}, {"torch.QUInt2x4Storage", "quint2x4"}};
  for (const auto& [name, dtype] : kUnsupported) {
    if (global == name) return dtype;
  }
  return nullptr;
}

Status Refused(const std::string& what) {
  return InvalidArgument(what + " (torch.load(weights_only=True) refuses it too)");
}

class Unpickler : public PickleStack<Value> {
 public:
  explicit Unpickler(const std::string& data) : PickleStack(data.size()), data_(data) {}
  // One pickle of several back to back in `data` (the legacy format), from `start`; persistent
  // ids then carry legacy's sixth field (view metadata, None).
  Unpickler(const std::string& data, size_t start) : Unpickler(data) {
    pos_ = start_ = start;
    legacy_ = true;
  }
  // A value blob's pickle (a DCP byte item): only bytes are built by a call; an OrderedDict,
  // torch.Size or layout would come out as a dict, tuple or string, their types lost.
  void PlainValuesOnly() { plain_values_only_ = true; }

  Result<Value*> Run() {
    while (pos_ < data_.size()) {
      const size_t at = pos_;
      unsigned char op = static_cast<unsigned char>(data_[pos_++]);
      Status status = Step(op);
      if (!status.ok()) return status.WithContext("pickle at offset " + std::to_string(at));
      if (done_) return Final();
    }
    ran_out_ = true;
    return DataLoss("pickle is truncated (no STOP)");
  }
  size_t end() const { return pos_; }
  // The last Run stopped at the end of the data: more bytes of the same file may complete it.
  bool ran_out() const { return ran_out_; }
  // Every storage a persistent id named: key -> bytes per element (1 for an UntypedStorage).
  const std::map<std::string, size_t>& storages() const { return storages_; }

  std::vector<PickleTensor>& tensors() { return tensors_; }

 private:
  bool Need(size_t n) {
    if (n <= data_.size() - pos_) return true;
    ran_out_ = true;
    return false;
  }
  uint64_t ReadLe(size_t n) {
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(static_cast<unsigned char>(data_[pos_ + k])) << (8 * k);
    pos_ += n;
    return v;
  }
  Status PushTuple(std::vector<Value*> items) {
    SC_ASSIGN_OR_RETURN(Value* t, New(Value::kTuple));
    t->items = std::move(items);
    return Push(t);
  }
  Status SetItems(const char* op, const std::vector<Value*>& kv) {
    if (kv.size() % 2) return DataLoss(std::string(op) + " with an odd number of values");
    SC_ASSIGN_OR_RETURN(Value* dict, Top(op));
    if (dict->kind != Value::kDict) return Refused(std::string(op) + " on a " + KindName(dict->kind));
    SC_RETURN_IF_ERROR(Charge(kv.size() * sizeof(Value*)));
    dict->items.insert(dict->items.end(), kv.begin(), kv.end());
    return Status::Ok();
  }
  Status PushGlobal(const std::string& module, const std::string& name) {
    auto it = AllowedGlobals().find(module + "." + name);
    if (it == AllowedGlobals().end()) {
      return InvalidArgument("global '" + module + "." + name +
                             "' is not allowed (shardckpt reads tensors, dicts, lists and plain values, a subset "
                             "of what torch.load(weights_only=True) accepts; nothing in the file is executed)");
    }
    if (plain_values_only_ && it->rfind("torch._utils._rebuild_", 0) == 0) {
      // Named here, before its arguments (an OrderedDict of hooks) would be refused instead.
      return InvalidArgument("a tensor is not a plain value (a value pickled whole with its tensors, as DCP saves a "
                             "tuple holding tensors; shardckpt reads the tensors DCP stores as tensors)");
    }
    SC_ASSIGN_OR_RETURN(Value* v, New(Value::kGlobal));
    v->s = *it;
    return Push(v);
  }

  // torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad,
  // backward_hooks[, metadata]) and _rebuild_tensor_v3(..., backward_hooks, dtype[, metadata]),
  // which torch 2.x writes for dtypes without a storage class (float8, uint16, ...) over an
  // UntypedStorage: the arity and types torch's own call would accept.
  Status RebuildTensor(const std::vector<Value*>& a, bool v3) {
    const char* fn = v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2";
    const size_t fixed = v3 ? 7 : 6;
    if (a.size() != fixed && a.size() != fixed + 1) {
      return Refused(std::string(fn) + " with " + std::to_string(a.size()) + " arguments, not " + std::to_string(fixed) +
                     " or " + std::to_string(fixed + 1));
    }
    if (a[0]->kind != Value::kStorage || a[1]->kind != Value::kInt || a[2]->kind != Value::kTuple ||
        a[3]->kind != Value::kTuple || a[4]->kind != Value::kBool || a[5]->kind != Value::kDict ||
        (v3 && (a[6]->kind != Value::kGlobal || a[6]->s.substr(0, 6) != "torch.")) ||
        (a.size() == fixed + 1 && a[fixed]->kind != Value::kDict && a[fixed]->kind != Value::kNone)) {
      return DataLoss(std::string(fn) + " arguments are not (storage, int, tuple, tuple, bool, dict" +
                      (v3 ? ", dtype" : "") + "[, dict])");
    }
    PickleTensor t;
    t.dtype = a[0]->dtype;
    t.storage_key = std::string(a[0]->s);
    t.storage_numel = a[0]->i;
    t.storage_offset = a[1]->i;
    const char* unsupported = a[0]->unsupported;
    if (v3) {  // the tensor's dtype is named; its storage's elements keep their own size
      t.storage_element_size = DTypeSize(a[0]->dtype);
      const std::string dtype(a[6]->s.substr(6));
      for (const char* name : kUnsupportedDTypes) {
        if (dtype == name) unsupported = name;
      }
      if (!unsupported) {
        SC_ASSIGN_OR_RETURN(t.dtype, ParseDType(dtype));
      }
    }
    for (int k : {2, 3}) {
      for (const Value* d : a[k]->items) {
        if (d->kind != Value::kInt) return DataLoss(std::string("tensor ") + (k == 2 ? "size" : "stride") + " is not an integer");
        (k == 2 ? t.sizes : t.strides).push_back(d->i);
      }
    }
    if (a.size() == fixed + 1 && a[fixed]->kind == Value::kDict && !unsupported) unsupported = ViewFlag(*a[fixed]);
    SC_RETURN_IF_ERROR(Charge(sizeof(PickleTensor) + t.storage_key.size() + 16 * t.sizes.size()));
    tensors_.push_back(std::move(t));
    SC_ASSIGN_OR_RETURN(Value* tensor, New(Value::kTensor));
    tensor->i = static_cast<int64_t>(tensors_.size() - 1);
    tensor->unsupported = unsupported;
    return Push(tensor);
  }

  // torch 2.x's tensor metadata (torch._utils.get_tensor_metadata), which torch.load applies after
  // rebuilding: {'neg': True} for a negative view, {'conj': True} for a conjugate one. Their
  // storages hold the values before negation or conjugation; read as they are, the values would
  // come out negated without a word. Null when no flag is set (an empty dict, or flags False).
  static const char* ViewFlag(const Value& metadata) {
    for (size_t k = 0; k + 1 < metadata.items.size(); k += 2) {
      const Value* key = metadata.items[k];
      const Value* value = metadata.items[k + 1];
      if ((value->kind == Value::kBool || value->kind == Value::kInt) && value->i == 0) continue;
      if (value->kind == Value::kNone) continue;
      if (key->kind == Value::kString && key->s == "neg") return kNegativeView;
      if (key->kind == Value::kString && key->s == "conj") return kConjugateView;
      return kOtherTensorMetadata;
    }
    return nullptr;
  }

  // A tensor of a kind shardckpt does not take (`why`: its dtype or layout), refused where its
  // name is known (Flattener::Leaf).
  Status PushRefusedTensor(const char* why) {
    SC_ASSIGN_OR_RETURN(Value* tensor, New(Value::kTensor));
    tensors_.emplace_back();  // keeps tensor->i an index, though it is never read
    tensor->i = static_cast<int64_t>(tensors_.size() - 1);
    tensor->unsupported = why;
    return Push(tensor);
  }

  // REDUCE, interpreted only for the allowed callables (see OpGlobal).
  Status OpReduce(unsigned char) {
    SC_ASSIGN_OR_RETURN(Value* args, Pop());
    SC_ASSIGN_OR_RETURN(Value* callable, Pop());
    if (callable->kind != Value::kGlobal || args->kind != Value::kTuple) return DataLoss("REDUCE of a non-callable");
    const std::string_view name = callable->s;
    const std::vector<Value*>& a = args->items;
    const bool bytearray = name == "__builtin__.bytearray" || name == "builtins.bytearray";
    if (plain_values_only_ && name != "_codecs.encode" && name != "__builtin__.bytes" && name != "builtins.bytes" &&
        !bytearray) {
      return InvalidArgument("a " + std::string(name) + " is not a plain value (a value blob would not keep its type)");
    }
    if (name == "collections.OrderedDict") {
      if (!a.empty()) return DataLoss("OrderedDict with arguments");
      SC_ASSIGN_OR_RETURN(Value* dict, New(Value::kDict));
      dict->ordered = true;
      return Push(dict);
    }
    if (name == "torch._utils._rebuild_parameter") {  // (data, requires_grad, backward_hooks)
      if (a.size() != 3) return Refused("_rebuild_parameter with " + std::to_string(a.size()) + " arguments, not 3");
      if (a[0]->kind != Value::kTensor || a[1]->kind != Value::kBool || a[2]->kind != Value::kDict) {
        return DataLoss("_rebuild_parameter arguments are not (tensor, bool, dict)");
      }
      return Push(a[0]);
    }
    // (data, requires_grad, backward_hooks, state): the state (the Parameter's Python attributes)
    // is not kept, as requires_grad is not; the tensor is.
    if (name == "torch._utils._rebuild_parameter_with_state") {
      if (a.size() != 4) {
        return Refused("_rebuild_parameter_with_state with " + std::to_string(a.size()) + " arguments, not 4");
      }
      if (a[0]->kind != Value::kTensor || a[1]->kind != Value::kBool) {
        return DataLoss("_rebuild_parameter_with_state arguments do not start with (tensor, bool)");
      }
      return Push(a[0]);
    }
    if (name == "torch._utils._rebuild_tensor_v2") return RebuildTensor(a, false);
    if (name == "torch._utils._rebuild_tensor_v3") return RebuildTensor(a, true);
    if (name == "__builtin__.bytes" || name == "builtins.bytes") {  // protocol 2's b'': bytes()
      if (!a.empty()) return InvalidArgument("bytes() is called only as protocol 2 pickles b'': with no arguments");
      return PushNew(Value::kBytes, 0);
    }
    if (bytearray) {  // () or (bytes,): the bytes, typed as a bytearray
      if (a.size() > 1 || (a.size() == 1 && a[0]->kind != Value::kBytes)) {
        return InvalidArgument("bytearray() is called only as torch.save pickles a bytearray: with bytes or nothing");
      }
      SC_ASSIGN_OR_RETURN(Value* v, New(Value::kBytes));
      if (!a.empty()) v->s = a[0]->s;
      v->bytearray = true;
      return Push(v);
    }
    if (name == "_codecs.encode") {  // (str, "latin1"): the str's code points are the bytes
      if (a.size() != 2 || a[0]->kind != Value::kString || a[1]->kind != Value::kString || a[1]->s != "latin1") {
        return InvalidArgument("_codecs.encode is called only as protocol 2 pickles bytes: (str, 'latin1')");
      }
      std::string bytes;
      const std::string_view text = a[0]->s;
      for (size_t k = 0; k < text.size(); ++k) {
        const unsigned char c = static_cast<unsigned char>(text[k]);
        if (c < 0x80) {
          bytes += static_cast<char>(c);
        } else if ((c == 0xC2 || c == 0xC3) && k + 1 < text.size() &&
                   (static_cast<unsigned char>(text[k + 1]) & 0xC0) == 0x80) {  // U+0080..U+00FF in UTF-8
          bytes += static_cast<char>(((c & 0x03) << 6) | (static_cast<unsigned char>(text[++k]) & 0x3F));
        } else {
          return InvalidArgument("_codecs.encode of a character past U+00FF to latin1");
        }
      }
      SC_RETURN_IF_ERROR(Charge(2 * bytes.size()));
      owned_.push_back(std::move(bytes));
      SC_ASSIGN_OR_RETURN(Value* v, New(Value::kBytes));
      v->s = owned_.back();
      return Push(v);
    }
    if (name == "torch.serialization._get_layout") {  // ("torch.sparse_coo",): the name stands for it
      if (a.size() != 1 || a[0]->kind != Value::kString) return DataLoss("_get_layout arguments are not (str,)");
      return Push(a[0]);
    }
    if (name == "torch.Size") {  // (tuple of ints,): the tuple
      if (a.size() != 1 || a[0]->kind != Value::kTuple) return DataLoss("torch.Size arguments are not (tuple,)");
      return Push(a[0]);
    }
    if (name == "torch.device") {  // ("cuda", 0) or ("cpu",): an opaque value, skipped by import
      if (a.empty() || a.size() > 2 || a[0]->kind != Value::kString) return DataLoss("torch.device arguments are not (str[, int])");
      return Push(callable);
    }
    if (name == "torch._utils._rebuild_sparse_tensor") {  // (layout, data): refused where its name is known
      if (a.empty() || a[0]->kind != Value::kString || a[0]->s.substr(0, 12) != "torch.sparse") {
        return DataLoss("_rebuild_sparse_tensor without a sparse layout");
      }
      static const char* const kLayouts[] = {"torch.sparse_coo", "torch.sparse_csr", "torch.sparse_csc",
                                             "torch.sparse_bsr", "torch.sparse_bsc"};
      const char* layout = "torch.sparse (another layout)";
      for (const char* known : kLayouts) {
        if (a[0]->s == known) layout = known;
      }
      return PushRefusedTensor(layout);
    }
    if (name == "torch._utils._rebuild_qtensor") {
      // (storage, offset, size, stride, quantizer_params, requires_grad, hooks): a tensor of a
      // dtype shardckpt has no type for, refused where its name is known (Flattener::Leaf).
      if (a.empty() || a[0]->kind != Value::kStorage) return DataLoss("_rebuild_qtensor without a storage");
      return PushRefusedTensor(a[0]->unsupported ? a[0]->unsupported : "quantized");
    }
    return InvalidArgument("REDUCE of " + std::string(name) +
                           " is not supported (only OrderedDict, the tensor rebuilds and _rebuild_parameter are called)");
  }

  // ---- opcode handlers, one per opcode family; Table() maps each allowed opcode to one.
  using Handler = Status (Unpickler::*)(unsigned char op);

  // Framing: the protocol header, FRAME lengths (read whole, so skipped), STOP.
  Status OpProto(unsigned char) {
    if (!Need(1)) return DataLoss("truncated");
    unsigned proto = static_cast<unsigned char>(data_[pos_++]);
    proto_ = proto;
    return CheckPickleProtocol(proto);
  }
  Status OpFrame(unsigned char) {
    if (!Need(8)) return DataLoss("truncated");
    const uint64_t length = ReadLe(8);
    return CheckPickleFrame(length, data_.size() - pos_);
  }
  Status OpStop(unsigned char) {
    done_ = true;
    return Status::Ok();
  }

  // Constants: None, booleans, integers, floats (kept only as leaves), strings.
  Status OpNone(unsigned char) { return PushNew(Value::kNone); }
  Status OpBool(unsigned char op) { return PushNew(Value::kBool, op == 0x88); }
  Status OpInt(unsigned char op) {  // BININT1, BININT2, BININT
    size_t n = op == 'K' ? 1 : op == 'M' ? 2 : 4;
    if (!Need(n)) return DataLoss("truncated integer");
    uint64_t raw = ReadLe(n);
    return PushNew(Value::kInt, op == 'J' ? static_cast<int32_t>(raw) : static_cast<int64_t>(raw));
  }
  Status OpLong1(unsigned char op) {  // LONG1, LONG4: a 1- or 4-byte length, then the bytes
    const size_t width = op == 0x8a ? 1 : 4;
    if (!Need(width)) return DataLoss("truncated LONG1");
    size_t n = static_cast<size_t>(ReadLe(width));
    if (!Need(n)) return DataLoss("truncated LONG1");
    // torch.load takes any width; one past 64 bits can be a leaf (a seed), never a tensor field.
    if (n > 8) {
      SC_ASSIGN_OR_RETURN(Value* v, New(Value::kBigInt));
      v->s = std::string_view(data_).substr(pos_, n);  // little-endian two's complement
      pos_ += n;
      return Push(v);
    }
    uint64_t raw = ReadLe(n);
    if (n > 0 && n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~uint64_t{0} << (8 * n);  // sign-extend
    return PushNew(Value::kInt, static_cast<int64_t>(raw));
  }
  Status OpFloat(unsigned char) {  // BINFLOAT: big-endian IEEE double
    if (!Need(8)) return DataLoss("truncated float");
    uint64_t bits = 0;
    for (int k = 0; k < 8; ++k) bits = bits << 8 | static_cast<unsigned char>(data_[pos_ + k]);
    pos_ += 8;
    SC_ASSIGN_OR_RETURN(Value* v, New(Value::kFloat));
    std::memcpy(&v->f, &bits, 8);
    return Push(v);
  }
  Status OpBytes(unsigned char op) {  // SHORT_BINBYTES, BINBYTES, BINBYTES8
    return PushSized(Value::kBytes, op == 'C' ? 1 : op == 'B' ? 4 : 8, "bytes");
  }
  Status OpString(unsigned char op) {  // BINUNICODE, SHORT_BINUNICODE
    return PushSized(Value::kString, op == 'X' ? 4 : 1, "string");
  }
  // A length of `width` bytes, then that many bytes: a view into the pickle.
  Status PushSized(Value::Kind kind, size_t width, const char* what) {
    if (!Need(width)) return DataLoss(std::string("truncated ") + what);
    uint64_t n = ReadLe(width);
    if (!Need(n)) return DataLoss(std::string(what) + " runs past the end");
    SC_ASSIGN_OR_RETURN(Value* v, New(kind));
    v->s = std::string_view(data_).substr(pos_, n);
    pos_ += n;
    return Push(v);
  }

  // Memo: BINPUT, LONG_BINPUT, MEMOIZE store the top of the stack; BINGET, LONG_BINGET push it again.
  Status OpMemoPut(unsigned char op) {
    size_t width = op == 'q' ? 1 : op == 'r' ? 4 : 0;
    if (!Need(width)) return DataLoss("truncated memo put");
    uint64_t key = width ? ReadLe(width) : memo_count();
    SC_ASSIGN_OR_RETURN(Value* top, Top("memo put"));
    return MemoPut(key, top);
  }
  Status OpMemoGet(unsigned char op) {
    size_t width = op == 'h' ? 1 : 4;
    if (!Need(width)) return DataLoss("truncated memo get");
    Value* v = MemoGet(ReadLe(width));
    if (!v) return DataLoss("memo get of an unknown key");
    return Push(v);
  }

  // Containers: MARK, empty ones, tuples, and filling the dict or list on top of the stack.
  Status OpMark(unsigned char) {
    marks_.push_back(stack_.size());
    return Charge(sizeof(size_t));
  }
  Status OpEmptyTuple(unsigned char) { return PushTuple({}); }
  Status OpEmptyList(unsigned char) { return PushNew(Value::kList); }
  Status OpEmptyDict(unsigned char) { return PushNew(Value::kDict); }
  Status OpTuple(unsigned char) {
    SC_ASSIGN_OR_RETURN(auto items, PopToMark());
    return PushTuple(std::move(items));
  }
  Status OpTupleN(unsigned char op) {  // TUPLE1, TUPLE2, TUPLE3
    size_t n = op - 0x84u;
    std::vector<Value*> items(n);
    for (size_t k = n; k-- > 0;) {
      SC_ASSIGN_OR_RETURN(items[k], Pop());
    }
    return PushTuple(std::move(items));
  }
  Status OpSetItem(unsigned char) {
    SC_ASSIGN_OR_RETURN(Value* value, Pop());
    SC_ASSIGN_OR_RETURN(Value* key, Pop());
    return SetItems("SETITEM", {key, value});
  }
  Status OpSetItems(unsigned char) {
    SC_ASSIGN_OR_RETURN(auto kv, PopToMark());
    return SetItems("SETITEMS", kv);
  }
  Status OpAppend(unsigned char op) {  // APPEND, APPENDS
    std::vector<Value*> items;
    if (op == 'a') {
      SC_ASSIGN_OR_RETURN(Value* v, Pop());
      items.push_back(v);
    } else {
      SC_ASSIGN_OR_RETURN(items, PopToMark());
    }
    SC_ASSIGN_OR_RETURN(Value* list, Top(op == 'a' ? "APPEND" : "APPENDS"));
    if (list->kind != Value::kList) return Refused(std::string("APPEND on a ") + KindName(list->kind));
    SC_RETURN_IF_ERROR(Charge(items.size() * sizeof(Value*)));
    list->items.insert(list->items.end(), items.begin(), items.end());
    return Status::Ok();
  }

  // Globals and calls, the weights_only rules: GLOBAL and STACK_GLOBAL only from the allowlist,
  // persistent ids only as torch's storages, REDUCE only of the allowed callables, BUILD only of
  // an OrderedDict's attributes.
  Status OpGlobal(unsigned char) {
    SC_ASSIGN_OR_RETURN(std::string module, GlobalLine(data_, &pos_));
    SC_ASSIGN_OR_RETURN(std::string name, GlobalLine(data_, &pos_));
    return PushGlobal(module, name);
  }
  Status OpStackGlobal(unsigned char) {  // protocol 4: module and name from the stack
    SC_ASSIGN_OR_RETURN(Value* name, Pop());
    SC_ASSIGN_OR_RETURN(Value* module, Pop());
    if (module->kind != Value::kString || name->kind != Value::kString) return DataLoss("STACK_GLOBAL of non-strings");
    // As GLOBAL's lines: no allowed name is longer, and the refusal quotes it.
    if (module->s.size() > 256 || name->s.size() > 256) return InvalidArgument("STACK_GLOBAL of a name over 256 bytes");
    return PushGlobal(std::string(module->s), std::string(name->s));
  }
  Status OpPersistentId(unsigned char) {  // BINPERSID: ('storage', StorageType, key, location, numel)
    SC_ASSIGN_OR_RETURN(Value* pid, Pop());
    // Legacy files add view metadata, None unless a storage was a view of another (torch < 1.0).
    const size_t fields = legacy_ ? 6 : 5;
    if (pid->kind != Value::kTuple || pid->items.size() != fields || pid->items[0]->kind != Value::kString ||
        pid->items[0]->s != "storage" || pid->items[1]->kind != Value::kGlobal ||
        pid->items[2]->kind != Value::kString || pid->items[4]->kind != Value::kInt ||
        (legacy_ && pid->items[5]->kind != Value::kNone)) {
      return DataLoss("unsupported persistent id");
    }
    SC_ASSIGN_OR_RETURN(Value* v, New(Value::kStorage));
    v->unsupported = UnsupportedStorageDType(pid->items[1]->s);
    if (pid->items[1]->s == "torch.storage.UntypedStorage" || pid->items[1]->s == "torch.UntypedStorage") {
      v->dtype = DType::kUInt8;  // as torch.load types it, until _rebuild_tensor_v3 names a dtype
    } else if (!v->unsupported) {
      SC_ASSIGN_OR_RETURN(v->dtype, ParseTorchStorageName(std::string(pid->items[1]->s.substr(std::strlen("torch.")))));
    }
    v->s = pid->items[2]->s;
    v->i = pid->items[4]->i;
    if (legacy_) {
      size_t element = DTypeSize(v->dtype);
      if (v->unsupported) element = std::string_view(v->unsupported) == "complex32" || v->unsupported == std::string_view("qint32") ? 4 : 1;
      SC_RETURN_IF_ERROR(Charge(64 + v->s.size()));
      storages_.emplace(std::string(v->s), element);
    }
    return Push(v);
  }
  Status OpBuild(unsigned char) {  // an OrderedDict's attributes (state_dict's _metadata) carry no tensors
    SC_ASSIGN_OR_RETURN(Value* state, Pop());
    SC_ASSIGN_OR_RETURN(Value* target, Top("BUILD"));
    if (target->kind != Value::kDict || !target->ordered) {
      return Refused(std::string("BUILD on a ") + (target->kind == Value::kDict ? "plain dict" : KindName(target->kind)));
    }
    if (state->kind != Value::kDict) return Refused(std::string("BUILD of an OrderedDict with a ") + KindName(state->kind));
    return Status::Ok();
  }

  // Every opcode not in the table, whatever torch.load would do with it.
  Status OpNotAllowed(unsigned char op) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02x", op);
    return InvalidArgument(std::string("pickle opcode ") + hex + " (in a protocol " + std::to_string(proto_) +
                           " pickle) is not allowed: shardckpt reads the opcodes torch.save writes");
  }

  // The opcodes this reader takes, by family; any other byte is refused by OpNotAllowed.
  static const std::array<Handler, 256>& Table() {
    static const std::array<Handler, 256> kTable = [] {
      std::array<Handler, 256> t;
      t.fill(&Unpickler::OpNotAllowed);
      const std::pair<unsigned char, Handler> kOps[] = {
          {0x80, &Unpickler::OpProto}, {0x95, &Unpickler::OpFrame}, {'.', &Unpickler::OpStop},
          {'N', &Unpickler::OpNone}, {0x88, &Unpickler::OpBool}, {0x89, &Unpickler::OpBool},
          {'K', &Unpickler::OpInt}, {'M', &Unpickler::OpInt}, {'J', &Unpickler::OpInt},
          {0x8a, &Unpickler::OpLong1}, {0x8b, &Unpickler::OpLong1}, {'G', &Unpickler::OpFloat}, {'X', &Unpickler::OpString},
          {0x8c, &Unpickler::OpString}, {'C', &Unpickler::OpBytes}, {'B', &Unpickler::OpBytes},
          {0x8e, &Unpickler::OpBytes},
          {'q', &Unpickler::OpMemoPut}, {'r', &Unpickler::OpMemoPut}, {0x94, &Unpickler::OpMemoPut},
          {'h', &Unpickler::OpMemoGet}, {'j', &Unpickler::OpMemoGet},
          {'(', &Unpickler::OpMark}, {')', &Unpickler::OpEmptyTuple}, {']', &Unpickler::OpEmptyList},
          {'}', &Unpickler::OpEmptyDict}, {'t', &Unpickler::OpTuple}, {0x85, &Unpickler::OpTupleN},
          {0x86, &Unpickler::OpTupleN}, {0x87, &Unpickler::OpTupleN}, {'s', &Unpickler::OpSetItem},
          {'u', &Unpickler::OpSetItems}, {'a', &Unpickler::OpAppend}, {'e', &Unpickler::OpAppend},
          {'c', &Unpickler::OpGlobal}, {0x93, &Unpickler::OpStackGlobal}, {'Q', &Unpickler::OpPersistentId},
          {'R', &Unpickler::OpReduce}, {'b', &Unpickler::OpBuild},
      };
      for (const auto& [op, handler] : kOps) t[op] = handler;
      return t;
    }();
    return kTable;
  }

  Status Step(unsigned char op) {
    if (pos_ == start_ + 1 && op != 0x80) return RefuseProtocolZeroOrOne();
    return (this->*Table()[op])(op);
  }

  const std::string& data_;
  std::deque<std::string> owned_;  // bytes rebuilt from _codecs.encode (stable addresses for views)
  size_t pos_ = 0;
  size_t start_ = 0;
  unsigned proto_ = 0;
  bool legacy_ = false;
  bool plain_values_only_ = false;
  bool ran_out_ = false;
  std::map<std::string, size_t> storages_;
  bool done_ = false;
  std::vector<PickleTensor> tensors_;
};

// Nested dicts, and lists and tuples holding tensors, to dotted names (list items by index, as
// DCP and the Python package name them: "lst.0"). A dict, list or tuple holding no tensor is one
// value, encoded as the Python package's typed JSON blob. A container shared by two keys is
// visited under both (torch.load gives both), charged to the unpickler's budget, so a fan-out of
// shared references stops there; a container inside itself is refused.
class Flattener {
 public:
  Flattener(Unpickler* unpickler, UnpickledStateDict* out) : unpickler_(unpickler), out_(out) {}

  Status Visit(Value* container, const std::string& prefix, int depth) {
    // torch.load takes any depth: a deeper file is valid, just not one this reader takes.
    if (depth > 64) {
      return Status(Code::kUnimplemented, Where(prefix) + " is nested in more than 64 containers, more than shardckpt imports");
    }
    if (container->on_path) return InvalidArgument(Where(prefix) + " contains itself (a state dict cannot)");
    container->on_path = true;
    Status status = VisitItems(container, prefix, depth);
    container->on_path = false;
    return status;
  }

  // One value as the Python package's typed JSON; false when it cannot be (see ToJson).
  Result<bool> Encode(Value* v, nlohmann::ordered_json* out) { return ToJson(v, 0, out); }

 private:
  bool IsContainer(const Value* v) const { return v->kind == Value::kDict || v->kind == Value::kList || v->kind == Value::kTuple; }

  // Whether a tensor is anywhere inside `v` (a container on the current path counts as none: the
  // visit refuses the cycle). Charged per node, so shared references cannot make it explode.
  Result<bool> HoldsTensor(Value* v, int depth) {
    if (v->kind == Value::kTensor) return true;
    if (!IsContainer(v) || v->on_path || depth > 64) return false;
    SC_RETURN_IF_ERROR(unpickler_->Charge(16));
    v->on_path = true;
    bool found = false;
    for (size_t k = v->kind == Value::kDict ? 1 : 0; k < v->items.size() && !found; k += v->kind == Value::kDict ? 2 : 1) {
      Result<bool> inner = HoldsTensor(v->items[k], depth + 1);
      if (!inner.ok()) {
        v->on_path = false;
        return inner.status();
      }
      found = *inner;
    }
    v->on_path = false;
    return found;
  }

  static constexpr const char* kTag = "__shardckpt__";

  // The Python package's typed JSON (python/shardckpt/_state.py): None, bool, int, str, float
  // (non-finite ones tagged), list, {tag: tuple}, dicts with string keys as objects and others
  // tagged. False for what it cannot hold (a torch.dtype or torch.device value, a cycle), why in
  // unstorable_.
  Result<bool> ToJson(Value* v, int depth, nlohmann::ordered_json* out) {
    SC_RETURN_IF_ERROR(unpickler_->Charge(64 + v->s.size()));
    if (depth > 64) return Unstorable("nested more than 64 deep");
    if (v->on_path) return Unstorable("it holds itself");
    switch (v->kind) {
      case Value::kNone: *out = nullptr; return true;
      case Value::kBool: *out = v->i != 0; return true;
      case Value::kInt: *out = v->i; return true;
      case Value::kString: *out = std::string(v->s); return true;
      case Value::kFloat:
        if (std::isfinite(v->f)) {
          *out = v->f;
        } else {
          *out = {{kTag, "float"}, {"v", std::isnan(v->f) ? "nan" : v->f > 0 ? "inf" : "-inf"}};
        }
        return true;
      case Value::kList:
      case Value::kTuple:
      case Value::kDict: {
        v->on_path = true;
        nlohmann::ordered_json items = nlohmann::ordered_json::array();
        bool string_keys = true;
        bool ok = true;
        for (size_t k = 0; k < v->items.size() && ok; ++k) {
          nlohmann::ordered_json item;
          Result<bool> done = ToJson(v->items[k], depth + 1, &item);
          if (!done.ok()) {
            v->on_path = false;
            return done.status();
          }
          ok = *done;
          if (v->kind == Value::kDict && k % 2 == 0 && (v->items[k]->kind != Value::kString || v->items[k]->s == kTag)) {
            string_keys = false;
          }
          items.push_back(std::move(item));
        }
        v->on_path = false;
        if (!ok) return false;
        if (v->kind == Value::kList) {
          *out = std::move(items);
        } else if (v->kind == Value::kTuple) {
          *out = {{kTag, "tuple"}, {"v", std::move(items)}};
        } else if (string_keys) {
          *out = nlohmann::ordered_json::object();
          for (size_t k = 0; k + 1 < items.size(); k += 2) (*out)[items[k].get<std::string>()] = std::move(items[k + 1]);
        } else {
          nlohmann::ordered_json pairs = nlohmann::ordered_json::array();
          for (size_t k = 0; k + 1 < items.size(); k += 2) pairs.push_back({std::move(items[k]), std::move(items[k + 1])});
          *out = {{kTag, "dict"}, {"v", std::move(pairs)}};
        }
        return true;
      }
      case Value::kBytes: *out = {{kTag, v->bytearray ? "bytearray" : "bytes"}, {"v", Base64Encode(v->s)}}; return true;
      case Value::kBigInt: {  // wider than 64 bits (a uint64 seed pickles as 9 bytes): tagged, in hex
        *out = {{kTag, "int"}, {"v", HexEncode(v->s)}};
        return true;
      }
      case Value::kGlobal:  // a torch.dtype (torch.float16) or a torch.device
        return Unstorable("a " + std::string(v->s) + " value, a Python object rather than plain data");
      default: return Unstorable(std::string("a ") + KindName(v->kind) + " inside a value");
    }
  }

  // Why the value being encoded has no typed-JSON form: the skipped leaf's note.
  bool Unstorable(std::string why) {
    unstorable_ = std::move(why);
    return false;
  }

  Status Leaf(std::string name, Value* value, int depth) {
    if (!names_.insert(name).second) {
      return InvalidArgument("the name '" + name + "' occurs twice (a dotted key and a nested dict, or 1 and \"1\")");
    }
    if (path_.size() > 1 || path_.back().int_key) {
      SC_RETURN_IF_ERROR(unpickler_->Charge(name.size() + 48 * path_.size()));
      out_->paths.emplace_back(name, path_);
    }
    if (value->kind == Value::kTensor && value->unsupported) {
      return Status(Code::kUnimplemented, "tensor '" + name + "': " + RefusedTensorText(value->unsupported));
    }
    if (value->kind == Value::kTensor) {
      const PickleTensor& t = unpickler_->tensors()[static_cast<size_t>(value->i)];
      SC_RETURN_IF_ERROR(unpickler_->Charge(sizeof(PickleTensor) + 16 * t.sizes.size()));
      out_->tensors.push_back(t);
      out_->tensors.back().name = std::move(name);
      return Status::Ok();
    }
    nlohmann::ordered_json json;
    SC_ASSIGN_OR_RETURN(bool encoded, ToJson(value, depth, &json));
    if (!encoded) {
      out_->skipped.push_back(name + " (" + unstorable_ + ")");
      return Status::Ok();
    }
    std::string text = std::string(kPickleValueTag, 2) + json.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);  // hostile bytes: never a throw
    SC_RETURN_IF_ERROR(unpickler_->Charge(2 * text.size()));
    out_->values.push_back(PickleValue{std::move(name), std::move(text), out_->tensors.size()});
    return Status::Ok();
  }

  Status VisitItems(Value* container, const std::string& prefix, int depth) {
    const bool dict = container->kind == Value::kDict;
    for (size_t k = 0, index = 0; k < container->items.size(); k += dict ? 2 : 1, ++index) {
      if (dict && k + 1 >= container->items.size()) break;
      std::string name;
      StatePathStep step;
      if (dict) {
        const Value* key = container->items[k];
        if (key->kind != Value::kString && key->kind != Value::kInt) {
          return InvalidArgument("a key in " + Where(prefix) + " is a " + KindName(key->kind) + ", not a string or integer");
        }
        name = key->kind == Value::kString ? std::string(key->s) : std::to_string(key->i);
        if (name.empty()) return InvalidArgument("a key in " + Where(prefix) + " is empty: it cannot name an entry");
        step = StatePathStep{name, false, key->kind == Value::kInt};
      } else {
        name = std::to_string(index);
        step = StatePathStep{name, true, false, container->kind == Value::kTuple};
      }
      name = prefix + name;
      path_.push_back(std::move(step));
      Status item = VisitItem(std::move(name), container->items[dict ? k + 1 : k], depth);
      path_.pop_back();
      SC_RETURN_IF_ERROR(item);
    }
    return Status::Ok();
  }

  // Item `name` of a container, whose step is path_'s last.
  Status VisitItem(std::string name, Value* value, int depth) {
    SC_RETURN_IF_ERROR(unpickler_->Charge(2 * name.size() + 64));
    // The root's nested dicts are walked even without tensors, as before; lists and tuples,
    // and dicts inside them, only when they hold one (else they are one value). An empty dict
    // (an optimizer's "state" before its first step) would leave no name behind: it is a value.
    // A dict whose keys cannot name entries (a float, None, a tuple, ""), which torch.load
    // takes, is walked only when it holds a tensor (and then refused by VisitItems): one value.
    bool walk = value->kind == Value::kDict && !in_sequence_ && !value->items.empty() && KeysNameEntries(value);
    if (!walk && IsContainer(value)) {
      SC_ASSIGN_OR_RETURN(walk, HoldsTensor(value, depth));
    }
    if (!walk || !IsContainer(value)) return Leaf(std::move(name), value, depth);
    if (value->kind != Value::kDict) {
      out_->containers.emplace_back(name, value->kind == Value::kList ? "list" : "tuple");
    }
    const bool was = in_sequence_;
    in_sequence_ = in_sequence_ || value->kind != Value::kDict;
    Status visited = Visit(value, name + ".", depth + 1);
    in_sequence_ = was;
    return visited;
  }

  static bool KeysNameEntries(const Value* dict) {
    for (size_t k = 0; k < dict->items.size(); k += 2) {
      const Value* key = dict->items[k];
      if (key->kind == Value::kInt) continue;
      if (key->kind != Value::kString || key->s.empty()) return false;
    }
    return true;
  }

  static std::string Where(const std::string& prefix) {
    return prefix.empty() ? "the state dict" : "'" + prefix.substr(0, prefix.size() - 1) + "'";
  }

  Unpickler* unpickler_;
  UnpickledStateDict* out_;
  bool in_sequence_ = false;  // inside a list or tuple: dicts there are walked only for tensors
  std::unordered_set<std::string> names_;
  StatePath path_;  // the steps to the item being visited
  std::string unstorable_;  // set by ToJson where it returns false
};

}  // namespace

Result<PickleTensor> UnpickleTensor(const std::string& pickle) {
  Unpickler unpickler(pickle);
  SC_ASSIGN_OR_RETURN(Value* root, unpickler.Run());
  if (root->kind != Value::kTensor) return InvalidArgument("the pickle holds a " + std::string(KindName(root->kind)) + ", not a tensor");
  if (root->unsupported) return Status(Code::kUnimplemented, RefusedTensorText(root->unsupported));
  return unpickler.tensors()[static_cast<size_t>(root->i)];
}

Result<UnpickledStateDict> UnpickleStateDict(const std::string& pickle) {
  Unpickler unpickler(pickle);
  SC_ASSIGN_OR_RETURN(Value* root, unpickler.Run());
  if (root->kind != Value::kDict) return InvalidArgument("the pickle holds a " + std::string(KindName(root->kind)) + ", not a dict (not a state dict)");
  UnpickledStateDict out;
  SC_RETURN_IF_ERROR(Flattener(&unpickler, &out).Visit(root, "", 0));
  return out;
}

Result<std::string> UnpickleValueBlob(const std::string& pickle) {
  Unpickler unpickler(pickle);
  unpickler.PlainValuesOnly();
  SC_ASSIGN_OR_RETURN(Value* root, unpickler.Run());
  UnpickledStateDict unused;
  nlohmann::ordered_json json;
  SC_ASSIGN_OR_RETURN(bool encoded, Flattener(&unpickler, &unused).Encode(root, &json));
  if (!encoded) {
    return InvalidArgument("the pickle holds a " + std::string(KindName(root->kind)) +
                           " that is, or holds, what a value blob cannot hold (a tensor, a dtype or another object)");
  }
  // A str that is not UTF-8 (only a hand-made pickle has one) must not throw out of dump.
  return std::string(kPickleValueTag, 2) + json.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

Result<LegacyHead> UnpickleLegacyHead(const std::string& head, bool* need_more) {
  LegacyHead out;
  *need_more = false;
  size_t pos = 0;
  // Each pickle in turn; a run that stops at the end of `head` asks for more.
  auto next = [&](Unpickler& u, const char* what) -> Result<Value*> {
    Result<Value*> v = u.Run();
    if (!v.ok() && u.ran_out()) {
      *need_more = true;
      return DataLoss(std::string("the legacy file ends inside its ") + what + " pickle");
    }
    if (!v.ok()) return v.status().WithContext(std::string("legacy ") + what + " pickle");
    pos = u.end();
    return v;
  };
  Unpickler magic(head, pos);
  SC_ASSIGN_OR_RETURN(Value* m, next(magic, "magic number"));
  static const char kMagic[] = "\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19";  // 0x1950a86a20f9469cfc6c
  if (m->kind != Value::kBigInt || m->s != std::string_view(kMagic, 10)) {
    return DataLoss("not a legacy torch.save file: wrong magic number");
  }
  Unpickler version(head, pos);
  SC_ASSIGN_OR_RETURN(Value* v, next(version, "protocol version"));
  if (v->kind != Value::kInt || v->i != 1001) {
    return Status(Code::kUnimplemented, "legacy torch.save protocol version " + (v->kind == Value::kInt ? std::to_string(v->i) : std::string("?")) +
                                            " is not supported (1001 is)");
  }
  Unpickler info(head, pos);
  SC_ASSIGN_OR_RETURN(Value* sys, next(info, "system info"));
  if (sys->kind != Value::kDict) return DataLoss("legacy system info is not a dict");
  for (size_t k = 0; k + 1 < sys->items.size(); k += 2) {
    if (sys->items[k]->kind == Value::kString && sys->items[k]->s == "little_endian" &&
        (sys->items[k + 1]->kind != Value::kBool || sys->items[k + 1]->i == 0)) {
      return Status(Code::kUnimplemented, "a big-endian legacy torch.save file is not supported; load and save it again on "
                                          "a little-endian host");
    }
  }
  Unpickler state(head, pos);
  SC_ASSIGN_OR_RETURN(Value* root, next(state, "state dict"));
  if (root->kind != Value::kDict) return InvalidArgument("the pickle holds a " + std::string(KindName(root->kind)) + ", not a dict (not a state dict)");
  SC_RETURN_IF_ERROR(Flattener(&state, &out.dict).Visit(root, "", 0));
  out.element_size = state.storages();
  Unpickler keys(head, pos);
  SC_ASSIGN_OR_RETURN(Value* list, next(keys, "storage keys"));
  if (list->kind != Value::kList) return DataLoss("the legacy storage keys are not a list");
  for (const Value* key : list->items) {
    if (key->kind != Value::kString) return DataLoss("a legacy storage key is not a string");
    out.storage_keys.emplace_back(key->s);
  }
  out.data_offset = pos;
  return out;
}

}  // namespace shardckpt
