#include "shardckpt/engine/torch_pickle.h"

#include <cstring>
#include <map>
#include <memory>
#include <set>

namespace shardckpt {

// ---------------------------------------------------------------- writer

namespace {

void PutU32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }

void PutString(std::string& s, const std::string& text) {
  s += 'X';  // BINUNICODE
  PutU32(s, static_cast<uint32_t>(text.size()));
  s += text;
}

void PutInt(std::string& s, int64_t v) {
  if (v >= 0 && v < 256) {
    s += 'K';
    s += static_cast<char>(v);
  } else if (v >= 0 && v < 65536) {
    s += 'M';
    s += static_cast<char>(v & 0xFF);
    s += static_cast<char>(v >> 8);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    s += 'J';
    int32_t x = static_cast<int32_t>(v);
    s.append(reinterpret_cast<const char*>(&x), 4);
  } else {
    s += '\x8a';  // LONG1 with exactly 8 bytes (torch 1.13 needs 8)
    s += '\x08';
    s.append(reinterpret_cast<const char*>(&v), 8);
  }
}

void PutTuple(std::string& s, const std::vector<int64_t>& values) {
  if (values.empty()) {
    s += ')';
    return;
  }
  s += '(';
  for (int64_t v : values) PutInt(s, v);
  s += 't';
}

void PutGlobal(std::string& s, const char* module, const char* name) {
  s += 'c';
  s += module;
  s += '\n';
  s += name;
  s += '\n';
}

}  // namespace

Result<std::string> PickleStateDict(const std::vector<PickleTensor>& tensors) {
  std::string s = "\x80\x02";
  PutGlobal(s, "collections", "OrderedDict");
  s += ")R";
  if (!tensors.empty()) {
    s += '(';
    for (const PickleTensor& t : tensors) {
      PutString(s, t.name);
      PutGlobal(s, "torch._utils", "_rebuild_tensor_v2");
      s += '(';
      s += '(';
      PutString(s, "storage");
      PutGlobal(s, "torch", TorchStorageName(t.dtype));
      PutString(s, t.storage_key);
      PutString(s, "cpu");
      PutInt(s, t.storage_numel);
      s += "tQ";  // TUPLE, BINPERSID
      PutInt(s, t.storage_offset);
      PutTuple(s, t.sizes);
      PutTuple(s, t.strides);
      s += '\x89';  // NEWFALSE: requires_grad
      PutGlobal(s, "collections", "OrderedDict");
      s += ")R";  // backward hooks
      s += "tR";
    }
    s += 'u';  // SETITEMS
  }
  s += '.';
  return s;
}

// ---------------------------------------------------------------- restricted reader

namespace {

struct Value;
using ValuePtr = std::shared_ptr<Value>;

struct Value {
  enum Kind { kNone, kBool, kInt, kFloat, kString, kTuple, kList, kDict, kGlobal, kStorage, kTensor } kind = kNone;
  int64_t i = 0;
  std::string s;  // string, global name "module.name", storage key
  std::vector<ValuePtr> items;
  std::vector<std::pair<ValuePtr, ValuePtr>> dict;
  DType dtype = DType::kFloat32;  // storage, tensor
  PickleTensor tensor;
};

ValuePtr Make(Value::Kind kind) {
  auto v = std::make_shared<Value>();
  v->kind = kind;
  return v;
}

const std::set<std::string>& AllowedGlobals() {
  static const std::set<std::string> kAllowed = [] {
    std::set<std::string> s = {"collections.OrderedDict", "torch._utils._rebuild_tensor_v2",
                               "torch._utils._rebuild_parameter"};
    for (int d = 0; d < kNumDTypes; ++d) s.insert(std::string("torch.") + TorchStorageName(static_cast<DType>(d)));
    return s;
  }();
  return kAllowed;
}

class Unpickler {
 public:
  explicit Unpickler(const std::string& data) : data_(data) {}

