#include "shardckpt/engine/formats/dcp_metadata.h"

#include <cstdio>
#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <string_view>
#include <set>

#include "shardckpt/engine/formats/pickle_stack.h"
#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/engine/model/layout.h"

namespace shardckpt {
namespace {

constexpr const char* kMeta = "torch.distributed.checkpoint.metadata.";
constexpr const char* kMemFormatEnum = "torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING";

// One unpickled value, owned by the machine's arena. kObject is a class instance as data: its
// items are the class (a global), NEWOBJ's arguments and BUILD's state; nothing of the class runs.
// A .metadata holds millions of values (10 to 26 per chunk): each is 16 bytes, its text a view
// into the pickle or into the machine's own strings, its items an array in the machine's item
// arena, so no value owns a heap allocation (a std::string and a std::vector in each made a
// value 56 bytes and most of them a malloc or two: rank 0 held 664 MB reading a .metadata of
// 220,000 chunks, now 304 MB).
struct Value {
  enum Kind : uint8_t { kNone, kBool, kInt, kBigInt, kFloat, kString, kTuple, kList, kDict, kGlobal, kObject };
  Kind kind = kNone;
  bool is_size = false;  // a torch.Size (a tuple of ints)
  uint32_t n = 0;        // a string's or global's bytes; a container's items
  union {
    int64_t i = 0;
    const char* text;  // string, global (the full name)
    Value** items;     // tuple, list, dict as key, value, ...; object: [class, args, state]
  };
  std::string_view s() const { return {text, n}; }
  size_t size() const { return n; }
  bool empty() const { return n == 0; }
  Value* operator[](size_t k) const { return items[k]; }
  Value* const* begin() const { return items; }
  Value* const* end() const { return items + n; }
};
static_assert(sizeof(Value) == 16, "a .metadata's millions of values: keep them small");

const char* KindName(Value::Kind k) {
  static const char* const kNames[] = {"None", "bool", "int", "big int", "float", "string",
                                       "tuple", "list", "dict", "global", "object"};
  return kNames[k];
}

// Classes DCP's metadata pickles as instances (NEWOBJ + BUILD).
const std::set<std::string>& Classes() {
  static const std::set<std::string> k = [] {
    std::set<std::string> s;
    for (const char* c : {"Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
                          "BytesStorageMetadata", "MetadataIndex", "StorageMeta"}) {
      s.insert(std::string(kMeta) + c);
    }
    s.insert("torch.distributed.checkpoint.filesystem._StorageInfo");
    return s;
  }();
  return k;
}

// Callables REDUCE may name, each interpreted below; and dtypes, which pickle as globals.
const std::set<std::string>& OtherGlobals() {
  static const std::set<std::string> k = [] {
    std::set<std::string> s = {"torch.Size", "torch.serialization._get_layout", "builtins.getattr",
                               "collections.OrderedDict", kMemFormatEnum};
    // Python 3.13 pickles its paths from the module pathlib._local.
    for (const char* module : {"pathlib.", "pathlib._local."}) {
      for (const char* path : {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"}) {
        s.insert(std::string(module) + path);
      }
    }
    for (int d = 0; d < kNumDTypes; ++d) s.insert(std::string("torch.") + DTypeName(static_cast<DType>(d)));
    for (const char* name : {"uint16", "uint32", "uint64", "complex32", "complex64", "complex128", "float8_e4m3fnuz",
                             "float8_e5m2fnuz", "float8_e8m0fnu", "qint8", "quint8", "qint32"}) {
      s.insert(std::string("torch.") + name);
    }
    return s;
  }();
  return k;
}

// torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING's members by value.
Result<std::string> MemoryFormatName(int64_t value) {
  static const char* const kNames[] = {"TORCH_CONTIGUOUS_FORMAT", "TORCH_CHANNELS_LAST", "TORCH_PRESERVE_FORMAT"};
  if (value < 0 || value > 2) return DataLoss("_MEM_FORMAT_ENCODING(" + std::to_string(value) + ") is not a member (0 to 2)");
  return std::string(kNames[value]);
}

class Machine : public PickleStack<Value> {
 public:
  explicit Machine(const std::string& data) : PickleStack(data.size()), data_(data) {}

  Result<Value*> Run() {
    if (!data_.empty() && static_cast<unsigned char>(data_[0]) != 0x80) return RefuseProtocolZeroOrOne();
    while (pos_ < data_.size()) {
      const size_t at = pos_;
      Status st = Step(static_cast<unsigned char>(data_[pos_++]));
      if (!st.ok()) return st.WithContext("pickle at offset " + std::to_string(at));
      if (done_) return Final();
    }
    return DataLoss("pickle is truncated (no STOP)");
  }

 private:
  bool Need(size_t n) const { return n <= data_.size() - pos_; }
  uint64_t Le(size_t n) {
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= uint64_t{static_cast<unsigned char>(data_[pos_ + k])} << (8 * k);
    pos_ += n;
    return v;
  }
  Status Global(const std::string& module, const std::string& name) {
    // Protocols below 3 name Python 3's builtins module as Python 2 did (pickle's fix_imports).
    const std::string full = (module == "__builtin__" ? std::string("builtins") : module) + "." + name;
    if (!Classes().count(full) && !OtherGlobals().count(full)) {
      return InvalidArgument("global '" + full + "' is not allowed (only the classes DCP's metadata pickles are; "
                             "nothing in the file is executed)");
    }
    SC_ASSIGN_OR_RETURN(Value* v, New(Value::kGlobal, full.size()));
    SetText(v, Own(full));
    return Push(v);
  }
  Status Tuple(const std::vector<Value*>& items) {
    SC_ASSIGN_OR_RETURN(Value* t, New(Value::kTuple));
    SC_RETURN_IF_ERROR(SetItems(t, items.data(), items.size()));
    return Push(t);
  }
  Status Strings(const Value& a, std::string* out) {
    for (const Value* v : a) {
      if (v->kind != Value::kString) return DataLoss("a path made of a " + std::string(KindName(v->kind)));
      out->append(out->empty() ? "" : "/").append(v->s());
    }
    return Status::Ok();
  }
  // A string's text; at most 4 GiB (a .metadata is read whole and is at most 1 GiB).
  static void SetText(Value* v, std::string_view text) {
    v->text = text.data();
    v->n = static_cast<uint32_t>(text.size());
  }
  // The items of a tuple or an instance, which never change: exactly as many slots.
  Status SetItems(Value* target, Value* const* first, size_t count) {
    if (count == 0) return Status::Ok();
    if (count > UINT32_MAX) return InvalidArgument("a tuple of over 4 billion items");
    SC_ASSIGN_OR_RETURN(target->items, ItemRoom(count));
    std::copy(first, first + count, target->items);
    target->n = static_cast<uint32_t>(count);
    return Status::Ok();
  }
  // A list's or dict's slots: a power of two from 4 up, so that its size says its room and the
  // value needs no field for it.
  static uint64_t RoomOf(uint64_t n) {
    if (n == 0) return 0;
    uint64_t room = 4;
    while (room < n) room *= 2;
    return room;
  }
  // Items appended to a list or dict (APPENDS, SETITEMS), its array grown in the item arena (an
  // outgrown array stays there, charged, until the machine is gone).
  Status Append(Value* target, Value* const* first, size_t count) {
    if (count == 0) return Status::Ok();
    const uint64_t needed = uint64_t{target->n} + count;
    if (needed > UINT32_MAX / 2) return InvalidArgument("a container of over 2 billion items");
    if (needed > RoomOf(target->n)) {
      SC_ASSIGN_OR_RETURN(Value** grown, ItemRoom(RoomOf(needed)));
      std::copy(target->items, target->items + target->n, grown);
      target->items = grown;
    }
    std::copy(first, first + count, target->items + target->n);
    target->n = static_cast<uint32_t>(needed);
    return Status::Ok();
  }
  // `count` item slots, bump-allocated from blocks: one malloc per 64K slots, not one per value.
  Result<Value**> ItemRoom(uint64_t count) {
    SC_RETURN_IF_ERROR(Charge(count * sizeof(Value*)));
    constexpr uint64_t kBlock = uint64_t{1} << 16;
    if (count > kBlock / 4) {
      item_blocks_.push_back(std::make_unique<Value*[]>(count));
      return item_blocks_.back().get();
    }
    // block_ is null until the first small request: a large one first gets a block of its own.
    if (block_ == nullptr || block_used_ + count > kBlock) {
      // A large array's own block sits last: a fresh block goes after it.
      item_blocks_.push_back(std::make_unique<Value*[]>(kBlock));
      block_ = item_blocks_.back().get();
      block_used_ = 0;
    }
    Value** out = block_ + block_used_;
    block_used_ += count;
    return out;
  }
  // REDUCE, for the callables DCP's pickles use; each result is plain data.
  Status Reduce() {
    SC_ASSIGN_OR_RETURN(Value* args, Pop());
    SC_ASSIGN_OR_RETURN(Value* fn, Pop());
    if (fn->kind != Value::kGlobal || args->kind != Value::kTuple) return DataLoss("REDUCE of a non-callable");
    const Value& a = *args;
    const std::string name(fn->s());
    if (name == "torch.Size") {
      if (a.size() != 1 || (a[0]->kind != Value::kTuple && a[0]->kind != Value::kList)) return DataLoss("torch.Size of a non-tuple");
      for (const Value* d : *a[0]) {
        if (d->kind != Value::kInt) return DataLoss("torch.Size holds a " + std::string(KindName(d->kind)));
      }
      // The items are shared, not copied: a tuple's never change, and a list's first n stay as
      // they are when it grows (into a new array; the old one stays in the arena).
      SC_ASSIGN_OR_RETURN(Value* v, New(Value::kTuple));
      v->items = a[0]->items;
      v->n = a[0]->n;
      v->is_size = true;
      return Push(v);
    }
    SC_ASSIGN_OR_RETURN(Value* out, New(Value::kString));
    if (name == kMemFormatEnum && a.size() == 1 && a[0]->kind == Value::kInt) {
      // An enum member by value, `_MEM_FORMAT_ENCODING(0)`: how pip's and conda's Pythons pickle
      // an Enum; early 3.11 releases (Debian 12's 3.11.2) write getattr(class, NAME) (below).
      SC_ASSIGN_OR_RETURN(std::string member, MemoryFormatName(a[0]->i));
      SC_RETURN_IF_ERROR(Charge(member.size()));
      SetText(out, Own(std::move(member)));
    } else if (name == "torch.serialization._get_layout" || name == kMemFormatEnum) {
      if (a.size() != 1 || a[0]->kind != Value::kString) return DataLoss(name + " of a non-string");
      SetText(out, a[0]->s());
    } else if (name == "builtins.getattr") {  // only an enum member: getattr(_MEM_FORMAT_ENCODING, 'NAME')
      if (a.size() != 2 || a[0]->kind != Value::kGlobal || a[0]->s() != kMemFormatEnum ||
          a[1]->kind != Value::kString) {
        return InvalidArgument("getattr is allowed only for a member of _MEM_FORMAT_ENCODING");
      }
      SetText(out, a[1]->s());
    } else if (name.rfind("pathlib.", 0) == 0) {
      std::string path;
      SC_RETURN_IF_ERROR(Strings(a, &path));
      SC_RETURN_IF_ERROR(Charge(path.size()));
      SetText(out, Own(std::move(path)));
    } else if (name == "collections.OrderedDict" && a.empty()) {
      out->kind = Value::kDict;
    } else {
      return InvalidArgument("REDUCE of '" + name + "' is not supported (nothing in the file is executed)");
    }
    return Push(out);
  }

  Status Step(unsigned char op) {
    switch (op) {
      case 0x80: {  // PROTO
        if (!Need(1)) return DataLoss("truncated");
        unsigned proto = static_cast<unsigned char>(data_[pos_++]);
        return CheckPickleProtocol(proto);
      }
      case 0x95: {  // FRAME
        if (!Need(8)) return DataLoss("truncated");
        const uint64_t length = Le(8);
        return CheckPickleFrame(length, data_.size() - pos_);
      }
      case '.':
        done_ = true;
        return Status::Ok();
      case 'N': return PushShared(Value::kNone, 0);
      case 0x88: case 0x89: return PushShared(Value::kBool, op == 0x88);
      case 'K': case 'M': case 'J': {
        size_t n = op == 'K' ? 1 : op == 'M' ? 2 : 4;
        if (!Need(n)) return DataLoss("truncated integer");
        uint64_t raw = Le(n);
        return PushShared(Value::kInt, op == 'J' ? static_cast<int32_t>(raw) : static_cast<int64_t>(raw));
      }
      case 0x8a: {  // LONG1
        if (!Need(1)) return DataLoss("truncated LONG1");
        size_t n = static_cast<unsigned char>(data_[pos_++]);
        if (!Need(n)) return DataLoss("truncated LONG1");
        if (n > 8) {
          pos_ += n;
          return PushNew(Value::kBigInt);
        }
        uint64_t raw = Le(n);
        if (n > 0 && n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~uint64_t{0} << (8 * n);
        return PushShared(Value::kInt, static_cast<int64_t>(raw));
      }
      case 'G':
        if (!Need(8)) return DataLoss("truncated float");
        pos_ += 8;
        return PushNew(Value::kFloat);
      case 'X': case 0x8c: case 0x8d: case 'C': case 'B': case 0x8e: {  // strings and bytes
        size_t width = (op == 'X' || op == 'B') ? 4 : (op == 0x8d || op == 0x8e) ? 8 : 1;
        if (!Need(width)) return DataLoss("truncated string");
        uint64_t n = Le(width);
        if (!Need(n)) return DataLoss("string runs past the end");
        if (n > UINT32_MAX) return InvalidArgument("a string of over 4 GiB");
        SC_ASSIGN_OR_RETURN(Value* v, New(Value::kString));
        SetText(v, std::string_view(data_).substr(pos_, n));
        pos_ += n;
        return Push(v);
      }
      case 'q': case 'r': case 0x94: {  // BINPUT, LONG_BINPUT, MEMOIZE
        size_t width = op == 'q' ? 1 : op == 'r' ? 4 : 0;
        if (!Need(width)) return DataLoss("truncated memo put");
        uint64_t key = width ? Le(width) : memo_count();
        SC_ASSIGN_OR_RETURN(Value* top, Top("memo put"));
        return MemoPut(key, top);
      }
      case 'h': case 'j': {
        size_t width = op == 'h' ? 1 : 4;
        if (!Need(width)) return DataLoss("truncated memo get");
        Value* v = MemoGet(Le(width));
        if (v == nullptr) return DataLoss("memo get of an unknown key");
        return Push(v);
      }
      case '(':
        marks_.push_back(stack_.size());
        return Charge(sizeof(size_t));
      case ')': {  // one empty tuple serves all: every instance's NEWOBJ arguments
        if (empty_tuple_ == nullptr) {
          SC_ASSIGN_OR_RETURN(empty_tuple_, New(Value::kTuple));
        }
        return Push(empty_tuple_);
      }
      case ']': return PushNew(Value::kList);
      case '}': return PushNew(Value::kDict);
      case 't': {
        SC_ASSIGN_OR_RETURN(auto items, PopToMark());
        return Tuple(items);
      }
      case 0x85: case 0x86: case 0x87: {
        std::vector<Value*> items(op - 0x84u);
        for (size_t k = items.size(); k-- > 0;) {
          SC_ASSIGN_OR_RETURN(items[k], Pop());
        }
        return Tuple(items);
      }
      case 's': case 'u': case 'a': case 'e': {  // SETITEM(S), APPEND(S)
        std::vector<Value*> items;
        if (op == 's' || op == 'a') {
          for (int k = op == 's' ? 2 : 1; k-- > 0;) {
            SC_ASSIGN_OR_RETURN(Value* v, Pop());
            items.insert(items.begin(), v);
          }
        } else {
          SC_ASSIGN_OR_RETURN(items, PopToMark());
        }
        SC_ASSIGN_OR_RETURN(Value* target, Top(op == 's' ? "SETITEM" : op == 'u' ? "SETITEMS" : op == 'a' ? "APPEND" : "APPENDS"));
        const bool dict = op == 's' || op == 'u';
        if (target->kind != (dict ? Value::kDict : Value::kList) || (dict && items.size() % 2)) {
          return DataLoss(std::string(dict ? "SETITEMS" : "APPENDS") + " on a " + KindName(target->kind));
        }
        return Append(target, items.data(), items.size());
      }
      case 'c': {
        SC_ASSIGN_OR_RETURN(std::string module, GlobalLine(data_, &pos_));
        SC_ASSIGN_OR_RETURN(std::string name, GlobalLine(data_, &pos_));
        return Global(module, name);
      }
      case 0x93: {
        SC_ASSIGN_OR_RETURN(Value* name, Pop());
        SC_ASSIGN_OR_RETURN(Value* module, Pop());
        if (module->kind != Value::kString || name->kind != Value::kString) return DataLoss("STACK_GLOBAL of non-strings");
        if (module->n > 256 || name->n > 256) return InvalidArgument("STACK_GLOBAL of a name over 256 bytes");
        return Global(std::string(module->s()), std::string(name->s()));
      }
      case 0x81: {  // NEWOBJ: an instance of an allowed class, as data
        SC_ASSIGN_OR_RETURN(Value* args, Pop());
        SC_ASSIGN_OR_RETURN(Value* cls, Pop());
        if (cls->kind != Value::kGlobal || !Classes().count(std::string(cls->s())) || args->kind != Value::kTuple) {
          return InvalidArgument("NEWOBJ of " + (cls->kind == Value::kGlobal ? "'" + std::string(cls->s()) + "'" : std::string("a ") + KindName(cls->kind)) +
                                 " is not allowed");
        }
        SC_ASSIGN_OR_RETURN(Value* obj, New(Value::kObject));
        Value* const parts[] = {cls, args, nullptr};  // the state comes with BUILD
        SC_RETURN_IF_ERROR(SetItems(obj, parts, 3));
        return Push(obj);
      }
      case 'R': return Reduce();
      case 'b': {  // BUILD: the instance's state, kept as it is
        SC_ASSIGN_OR_RETURN(Value* state, Pop());
        SC_ASSIGN_OR_RETURN(Value* obj, Top("BUILD"));
        if (obj->kind != Value::kObject || obj->items[2] != nullptr) return InvalidArgument("BUILD of a " + std::string(KindName(obj->kind)));
        obj->items[2] = state;
        return Status::Ok();
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02x", op);
        return InvalidArgument(std::string("pickle opcode ") + hex + " is not allowed");
      }
    }
  }

  // None, booleans and small ints are never changed once made: one value each serves every
  // occurrence (a chunk's offsets and sizes are mostly small ints: a third of a .metadata's
  // millions of values).
  Status PushShared(Value::Kind kind, int64_t i) {
    constexpr int64_t kSmall = 1024;
    if (kind == Value::kInt && (i < 0 || i >= kSmall)) return PushNew(kind, i);
    Value*& shared = kind == Value::kNone ? none_ : kind == Value::kBool ? bools_[i != 0] : small_ints_[i];
    if (shared == nullptr) {
      SC_ASSIGN_OR_RETURN(shared, New(kind));
      shared->i = i;
    }
    return Push(shared);
  }

  // Strings the machine builds, charged to the budget; stable addresses, which values view.
  std::string_view Own(std::string text) {
    owned_.push_back(std::move(text));
    return owned_.back();
  }

  const std::string& data_;
  std::deque<std::string> owned_;
  std::vector<std::unique_ptr<Value*[]>> item_blocks_;  // the item arena
  Value** block_ = nullptr;                            // its block being filled
  uint64_t block_used_ = 0;
  Value* none_ = nullptr;
  Value* empty_tuple_ = nullptr;
  Value* bools_[2] = {nullptr, nullptr};
  std::array<Value*, 1024> small_ints_{};
  size_t pos_ = 0;
  bool done_ = false;
};

// ---- the tree to ParsedDcpMetadata

Status Bad(const std::string& what) { return DataLoss("DCP metadata: " + what); }

// An instance's class (a global's full name) and BUILD's state (null before BUILD).
std::string_view ClassOf(const Value* obj) { return (*obj)[0]->s(); }
const Value* StateOf(const Value* obj) { return (*obj)[2]; }

// An instance of the metadata class `cls` (its name in torch.distributed.checkpoint.metadata).
bool IsObject(const Value* v, std::string_view cls) {
  if (!v || v->kind != Value::kObject) return false;
  const std::string_view name = ClassOf(v), prefix = kMeta;
  return name.size() == prefix.size() + cls.size() && name.substr(0, prefix.size()) == prefix && name.substr(prefix.size()) == cls;
}

// An instance's field: BUILD's dict (or the dict of a (dict, slots) pair); null when absent.
const Value* Field(const Value* obj, std::string_view name) {
  const Value* state = StateOf(obj);
  if (state && state->kind == Value::kTuple && state->size() == 2) state = (*state)[0];
  if (!state || state->kind != Value::kDict) return nullptr;
  // The metadata classes have a handful of fields: a state of thousands (one shared by a million
  // objects, each lookup a scan) is no metadata class's, and its fields are not looked up.
  constexpr size_t kMaxFields = 64;
  if (state->size() > 2 * kMaxFields) return nullptr;
  for (size_t k = 0; k + 1 < state->size(); k += 2) {
    if ((*state)[k]->kind == Value::kString && (*state)[k]->s() == name) return (*state)[k + 1];
  }
  return nullptr;
}

Result<std::vector<int64_t>> Ints(const Value* v, const std::string& what) {
  if (!v || v->kind != Value::kTuple) return Bad(what + " is not a torch.Size");
  if (v->size() > static_cast<size_t>(kMaxDims)) {
    return Bad(what + " has " + std::to_string(v->size()) + " dims (at most " + std::to_string(kMaxDims) + ")");
  }
  std::vector<int64_t> out;
  out.reserve(v->size());
  for (const Value* d : *v) {
    if (d->kind != Value::kInt) return Bad(what + " holds a " + KindName(d->kind));
    out.push_back(d->i);
  }
  return out;
}

Result<std::string> Str(const Value* v, const std::string& what) {
  if (!v || v->kind != Value::kString) return Bad(what + " is not a string");
  return std::string(v->s());
}

Result<uint64_t> U64(const Value* v, const std::string& what) {
  if (!v || v->kind != Value::kInt || v->i < 0) return Bad(what + " is not a non-negative integer");
  return static_cast<uint64_t>(v->i);
}

// `charge` is told the bytes each chunk copies, as it copies them.
Status Tensor(const Value* md, ParsedDcpItem* item, const std::function<Status(uint64_t)>& charge) {
  const std::string& n = item->name;
  const Value* props = Field(md, "properties");
  if (!IsObject(props, "TensorProperties")) return Bad("'" + n + "': properties is not a TensorProperties");
  // TensorProperties pickles its state as (dtype, layout, requires_grad, memory_format,
  // pin_memory[, strides]); older torch as a dict with a dtype field.
  const Value* state = StateOf(props);
  const Value* dtype = state && state->kind == Value::kTuple && !state->empty() ? (*state)[0] : Field(props, "dtype");
  if (!dtype || dtype->kind != Value::kGlobal || dtype->s().rfind("torch.", 0) != 0) return Bad("'" + n + "': no dtype");
  const std::string dtype_name(dtype->s().substr(6));
  Result<DType> parsed = ParseDType(dtype_name);
  if (parsed.ok()) {
    item->dtype = *parsed;
  } else {
    item->unsupported = dtype_name;
  }
  SC_ASSIGN_OR_RETURN(item->size, Ints(Field(md, "size"), "'" + n + "' size"));
  const Value* chunks = Field(md, "chunks");
  if (!chunks || chunks->kind != Value::kList) return Bad("'" + n + "': chunks is not a list");
  item->chunks.reserve(chunks->size());
  for (const Value* c : *chunks) {
    if (!IsObject(c, "ChunkStorageMetadata")) return Bad("'" + n + "': a chunk is not a ChunkStorageMetadata");
    ParsedDcpChunk chunk;
    SC_ASSIGN_OR_RETURN(chunk.offsets, Ints(Field(c, "offsets"), "'" + n + "' chunk offsets"));
    SC_ASSIGN_OR_RETURN(chunk.sizes, Ints(Field(c, "sizes"), "'" + n + "' chunk sizes"));
    SC_RETURN_IF_ERROR(charge(sizeof(ParsedDcpChunk) + (chunk.offsets.size() + chunk.sizes.size()) * sizeof(int64_t)));
    item->chunks.push_back(std::move(chunk));
  }
  return Status::Ok();
}

Status Storage(const Value* key, const Value* info, ParsedDcpStorage* s) {
  if (!IsObject(key, "MetadataIndex")) return Bad("a storage_data key is not a MetadataIndex");
  if (!info || info->kind != Value::kObject || ClassOf(info) != "torch.distributed.checkpoint.filesystem._StorageInfo") {
    return Bad("a storage_data value is not a _StorageInfo");
  }
  SC_ASSIGN_OR_RETURN(s->fqn, Str(Field(key, "fqn"), "MetadataIndex.fqn"));
  const Value* offset = Field(key, "offset");
  if (offset && offset->kind != Value::kNone) {
    SC_ASSIGN_OR_RETURN(s->offset, Ints(offset, "'" + s->fqn + "' MetadataIndex.offset"));
  }
  const std::string what = "_StorageInfo of '" + s->fqn + "'";
  SC_ASSIGN_OR_RETURN(s->relative_path, Str(Field(info, "relative_path"), what + ": relative_path"));
  SC_ASSIGN_OR_RETURN(s->offset_in_file, U64(Field(info, "offset"), what + ": offset"));
  SC_ASSIGN_OR_RETURN(s->length, U64(Field(info, "length"), what + ": length"));
  const Value* transforms = Field(info, "transform_descriptors");
  if (transforms && transforms->kind != Value::kNone) {
    if (transforms->kind != Value::kList && transforms->kind != Value::kTuple) return Bad(what + ": transform_descriptors");
    for (const Value* t : *transforms) {
      SC_ASSIGN_OR_RETURN(std::string d, Str(t, what + ": a transform descriptor"));
      s->transforms.push_back(std::move(d));
    }
  }
  return Status::Ok();
}

// planner_data as DCP's default planner writes it: {fqn: (step, ...)}, each step a str or an int.
// Only keys state_dict_metadata lists (`names`), each once, whose steps join to the key: checked
// before anything is copied, so the pickle's memo cannot make a small file ask for gigabytes (one
// long key and its path repeated under many entries).
void Paths(const Value& planner, const std::set<std::string, std::less<>>& names,
           std::vector<std::pair<std::string, StatePath>>* out) {
  std::set<std::string_view> seen;
  for (size_t k = 0; k + 1 < planner.size(); k += 2) {
    const Value* key = planner[k];
    const Value* steps = planner[k + 1];
    if (key->kind != Value::kString || (steps->kind != Value::kTuple && steps->kind != Value::kList) || steps->empty() ||
        steps->size() > kMaxStatePathSteps || names.find(key->s()) == names.end() || !seen.insert(key->s()).second) {
      continue;
    }
    // The steps, compared with the key in place: "a.b.0" is ("a", "b", 0).
    const std::string_view fqn = key->s();
    size_t at = 0;
    bool joins = true;
    for (size_t i = 0; i < steps->size() && joins; ++i) {
      const Value* step = (*steps)[i];
      std::string index;
      std::string_view text;
      if (step->kind == Value::kString) {
        text = step->s();
      } else if (step->kind == Value::kInt && step->i >= 0) {
        index = std::to_string(step->i);
        text = index;
      } else {
        joins = false;
        break;
      }
      if (i > 0) joins = at < fqn.size() && fqn[at++] == '.';
      joins = joins && fqn.substr(at, text.size()) == text;
      at += text.size();
    }
    if (!joins || at != fqn.size() || (steps->size() == 1 && (*steps)[0]->kind == Value::kString)) continue;
    StatePath path;
    path.reserve(steps->size());
    for (const Value* step : *steps) {
      if (step->kind == Value::kString) path.push_back({std::string(step->s()), false});
      else path.push_back({std::to_string(step->i), true});
    }
    out->emplace_back(std::string(fqn), std::move(path));
  }
}

}  // namespace

Result<ParsedDcpMetadata> ParseDcpMetadata(const std::string& pickle, const std::string& origin) {
  // What the parse copies out of the pickle, charged to the unpickler's budget for its size: the
  // memo lets a small file name one long tuple or string under a million chunks or records.
  const uint64_t budget = UnpickleMemoryBudget(pickle.size());
  uint64_t copied = 0;
  auto charge = [&](uint64_t bytes) -> Status {
    copied += bytes;
    if (copied <= budget) return Status::Ok();
    return Bad("the parsed metadata needs more than " + std::to_string(budget) + " bytes of memory, the budget for a " +
               std::to_string(pickle.size()) + "-byte .metadata (objects shared by many records?)");
  };
  auto run = [&]() -> Result<ParsedDcpMetadata> {
    Machine machine(pickle);
    SC_ASSIGN_OR_RETURN(const Value* root, machine.Run());
    if (!IsObject(root, "Metadata")) return Bad("the pickle holds a " + std::string(KindName(root->kind)) + ", not a Metadata");
    ParsedDcpMetadata out;
    const Value* sdm = Field(root, "state_dict_metadata");
    if (!sdm || sdm->kind != Value::kDict) return Bad("state_dict_metadata is not a dict");
    std::set<std::string, std::less<>> names;
    out.items.reserve(sdm->size() / 2);
    for (size_t k = 0; k + 1 < sdm->size(); k += 2) {
      ParsedDcpItem item;
      SC_ASSIGN_OR_RETURN(item.name, Str((*sdm)[k], "a state_dict_metadata key"));
      SC_RETURN_IF_ERROR(charge(sizeof(ParsedDcpItem) + item.name.size()));
      if (!names.insert(item.name).second) return Bad("'" + item.name + "' is listed twice");
      const Value* md = (*sdm)[k + 1];
      if (IsObject(md, "BytesStorageMetadata")) {
        item.is_bytes = true;
      } else if (IsObject(md, "TensorStorageMetadata")) {
        SC_RETURN_IF_ERROR(Tensor(md, &item, charge));
      } else {
        return Bad("'" + item.name + "' is neither a TensorStorageMetadata nor a BytesStorageMetadata");
      }
      out.items.push_back(std::move(item));
    }
    const Value* sd = Field(root, "storage_data");
    if (!sd || sd->kind != Value::kDict) return Bad("storage_data is not a dict (a storage layout other than the file system's)");
    out.storage.reserve(sd->size() / 2);
    for (size_t k = 0; k + 1 < sd->size(); k += 2) {
      ParsedDcpStorage s;
      SC_RETURN_IF_ERROR(Storage((*sd)[k], (*sd)[k + 1], &s));
      uint64_t transforms = 0;
      for (const std::string& t : s.transforms) transforms += t.size();
      SC_RETURN_IF_ERROR(charge(sizeof(ParsedDcpStorage) + s.fqn.size() + s.relative_path.size() + transforms +
                                (s.offset ? s.offset->size() * sizeof(int64_t) : 0)));
      out.storage.push_back(std::move(s));
    }
    const Value* planner = Field(root, "planner_data");
    if (planner && planner->kind == Value::kDict) Paths(*planner, names, &out.paths);
    const Value* version = Field(root, "version");
    if (version && version->kind == Value::kString) out.version = version->s();
    return out;
  };
  Result<ParsedDcpMetadata> out = run();
  if (!out.ok()) return out.status().WithContext(origin);
  return out;
}

}  // namespace shardckpt
