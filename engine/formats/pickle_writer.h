// An append-only pickle encoder (protocol 2 or 3) for the few shapes of object torch's readers
// unpickle from files shardckpt writes: DCP's .metadata dataclasses, the tensor inside a DCP
// chunk's torch.save zip, and plain Python values (DCP byte items). It emits opcodes only; what
// they build is the caller's business. Only globals are memoized (written once, then fetched by
// memo index, as Python's pickler does): a DCP .metadata names its record classes once per chunk,
// and spelling each out every time made our files two to three times the size of torch's.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "shardckpt/io/status.h"

namespace shardckpt {

class PickleWriter {
 public:
  explicit PickleWriter(int protocol = 2);
  // Room for `bytes` of opcodes: a state dict's pickle is megabytes, grown otherwise by copies.
  void Reserve(size_t bytes) { s_.reserve(bytes); }
  void None() { s_ += 'N'; }
  void Bool(bool v) { s_ += v ? '\x88' : '\x89'; }
  void Int(int64_t v);
  void UInt(uint64_t v);
  void Float(double v);
  // An integer of any width: its little-endian two's complement bytes (LONG1, or LONG4 past 255).
  void LongBytes(const std::string& little_endian);
  void String(const std::string& utf8);
  // A `bytes` object, as protocol 2 pickles it (_codecs.encode), which every protocol reads;
  // refused past what its string's 32-bit length holds (bytes past 0x7f take two bytes each).
  Status Bytes(const std::string& bytes);
  void Global(const std::string& module, const std::string& name);
  void Mark() { s_ += '('; }
  void Tuple() { s_ += 't'; }  // the items since the last Mark
  void EmptyTuple() { s_ += ')'; }
  void IntTuple(const std::vector<int64_t>& values);
  void EmptyList() { s_ += ']'; }
  void Appends() { s_ += 'e'; }  // the items since the last Mark, onto the list below it
  void EmptyDict() { s_ += '}'; }
  void SetItems() { s_ += 'u'; }  // key, value pairs since the last Mark, into the dict below it
  void Reduce() { s_ += 'R'; }    // callable(*args)
  void NewObj() { s_ += '\x81'; }  // cls.__new__(cls, *args)
  void Build() { s_ += 'b'; }     // obj.__setstate__(state), or its __dict__ updated
  void PersistentId() { s_ += 'Q'; }
  // An object of `module.name` made without calling its constructor, then given `state` by the
  // caller (which pushes the state and calls Build): what pickle writes for a dataclass.
  void NewObject(const std::string& module, const std::string& name);
  // STOP; the writer is done.
  std::string Finish();

 private:
  std::string s_;
  std::unordered_map<std::string, uint32_t> memo_;  // "module\nname" -> memo index
};

// The Python package's typed JSON of a value (python/shardckpt/_state.py: None, bool, int, float
// with non-finite ones tagged, str, list, and tagged tuples, dicts with other keys, integers past
// 64 bits, and base64 bytes) as opcodes building that value; bytes as Bytes() writes them.
Status WriteTypedJson(PickleWriter& w, const nlohmann::ordered_json& value);

}  // namespace shardckpt