  Result<ValuePtr> Run() {
    while (pos_ < data_.size()) {
      const size_t at = pos_;
      unsigned char op = static_cast<unsigned char>(data_[pos_++]);
      Status status = Step(op);
      if (!status.ok()) return status.WithContext("pickle at offset " + std::to_string(at));
      if (done_) {
        if (stack_.size() != 1) return DataLoss("pickle ended with " + std::to_string(stack_.size()) + " values on the stack");
        return stack_.back();
      }
    }
    return DataLoss("pickle is truncated (no STOP)");
  }

 private:
  bool Need(size_t n) { return n <= data_.size() - pos_; }
  uint64_t ReadLe(size_t n) {
    uint64_t v = 0;
    for (size_t k = 0; k < n; ++k) v |= static_cast<uint64_t>(static_cast<unsigned char>(data_[pos_ + k])) << (8 * k);
    pos_ += n;
    return v;
  }
  Result<ValuePtr> Pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() <= marks_.back())) return DataLoss("stack underflow");
    ValuePtr v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Result<std::vector<ValuePtr>> PopToMark() {
    if (marks_.empty()) return DataLoss("no MARK on the stack");
    size_t mark = marks_.back();
    marks_.pop_back();
    std::vector<ValuePtr> items(stack_.begin() + static_cast<long>(mark), stack_.end());
    stack_.resize(mark);
    return items;
  }
  Status PushTuple(std::vector<ValuePtr> items) {
    ValuePtr t = Make(Value::kTuple);
    t->items = std::move(items);
    stack_.push_back(t);
    return Status::Ok();
  }
  Status SetItems(const std::vector<ValuePtr>& kv) {
    if (kv.size() % 2) return DataLoss("SETITEMS with an odd number of values");
    if (stack_.empty() || stack_.back()->kind != Value::kDict) return DataLoss("SETITEMS on a non-dict");
    for (size_t k = 0; k < kv.size(); k += 2) stack_.back()->dict.emplace_back(kv[k], kv[k + 1]);
    return Status::Ok();
  }
  Result<std::string> Line() {
    size_t end = data_.find('\n', pos_);
    if (end == std::string::npos || end - pos_ > 256) return DataLoss("unterminated GLOBAL");
    std::string s = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  Status Reduce() {
    SC_ASSIGN_OR_RETURN(ValuePtr args, Pop());
    SC_ASSIGN_OR_RETURN(ValuePtr callable, Pop());
    if (callable->kind != Value::kGlobal || args->kind != Value::kTuple) return DataLoss("REDUCE of a non-callable");
    const std::string& name = callable->s;
    if (name == "collections.OrderedDict") {
      if (!args->items.empty()) return DataLoss("OrderedDict with arguments");
      stack_.push_back(Make(Value::kDict));
      return Status::Ok();
    }
    if (name == "torch._utils._rebuild_parameter") {
      if (args->items.empty() || args->items[0]->kind != Value::kTensor) return DataLoss("bad _rebuild_parameter");
      stack_.push_back(args->items[0]);
      return Status::Ok();
    }
    if (name == "torch._utils._rebuild_tensor_v2") {
      const auto& a = args->items;
      if (a.size() < 4 || a[0]->kind != Value::kStorage || a[1]->kind != Value::kInt || a[2]->kind != Value::kTuple ||
          a[3]->kind != Value::kTuple) {
        return DataLoss("bad _rebuild_tensor_v2 arguments");
      }
      ValuePtr t = Make(Value::kTensor);
      t->tensor.dtype = a[0]->dtype;
      t->tensor.storage_key = a[0]->s;
      t->tensor.storage_numel = a[0]->i;
      t->tensor.storage_offset = a[1]->i;
      for (const ValuePtr& d : a[2]->items) {
        if (d->kind != Value::kInt) return DataLoss("tensor size is not an integer");
        t->tensor.sizes.push_back(d->i);
      }
      for (const ValuePtr& d : a[3]->items) {
        if (d->kind != Value::kInt) return DataLoss("tensor stride is not an integer");
        t->tensor.strides.push_back(d->i);
      }
      stack_.push_back(t);
      return Status::Ok();
    }
    return Internal("unreachable: global " + name);
  }

  Status Step(unsigned char op) {
    switch (op) {
      case 0x80: if (!Need(1)) return DataLoss("truncated"); pos_ += 1; return Status::Ok();  // PROTO
      case 0x95: if (!Need(8)) return DataLoss("truncated"); pos_ += 8; return Status::Ok();  // FRAME
      case '.': done_ = true; return Status::Ok();
      case '(': marks_.push_back(stack_.size()); return Status::Ok();
      case 'N': stack_.push_back(Make(Value::kNone)); return Status::Ok();
      case 0x88: case 0x89: {
        ValuePtr v = Make(Value::kBool);
        v->i = op == 0x88;
        stack_.push_back(v);
        return Status::Ok();
      }
      case ')': return PushTuple({});
      case ']': stack_.push_back(Make(Value::kList)); return Status::Ok();
      case '}': stack_.push_back(Make(Value::kDict)); return Status::Ok();
      case 't': { SC_ASSIGN_OR_RETURN(auto items, PopToMark()); return PushTuple(std::move(items)); }
      case 0x85: case 0x86: case 0x87: {
        size_t n = op - 0x84u;
        std::vector<ValuePtr> items(n);
        for (size_t k = n; k-- > 0;) { SC_ASSIGN_OR_RETURN(items[k], Pop()); }
        return PushTuple(std::move(items));
      }
      case 'K': case 'M': case 'J': {
        size_t n = op == 'K' ? 1 : op == 'M' ? 2 : 4;
        if (!Need(n)) return DataLoss("truncated integer");
        ValuePtr v = Make(Value::kInt);
        uint64_t raw = ReadLe(n);
        v->i = op == 'J' ? static_cast<int32_t>(raw) : static_cast<int64_t>(raw);
        stack_.push_back(v);
        return Status::Ok();
      }
      case 0x8a: {  // LONG1
        if (!Need(1)) return DataLoss("truncated LONG1");
        size_t n = static_cast<unsigned char>(data_[pos_++]);
        if (n > 8 || !Need(n)) return DataLoss("LONG1 wider than 64 bits");
        uint64_t raw = ReadLe(n);
        if (n > 0 && n < 8 && (raw >> (8 * n - 1)) & 1) raw |= ~uint64_t{0} << (8 * n);  // sign-extend
        ValuePtr v = Make(Value::kInt);
        v->i = static_cast<int64_t>(raw);
        stack_.push_back(v);
        return Status::Ok();
      }
      case 'G': {
        if (!Need(8)) return DataLoss("truncated float");
        pos_ += 8;
        stack_.push_back(Make(Value::kFloat));
        return Status::Ok();
      }
      case 'X': case 0x8c: {
        size_t width = op == 'X' ? 4 : 1;
        if (!Need(width)) return DataLoss("truncated string");
        uint64_t n = ReadLe(width);
        if (!Need(n)) return DataLoss("string runs past the end");
        ValuePtr v = Make(Value::kString);
        v->s = data_.substr(pos_, n);
        pos_ += n;
        stack_.push_back(v);
        return Status::Ok();
      }
      case 'q': case 'r': case 0x94: {  // BINPUT, LONG_BINPUT, MEMOIZE
        size_t width = op == 'q' ? 1 : op == 'r' ? 4 : 0;
        if (!Need(width) || stack_.empty()) return DataLoss("bad memo put");
        uint64_t key = width ? ReadLe(width) : memo_.size();
        memo_[key] = stack_.back();
        return Status::Ok();
      }
      case 'h': case 'j': {
        size_t width = op == 'h' ? 1 : 4;
        if (!Need(width)) return DataLoss("truncated memo get");
        auto it = memo_.find(ReadLe(width));
        if (it == memo_.end()) return DataLoss("memo get of an unknown key");
        stack_.push_back(it->second);
        return Status::Ok();
      }
      case 'c': {
        SC_ASSIGN_OR_RETURN(std::string module, Line());
        SC_ASSIGN_OR_RETURN(std::string name, Line());
        std::string full = module + "." + name;
        if (!AllowedGlobals().count(full)) {
          return Status(Code::kInvalidArgument, "global '" + full +
                                                    "' is not allowed (only what torch.load(weights_only=True) accepts; "
                                                    "nothing in the file is executed)");
        }
        ValuePtr v = Make(Value::kGlobal);
        v->s = full;
        stack_.push_back(v);
        return Status::Ok();
      }
      case 'Q': {  // BINPERSID: ('storage', StorageType, key, location, numel)
        SC_ASSIGN_OR_RETURN(ValuePtr pid, Pop());
        if (pid->kind != Value::kTuple || pid->items.size() != 5 || pid->items[0]->s != "storage" ||
            pid->items[1]->kind != Value::kGlobal || pid->items[2]->kind != Value::kString ||
            pid->items[4]->kind != Value::kInt) {
          return DataLoss("unsupported persistent id");
        }
        std::string type = pid->items[1]->s.substr(std::strlen("torch."));
        SC_ASSIGN_OR_RETURN(DType dtype, ParseTorchStorageName(type));
        ValuePtr v = Make(Value::kStorage);
        v->dtype = dtype;
        v->s = pid->items[2]->s;
        v->i = pid->items[4]->i;
        stack_.push_back(v);
        return Status::Ok();
      }
      case 'R': return Reduce();
      case 's': {
        SC_ASSIGN_OR_RETURN(ValuePtr value, Pop());
        SC_ASSIGN_OR_RETURN(ValuePtr key, Pop());
        return SetItems({key, value});
      }
      case 'u': { SC_ASSIGN_OR_RETURN(auto kv, PopToMark()); return SetItems(kv); }
      case 'a': case 'e': {
        std::vector<ValuePtr> items;
        if (op == 'a') {
          SC_ASSIGN_OR_RETURN(ValuePtr v, Pop());
          items.push_back(v);
        } else {
          SC_ASSIGN_OR_RETURN(items, PopToMark());
        }
        if (stack_.empty() || stack_.back()->kind != Value::kList) return DataLoss("APPEND on a non-list");
        for (auto& v : items) stack_.back()->items.push_back(v);
        return Status::Ok();
      }
      case 'b': {  // BUILD: state for an OrderedDict (e.g. state_dict's _metadata) carries no tensors
        SC_ASSIGN_OR_RETURN(ValuePtr state, Pop());
        if (stack_.empty() || stack_.back()->kind != Value::kDict) return DataLoss("BUILD on a non-dict");
        return Status::Ok();
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02x", op);
        return Status(Code::kInvalidArgument, std::string("pickle opcode ") + hex + " is not allowed");
      }
    }
  }

  const std::string& data_;
  size_t pos_ = 0;
  bool done_ = false;
  std::vector<ValuePtr> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, ValuePtr> memo_;
};

