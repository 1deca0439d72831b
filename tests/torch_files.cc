#include "tests/torch_files.h"

#include <unistd.h>

#include "shardckpt/engine/formats/output_file.h"
#include "shardckpt/engine/formats/zip_writer.h"

namespace shardckpt::testing {
namespace {

// Pickle opcodes, spelled out where the cases build them by hand.
std::string Str(const std::string& s) {
  std::string out = "X";
  uint32_t n = static_cast<uint32_t>(s.size());
  out.append(reinterpret_cast<const char*>(&n), 4);
  return out + s;
}
std::string Int(uint8_t v) { return std::string("K") + static_cast<char>(v); }
std::string Global(const std::string& module, const std::string& name) { return "c" + module + "\n" + name + "\n"; }
std::string Get(uint8_t key) { return std::string("h") + static_cast<char>(key); }
std::string Put(uint8_t key) { return std::string("q") + static_cast<char>(key); }

const std::string kProto = "\x80\x02";
const std::string kOrderedDict = Global("collections", "OrderedDict") + ")R";
// ('storage', torch.<type>, "0", "cpu", 2) loaded by BINPERSID.
std::string Storage(const std::string& type) {
  return "(" + Str("storage") + Global("torch", type) + Str("0") + Str("cpu") + Int(2) + "tQ";
}
const std::string kStorage = Storage("FloatStorage");

// What torch 2.x writes for float8 and the unsigned types: _rebuild_tensor_v3 over a
// torch.storage.UntypedStorage (its element count in bytes), the tensor's dtype named by a global.
std::string TensorV3(const std::string& dtype, uint8_t storage_bytes, uint8_t offset, uint8_t size, uint8_t stride,
                     int args = 7) {
  const std::string storage =
      "(" + Str("storage") + Global("torch.storage", "UntypedStorage") + Str("0") + Str("cpu") + Int(storage_bytes) + "tQ";
  const std::string all[] = {storage, Int(offset), "(" + Int(size) + "t", "(" + Int(stride) + "t", "\x89", kOrderedDict,
                             Global("torch", dtype)};
  std::string out = Global("torch._utils", "_rebuild_tensor_v3") + "(";
  for (int k = 0; k < args; ++k) out += all[k];
  return out + "tR";
}
// _rebuild_tensor_v2's arguments up to `count` of (storage, 0, (2,), (1,), False, OrderedDict(), None).
std::string TensorArgs(int count) {
  const std::string args[] = {kStorage, Int(0), "(" + Int(2) + "t", "(" + Int(1) + "t", "\x89", kOrderedDict, "N"};
  std::string out = "(";
  for (int k = 0; k < count; ++k) out += args[k];
  return out + "t";
}
std::string Tensor(int count = 6) { return Global("torch._utils", "_rebuild_tensor_v2") + TensorArgs(count) + "R"; }
// _rebuild_tensor_v2 with torch 2.x's tensor metadata, a dict {key: value} (get_tensor_metadata).
std::string TensorWithMetadata(const std::string& key, const std::string& value) {
  return Global("torch._utils", "_rebuild_tensor_v2") + TensorArgs(6).substr(0, TensorArgs(6).size() - 1) + "}" + Str(key) +
         value + "stR";
}
std::string Parameter(const std::string& args) { return Global("torch._utils", "_rebuild_parameter") + "(" + args + "tR"; }
// {"w": value} as a whole pickle.
std::string DictOf(const std::string& value) { return kProto + "}" + Str("w") + value + "s."; }

PickleTensor Record(const std::string& name, DType dtype, Shape sizes, std::vector<int64_t> strides, int64_t offset,
                    const std::string& key, int64_t numel) {
  return PickleTensor{name, dtype, std::move(sizes), std::move(strides), offset, key, numel};
}

TorchFileCase Case(const std::string& name, const std::vector<PickleTensor>& tensors, std::vector<TorchRecord> records,
                   const std::string& refusal) {
  return TorchFileCase{name, PickleStateDict(tensors).value(), std::move(records), refusal, ""};
}

}  // namespace

uint8_t RecordByte(const std::string& key, uint64_t k) {
  return static_cast<uint8_t>(k * 131 + 7 * (key.empty() ? 0 : key[0]) + (k >> 8));
}

Status WriteTorchFile(const std::string& path, const TorchFileCase& c) {
  SC_ASSIGN_OR_RETURN(std::unique_ptr<OutputFile> file, OutputFile::Create(path));
  ZipWriter zip(file.get());
  SC_RETURN_IF_ERROR(zip.AddRecord("archive/data.pkl", c.pickle));
  for (const TorchRecord& r : c.records) {
    std::string bytes(r.bytes, '\0');
    for (uint64_t k = 0; k < r.bytes; ++k) bytes[k] = static_cast<char>(RecordByte(r.key, k));
    SC_RETURN_IF_ERROR(zip.AddRecord("archive/data/" + r.key, bytes));
  }
  if (!c.byteorder.empty()) SC_RETURN_IF_ERROR(zip.AddRecord("archive/byteorder", c.byteorder));
  SC_RETURN_IF_ERROR(zip.AddRecord("archive/version", "3\n"));
  SC_RETURN_IF_ERROR(zip.Finish());
  SC_RETURN_IF_ERROR(file->Close());
  ::unlink((path + ".sha256").c_str());  // OutputFile's checksum file: not part of the case
  return Status::Ok();
}

std::vector<TorchFileCase> ValidTorchFiles() {
  using D = DType;
  return {
      Case("views",
           {Record("base", D::kFloat32, {3, 4}, {4, 1}, 0, "0", 12), Record("t", D::kFloat32, {4, 3}, {1, 4}, 0, "0", 12),
            Record("rows", D::kFloat32, {2, 4}, {4, 1}, 4, "0", 12), Record("scalar", D::kFloat32, {}, {}, 5, "0", 12),
            Record("empty", D::kFloat32, {0, 4}, {4, 1}, 12, "0", 12),
            Record("bcast", D::kFloat32, {3, 4}, {0, 1}, 8, "0", 12), Record("i8", D::kInt8, {5}, {2}, 1, "1", 10),
            Record("f64", D::kFloat64, {2}, {1}, 0, "2", 2)},
           {{"0", 48}, {"1", 10}, {"2", 16}}, ""),
      // One untyped storage of 6 bytes seen as float8 (bytes 1 and 3) and as bfloat16 (bytes 2-5).
      TorchFileCase{"untyped_views",
                    kProto + "}(" + Str("f8") + TensorV3("float8_e4m3fn", 6, 1, 2, 2) + Str("bf16") +
                        TensorV3("bfloat16", 6, 1, 2, 1) + "u.",
                    {{"0", 6}}, "", ""},
  };
}

std::vector<TorchFileCase> HostileTensorRecords() {
  using D = DType;
  const int64_t k2p60 = int64_t{1} << 60, k2p61 = int64_t{1} << 61;
  return {
      // The review's two reads outside the buffer: a storage whose byte size wraps to its
      // record's 16 bytes, and strides that leap far past a small storage.
      Case("storage_numel_wraps", {Record("w", D::kFloat64, {3}, {k2p60}, 0, "0", k2p61 + 2)}, {{"0", 16}},
           "tensor 'w': storage data/0 element count 2305843009213693954 is negative or overflows"),
      Case("heap_bytes_around_buffer",
           {Record("w", D::kFloat64, {2, 2}, {k2p61 - 1, k2p61 + 1}, 0, "0", (int64_t{1} << 62) + 2)}, {{"0", 16}},
           "tensor 'w': storage data/0 element count 4611686018427387906 is negative or overflows"),
      Case("strides_leave_storage", {Record("w", D::kFloat32, {2, 2}, {k2p61, 1}, 0, "0", 4)}, {{"0", 16}},
           "tensor 'w': the view (storage_offset 0, sizes [2, 2], strides [2305843009213693952, 1]) reaches element"),
      Case("strides_overflow", {Record("w", D::kFloat32, {3}, {int64_t{1} << 62}, 0, "0", 4)}, {{"0", 16}},
           "tensor 'w': strides [4611686018427387904] with sizes [3] overflow 64 bits"),
      Case("negative_size", {Record("w", D::kFloat32, {-1}, {1}, 0, "0", 4)}, {{"0", 16}},
           "tensor 'w': sizes: shape [-1] has a negative dim"),
      Case("negative_stride", {Record("w", D::kFloat32, {2}, {-1}, 1, "0", 4)}, {{"0", 16}},
           "tensor 'w': strides [-1] has a negative stride"),
      Case("negative_offset", {Record("w", D::kFloat32, {2}, {1}, -1, "0", 4)}, {{"0", 16}},
           "tensor 'w': storage_offset -1 is negative"),
      Case("offset_past_end", {Record("w", D::kFloat32, {2}, {1}, 3, "0", 4)}, {{"0", 16}},
           "tensor 'w': the view (storage_offset 3, sizes [2], strides [1]) reaches element 4 of a storage of 4 elements"),
      Case("numel_exceeds_record", {Record("w", D::kFloat32, {8}, {1}, 0, "0", 8)}, {{"0", 16}},
           "tensor 'w': storage data/0 holds 16 bytes, not 8 float32 elements (32 bytes)"),
      Case("negative_numel", {Record("w", D::kFloat32, {0}, {1}, 0, "0", -1)}, {{"0", 16}},
           "tensor 'w': storage data/0 element count -1 is negative"),
      Case("strides_length", {Record("w", D::kFloat32, {2, 2}, {1}, 0, "0", 4)}, {{"0", 16}},
           "tensor 'w': strides [1] and sizes [2, 2] differ in length"),
      Case("broadcast_bomb", {Record("w", D::kFloat32, {int64_t{1} << 40}, {0}, 0, "0", 1)}, {{"0", 4}},
           "tensor 'w': sizes [1099511627776] with strides [0] repeat a storage of 4 bytes"),
      // Each view within the per-tensor bound, together hundreds of times the file (views that
      // differ: one view under five names is written once, and counts once).
      Case("many_views_bomb",
           {Record("w0", D::kFloat32, {int64_t{1} << 26}, {0}, 0, "0", 1), Record("w1", D::kFloat32, {(int64_t{1} << 26) - 1}, {0}, 0, "0", 1),
            Record("w2", D::kFloat32, {(int64_t{1} << 26) - 2}, {0}, 0, "0", 1), Record("w3", D::kFloat32, {(int64_t{1} << 26) - 3}, {0}, 0, "0", 1),
            Record("w4", D::kFloat32, {(int64_t{1} << 26) - 4}, {0}, 0, "0", 1)},
           {{"0", 4}},
           "its tensors, up to 'w4', view their storages as 1342177240 bytes, more than 4x the 4 bytes stored plus 1 GiB"),
      Case("too_many_dims", {Record("w", D::kFloat32, Shape(33, 1), std::vector<int64_t>(33, 1), 0, "0", 1)}, {{"0", 4}},
           "tensor 'w': sizes: shape"),
      TorchFileCase{"untyped_view_past_end", kProto + "}" + Str("w") + TensorV3("float32", 5, 0, 2, 1) + "s.", {{"0", 5}},
                    "tensor 'w': the view (storage_offset 0, sizes [2], strides [1]) reaches element 1 of a storage of 1 elements", ""},
      Case("missing_record", {Record("w", D::kFloat32, {2}, {1}, 0, "9", 2)}, {{"0", 8}},
           "tensor 'w': storage record data/9 is missing"),
      Case("storage_claims_differ",
           {Record("w", D::kFloat32, {4}, {1}, 0, "0", 4), Record("v", D::kInt8, {16}, {1}, 0, "0", 16)}, {{"0", 16}},
           "tensor 'v': storage data/0 is 16 int8 elements here but 4 float32 elements for tensor 'w'"),
  };
}

std::string SharedReferenceBomb(int levels) {
  // The way pickle writes a dict shared by two keys: in full under "a", memo-referenced under "b".
  std::string body = "}" + Put(0) + "(" + Str("x") + Int(1) + "u";
  for (int k = 1; k <= levels; ++k) {
    body = "}" + Put(static_cast<uint8_t>(k)) + "(" + Str("a") + body + Str("b") + Get(static_cast<uint8_t>(k - 1)) + "u";
  }
  return kProto + body + ".";
}

std::string SelfContainingDict() { return kProto + "}" + Put(0) + "(" + Str("a") + Get(0) + Str("b") + Get(0) + "u."; }

std::string ObjectFlood(size_t count) { return kProto + "}" + Str("l") + "](" + std::string(count, 'N') + "es."; }

std::vector<PickleCase> WeightsOnlyCases() {
  return {
      {"tensor", DictOf(Tensor()), ""},
      {"tensor_with_metadata", DictOf(Tensor(7)), ""},
      {"parameter", DictOf(Parameter(Tensor() + "\x89" + kOrderedDict)), ""},
      {"build_on_ordered_dict", kProto + kOrderedDict + "}b.", ""},
      {"stack_global", std::string("\x80\x04\x8c\x0b") + "collections" + "\x8c\x0b" + "OrderedDict" + "\x93)R.", ""},
      {"build_on_plain_dict", kProto + "}}b.", "BUILD on a plain dict"},
      {"build_with_none", kProto + kOrderedDict + "Nb.", "BUILD of an OrderedDict with a None"},
      {"build_below_mark", kProto + kOrderedDict + "(}b.", "BUILD with no object above the last MARK"},
      {"rebuild_tensor_v2_4_args", DictOf(Tensor(4)), "_rebuild_tensor_v2 with 4 arguments"},
      {"rebuild_tensor_v2_int_grad", DictOf(Global("torch._utils", "_rebuild_tensor_v2") + "(" + kStorage + Int(0) +
                                            "(" + Int(2) + "t(" + Int(1) + "t" + Int(0) + kOrderedDict + "tR"),
       "_rebuild_tensor_v2 arguments are not (storage, int, tuple, tuple, bool, dict"},
      {"rebuild_parameter_1_arg", DictOf(Parameter(Tensor())), "_rebuild_parameter with 1 arguments"},
      {"setitem_below_mark", kProto + "}(" + Str("k") + Int(1) + "s.", "SETITEM with no object above the last MARK"},
      {"setitems_below_mark", kProto + "}((" + Str("k") + Int(1) + "u.", "SETITEMS with no object above the last MARK"},
      {"append_below_mark", kProto + "}" + Str("l") + "](" + Int(1) + "a.", "APPEND with no object above the last MARK"},
      {"memo_put_below_mark", kProto + "}(" + Put(0) + ".", "memo put with no object above the last MARK"},
      {"setitem_on_list", kProto + "]" + Str("k") + Int(1) + "s.", "SETITEM on a list"},
      {"global_os_system", kProto + Global("os", "system") + ".", "global 'os.system' is not allowed"},
      {"protocol_6", "\x80\x06}.", "pickle protocol 6 is not supported"},
      // Protocol 4's FRAME states the bytes that follow: one past the end is refused, as torch
      // refuses it (it read as an empty state dict); an honest one reads.
      {"frame_past_the_end", std::string("\x80\x04\x95", 3) + std::string("\x00\x00\x00\x00\x00\x00\x00\x40", 8) + "}.",
       "a FRAME of 4611686018427387904 bytes with 2 bytes left"},
      {"frame_of_the_rest", std::string("\x80\x04\x95", 3) + std::string("\x02\x00\x00\x00\x00\x00\x00\x00", 8) + "}.", ""},
      {"self_containing_dict", SelfContainingDict(), "'a' contains itself"},
      {"duplicate_name", kProto + "}(" + Str("a.b") + Int(1) + Str("a") + "}" + Str("b") + Int(2) + "su.",
       "the name 'a.b' occurs twice"},
      {"complex64_storage",
       DictOf(Global("torch._utils", "_rebuild_tensor_v2") + "(" + Storage("ComplexFloatStorage") + Int(0) + "(" + Int(2) +
              "t(" + Int(1) + "t\x89" + kOrderedDict + "tR"),
       ""},
      {"complex32_storage",
       DictOf(Global("torch._utils", "_rebuild_tensor_v2") + "(" + Storage("ComplexHalfStorage") + Int(0) + "(" + Int(2) +
              "t(" + Int(1) + "t\x89" + kOrderedDict + "tR"),
       "tensor 'w': dtype complex32 is not supported by shardckpt"},
      {"rebuild_tensor_v3_6_args", DictOf(TensorV3("float8_e5m2", 2, 0, 2, 1, 6)), "_rebuild_tensor_v3 with 6 arguments"},
      {"uint16_v3", DictOf(TensorV3("uint16", 4, 0, 2, 1)), ""},
      {"uint64_v3", DictOf(TensorV3("uint64", 16, 0, 2, 1)), ""},
      {"e8m0_v3", DictOf(TensorV3("float8_e8m0fnu", 2, 0, 2, 1)), "tensor 'w': dtype float8_e8m0fnu is not supported by shardckpt"},
      // torch 2.x's neg and conj bits: the storage holds the values before negation or
      // conjugation, which torch.load applies; refused, not read as the wrong values.
      {"negative_view", DictOf(TensorWithMetadata("neg", "\x88")),
       "tensor 'w': it is a negative view ({'neg': True} in the file): its storage holds the values before negation"},
      {"conjugate_view", DictOf(TensorWithMetadata("conj", "\x88")),
       "tensor 'w': it is a conjugate view ({'conj': True} in the file)"},
      {"view_flags_false", DictOf(TensorWithMetadata("neg", "\x89")), ""},
      {"other_tensor_metadata", DictOf(TensorWithMetadata("future_bit", Int(1))),
       "tensor 'w': the file sets tensor metadata other than the neg and conj flags"},
      // What shardckpt wrote before it named the class as torch does: still read.
      {"bare_untyped_storage",
       DictOf(Global("torch._utils", "_rebuild_tensor_v3") + "((" + Str("storage") + Global("torch", "UntypedStorage") +
              Str("0") + Str("cpu") + Int(2) + "tQ" + Int(0) + "(" + Int(2) + "t(" + Int(1) + "t\x89" + kOrderedDict +
              Global("torch", "float8_e5m2") + "tR"),
       ""},
      // Protocol 1 has no PROTO opcode: named as the protocol, not as its first opcode.
      {"protocol_1", "}(" + Str("w") + Tensor() + "u.", "a pickle of protocol 0 or 1 (no PROTO opcode) is not supported"},
      // 2^64 - 5, as pickle writes a uint64 seed (9 bytes, LONG1): torch.load takes it as a leaf.
      {"uint64_leaf", kProto + "}(" + Str("seed") + std::string("\x8a\x09\xfb\xff\xff\xff\xff\xff\xff\xff\x00", 11) +
                          Str("w") + Tensor() + "u.", ""},
      {"uint64_size", DictOf(Global("torch._utils", "_rebuild_tensor_v2") + "(" + kStorage + Int(0) + "(" +
                             std::string("\x8a\x09\x02\x00\x00\x00\x00\x00\x00\x00\x01", 11) + "t(" + Int(1) +
                             "t\x89" + kOrderedDict + "tR"),
       "tensor size is not an integer"},
      {"nested_65_deep", kProto + [] {
         std::string open, close;
         for (int k = 0; k < 66; ++k) open += "}" + Str("d"), close += "s";
         return open + Int(1) + close + ".";
       }(),
       "'d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d.d."
       "d.d.d.d.d.d.d.d' is nested in more than 64 containers, more than shardckpt imports"},
      {"stack_global_long_name", std::string("\x80\x04") + Str("collections") + Str(std::string(1 << 20, 'x')) + "\x93.",
       "STACK_GLOBAL of a name over 256 bytes"},
      {"empty_key", kProto + "}" + Str("") + Int(1) + "s.", "a key in the state dict is empty"},
  };
}

}  // namespace shardckpt::testing