Status Flatten(const ValuePtr& dict, const std::string& prefix, int depth, UnpickledStateDict* out) {
  if (depth > 64) return DataLoss("dicts nested more than 64 deep");
  for (const auto& [key, value] : dict->dict) {
    std::string name = key->kind == Value::kString ? key->s
                       : key->kind == Value::kInt  ? std::to_string(key->i)
                                                   : std::string();
    if (name.empty()) return DataLoss("a state dict key is neither a string nor an integer");
    name = prefix + name;
    if (value->kind == Value::kTensor) {
      PickleTensor t = value->tensor;
      t.name = name;
      out->tensors.push_back(std::move(t));
    } else if (value->kind == Value::kDict) {
      SC_RETURN_IF_ERROR(Flatten(value, name + ".", depth + 1, out));
    } else {
      out->skipped.push_back(name);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<UnpickledStateDict> UnpickleStateDict(const std::string& pickle) {
  Unpickler unpickler(pickle);
  SC_ASSIGN_OR_RETURN(ValuePtr root, unpickler.Run());
  if (root->kind != Value::kDict) return Status(Code::kInvalidArgument, "the pickle does not hold a dict (not a state dict)");
  UnpickledStateDict out;
  SC_RETURN_IF_ERROR(Flatten(root, "", 0, &out));
  return out;
}

}  // namespace shardckpt
