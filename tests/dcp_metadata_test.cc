// The DCP .metadata reader's refusals (engine/formats/dcp_metadata.h) and the in-memory-only
// "checksums": false mark of a DCP folder's files (engine/model/manifest.h). Folders torch 2.x
// wrote are read in tests/python/test_dcp_read.py.
#include <gtest/gtest.h>

#include <map>

#include "shardckpt/engine/formats/dcp_metadata.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/formats/dcp_writer.h"
#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/model/manifest_wire.h"
#include "shardckpt/io/fs.h"
#include "test_util.h"

namespace shardckpt {
namespace {

std::string Message(const Status& s) { return s.message(); }

// A pickle literal with its NUL bytes (std::string(const char*) would stop at the first).
template <size_t N>
std::string P(const char (&bytes)[N]) {
  return std::string(bytes, N - 1);
}

TEST(ParsedDcpMetadata, AGlobalOutsideTheListIsRefusedByNameAndNotRun) {
  // protocol 2: GLOBAL posix.system, ("touch x",), REDUCE, STOP: what pickle writes for os.system.
  const std::string p = P("\x80\x02" "cposix\nsystem\nX\x07\x00\x00\x00touch x\x85R.");
  Result<ParsedDcpMetadata> r = ParseDcpMetadata(p, "m/.metadata");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(Message(r.status()).find("global 'posix.system' is not allowed"), std::string::npos) << Message(r.status());
  EXPECT_NE(Message(r.status()).find("m/.metadata"), std::string::npos);
  // STACK_GLOBAL (protocol 4) the same.
  const std::string p4 = P("\x80\x04\x8c\x05posix\x8c\x06system\x93" "X\x07\x00\x00\x00touch x\x85R.");
  EXPECT_NE(Message(ParseDcpMetadata(p4, "m").status()).find("'posix.system'"), std::string::npos);
}

TEST(ParsedDcpMetadata, AFrameLongerThanThePickleIsRefused) {
  const std::string p = P("\x80\x04\x95\x00\x01\x00\x00\x00\x00\x00\x00}.");
  EXPECT_NE(Message(ParseDcpMetadata(p, "m").status()).find("a FRAME of 256 bytes with 2 bytes left"), std::string::npos)
      << Message(ParseDcpMetadata(p, "m").status());
}

TEST(ParsedDcpMetadata, AllowedCallablesOnlyWithTheirOwnArguments) {
  // getattr is allowed only to name a member of _MEM_FORMAT_ENCODING.
  const std::string p = P("\x80\x02" "cbuiltins\ngetattr\ncbuiltins\ngetattr\nX\x01\x00\x00\x00x\x86R.");
  EXPECT_NE(Message(ParseDcpMetadata(p, "m").status()).find("getattr is allowed only"), std::string::npos);
  // NEWOBJ of a callable that is not one of the metadata classes.
  const std::string n = std::string("\x80\x02") + "ctorch\nSize\n)\x81.";
  EXPECT_NE(Message(ParseDcpMetadata(n, "m").status()).find("NEWOBJ of 'torch.Size' is not allowed"), std::string::npos);
}

TEST(ParsedDcpMetadata, MemoryFormatMembersByValueOnlyInRange) {
  // _MEM_FORMAT_ENCODING(N): how Python pickles an Enum member except early 3.11 releases (getattr by
  // name). In range it is read (the pickle then fails only for not being a Metadata).
  const std::string head = "\x80\x02" "ctorch.distributed.checkpoint.metadata\n_MEM_FORMAT_ENCODING\n";
  for (char member : {'\x00', '\x01', '\x02'}) {
    const std::string p = head + "K" + std::string(1, member) + "\x85R.";
    EXPECT_NE(Message(ParseDcpMetadata(p, "m").status()).find("not a Metadata"), std::string::npos)
        << Message(ParseDcpMetadata(p, "m").status());
  }
  const std::string bad = head + "K\x05\x85R.";
  EXPECT_NE(Message(ParseDcpMetadata(bad, "m").status()).find("_MEM_FORMAT_ENCODING(5) is not a member"), std::string::npos)
      << Message(ParseDcpMetadata(bad, "m").status());
}

TEST(ParsedDcpMetadata, PathsFromEveryPythonsPathlibModule) {
  // storage_meta's checkpoint_id: pathlib.PosixPath, pathlib._local.PosixPath from Python 3.13.
  for (const std::string module : {"pathlib", "pathlib._local"}) {
    const std::string p = "\x80\x02" "c" + module + P("\nPosixPath\nX\x01\x00\x00\x00" "a\x85R.");
    EXPECT_NE(Message(ParseDcpMetadata(p, "m").status()).find("not a Metadata"), std::string::npos)
        << module << ": " << Message(ParseDcpMetadata(p, "m").status());
  }
  const std::string other = P("\x80\x02" "cpathlib._other\nPosixPath\nX\x01\x00\x00\x00" "a\x85R.");
  EXPECT_NE(Message(ParseDcpMetadata(other, "m").status()).find("'pathlib._other.PosixPath' is not allowed"),
            std::string::npos);
}

TEST(ParsedDcpMetadata, ProtocolsAndOpcodesOutsideTheSetAreRefused) {
  EXPECT_NE(Message(ParseDcpMetadata("\x80\x01N.", "m").status()).find("pickle protocol 1 is not supported"),
            std::string::npos);
  EXPECT_NE(Message(ParseDcpMetadata(std::string("\x80\x02") + "(iposix\nsystem\n.", "m").status()).find("opcode 0x69"),
            std::string::npos);
  EXPECT_NE(Message(ParseDcpMetadata("\x80\x02N", "m").status()).find("truncated"), std::string::npos);
  // A string claiming 2^60 bytes: refused before anything is allocated by it.
  EXPECT_NE(Message(ParseDcpMetadata(P("\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x10xy."), "m").status())
                .find("runs past the end"),
            std::string::npos);
  EXPECT_NE(Message(ParseDcpMetadata("\x80\x02N.", "m").status()).find("not a Metadata"), std::string::npos);
}

// Containers large enough to get item arrays of their own before any small one: the small one
// after them gets a block of its own too (it was written through a null block: a crash).
TEST(ParsedDcpMetadata, ALargeContainerFirstThenASmallOneIsRead) {
  const std::string many(20000, 'N');
  for (const std::string& pickle : {std::string("\x80\x02(") + many + "tN\x85.", std::string("\x80\x02](") + many + "eN\x85."}) {
    Result<ParsedDcpMetadata> r = ParseDcpMetadata(pickle, "m");
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("pickle ended with 2 values"), std::string::npos) << r.status().ToString();
  }
}

TEST(ParsedDcpMetadata, ByteItemsHoldPlainValuesOnly) {
  // What a byte item's data.pkl may hold is what UnpickleValueBlob restores: plain values, bytes
  // in protocol 2's form (torch.save's) and protocol 3's; no other global.
  Result<std::string> three = UnpickleValueBlob("\x80\x02K\x03.");
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  EXPECT_EQ(three->substr(2), "3");
  EXPECT_TRUE(UnpickleValueBlob(P("\x80\x02](X\x01\x00\x00\x00" "aX\x01\x00\x00\x00" "be.")).ok());
  Result<std::string> codecs = UnpickleValueBlob(P("\x80\x02" "c_codecs\nencode\n(X\x02\x00\x00\x00" "abX\x06\x00\x00\x00" "latin1tR."));
  ASSERT_TRUE(codecs.ok()) << codecs.status().ToString();
  EXPECT_NE(codecs->find("\"bytes\""), std::string::npos);
  EXPECT_TRUE(UnpickleValueBlob(P("\x80\x03" "B\x02\x00\x00\x00" "ab.")).ok());
  EXPECT_FALSE(UnpickleValueBlob(std::string("\x80\x02") + "ctorch\nSize\n.").ok());
  // Calls that would come out as plain values with their types lost: refused, naming them.
  Result<std::string> ordered = UnpickleValueBlob(std::string("\x80\x02") + "ccollections\nOrderedDict\n)R.");
  ASSERT_FALSE(ordered.ok());
  EXPECT_NE(ordered.status().message().find("a collections.OrderedDict is not a plain value"), std::string::npos)
      << ordered.status().ToString();
  Result<std::string> size = UnpickleValueBlob(std::string("\x80\x02") + "ctorch\nSize\n((K\x02K\x03ttR.");
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.status().message().find("a torch.Size is not a plain value"), std::string::npos) << size.status().ToString();
  EXPECT_FALSE(UnpickleValueBlob(P("\x80\x02" "cposix\nsystem\n(X\x02\x00\x00\x00" "lstR.")).ok());
  // A value pickled whole with a tensor inside (DCP keeps a tuple holding tensors as one byte
  // item): named as the tensor it holds, not as the OrderedDict of hooks among its arguments.
  Result<std::string> tensor = UnpickleValueBlob(std::string("\x80\x02") + "ctorch._utils\n_rebuild_tensor_v2\n(" +
                                                 "ccollections\nOrderedDict\n)RtR.");
  ASSERT_FALSE(tensor.ok());
  EXPECT_NE(tensor.status().message().find("a tensor is not a plain value (a value pickled whole with its tensors"),
            std::string::npos) << tensor.status().ToString();
}

// What the export writes, read back field by field: lists and dicts grown well past their first
// room (37 chunks, 40 tensors), offsets at and past the shared small ints (1024), a scalar with
// no offsets, an empty tensor, a byte item among the tensors.
TEST(ParsedDcpMetadata, ReadsBackWhatTheExportWrote) {
  DcpMetadata md;
  md.checkpoint_id = "/ckpt/step-7";
  for (int t = 0; t < 40; ++t) {
    DcpTensor tensor{"layers." + std::to_string(t) + ".weight", t % 2 ? DType::kBFloat16 : DType::kFloat32, {37, 3, 1030}, {}};
    for (int c = 0; c < (t == 0 ? 37 : 2); ++c) {
      const int64_t rows = t == 0 ? 1 : (c == 0 ? 20 : 17);
      const int64_t first = t == 0 ? c : (c == 0 ? 0 : 20);
      tensor.chunks.push_back(DcpChunk{{first, 0, 0}, {rows, 3, 1030},
                                       DcpStorage{"__" + std::to_string(c % 3) + "_0.distcp", uint64_t(1000 + c) * 4096, 900 + uint64_t(c)}});
    }
    md.tensors.push_back(tensor);
  }
  md.tensors.push_back(DcpTensor{"step", DType::kInt64, {}, {DcpChunk{{}, {}, DcpStorage{"__0_0.distcp", 7, 800}}}});
  md.tensors.push_back(DcpTensor{"empty", DType::kFloat32, {0, 5}, {}});
  md.bytes.push_back(DcpBytes{"epoch", DcpStorage{"__1_0.distcp", 1700, 700}});

  Result<ParsedDcpMetadata> parsed = ParseDcpMetadata(EncodeDcpMetadata(md), "m");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->version, kDcpVersion);
  ASSERT_EQ(parsed->items.size(), md.tensors.size() + md.bytes.size());
  std::map<std::string, const ParsedDcpItem*> items;
  for (const ParsedDcpItem& item : parsed->items) items[item.name] = &item;
  std::map<std::pair<std::string, std::vector<int64_t>>, const ParsedDcpStorage*> storage;
  for (const ParsedDcpStorage& s : parsed->storage) storage[{s.fqn, s.offset.value_or(std::vector<int64_t>{-1})}] = &s;
  size_t chunks = 0;
  for (const DcpTensor& t : md.tensors) {
    ASSERT_TRUE(items.count(t.fqn)) << t.fqn;
    const ParsedDcpItem& item = *items[t.fqn];
    EXPECT_FALSE(item.is_bytes);
    EXPECT_EQ(item.dtype, t.dtype) << t.fqn;
    EXPECT_TRUE(item.unsupported.empty());
    EXPECT_EQ(item.size, t.shape) << t.fqn;
    ASSERT_EQ(item.chunks.size(), t.chunks.size()) << t.fqn;
    for (size_t c = 0; c < t.chunks.size(); ++c) {
      EXPECT_EQ(item.chunks[c].offsets, t.chunks[c].offsets) << t.fqn << " chunk " << c;
      EXPECT_EQ(item.chunks[c].sizes, t.chunks[c].sizes) << t.fqn << " chunk " << c;
      auto s = storage.find({t.fqn, t.chunks[c].offsets});
      ASSERT_NE(s, storage.end()) << t.fqn << " chunk " << c;
      EXPECT_EQ(s->second->relative_path, t.chunks[c].storage.file);
      EXPECT_EQ(s->second->offset_in_file, t.chunks[c].storage.offset);
      EXPECT_EQ(s->second->length, t.chunks[c].storage.length);
      EXPECT_TRUE(s->second->transforms.empty());
      ++chunks;
    }
  }
  ASSERT_TRUE(items.count("epoch"));
  EXPECT_TRUE(items["epoch"]->is_bytes);
  auto epoch = storage.find({"epoch", {-1}});
  ASSERT_NE(epoch, storage.end());
  EXPECT_EQ(epoch->second->relative_path, "__1_0.distcp");
  EXPECT_EQ(epoch->second->offset_in_file, 1700u);
  EXPECT_EQ(parsed->storage.size(), chunks + 1);
}

Manifest DcpLikeManifest() {
  Manifest m;
  FileRecord f;
  f.name = "__0_0.distcp";
  f.size = f.table_offset = 1000;
  f.checksums = false;
  m.files.push_back(f);
  EntryRecord e;
  e.name = "w";
  e.shape = {2, 3};
  e.chunks.push_back(ChunkRecord{0, 123, 24, Layout::Box({0, 0}, {2, 3})});  // unaligned: fine without checksums
  m.entries.push_back(e);
  return m;
}

// A hostile .metadata: a chunk of more dims than any tensor has is refused as it is read (the
// memo let one long tuple stand for the offsets of a million chunks).
TEST(ParsedDcpMetadata, ChunksOfMoreDimsThanATensorHasAreRefused) {
  DcpMetadata md;
  const std::vector<int64_t> deep(33, 1);
  md.tensors.push_back(DcpTensor{"w", DType::kFloat32, deep, {DcpChunk{std::vector<int64_t>(33, 0), deep,
                                                                        DcpStorage{"__0_0.distcp", 0, 4}}}});
  Result<ParsedDcpMetadata> parsed = ParseDcpMetadata(EncodeDcpMetadata(md), "m");
  ASSERT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("'w' size has 33 dims (at most 32)"), std::string::npos) << parsed.status().message();
}

// Two storage records on the same bytes are refused before any chunk is located: a permuted
// chunk's many pieces could otherwise be described again and again over the same bytes.
TEST(DcpFolder, RecordsSharingBytesAreRefusedBeforeAnyChunkIsLocated) {
  testing::TempDir dir;
  DcpMetadata md;
  md.tensors.push_back(DcpTensor{"a", DType::kFloat32, {4}, {DcpChunk{{0}, {4}, DcpStorage{"__0_0.distcp", 0, 16}}}});
  md.tensors.push_back(DcpTensor{"b", DType::kFloat32, {4}, {DcpChunk{{0}, {4}, DcpStorage{"__0_0.distcp", 8, 16}}}});
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir.path(), ".metadata"), EncodeDcpMetadata(md), "test").ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir.path(), "__0_0.distcp"), std::string(64, '\0'), "test").ok());
  Result<Manifest> read = ReadDcpFolder(dir.path());
  ASSERT_FALSE(read.ok());
  EXPECT_NE(read.status().message().find("two records overlap in __0_0.distcp at offset 8"), std::string::npos)
      << read.status().message();
  // Apart, the records pass that check and are located (and these zero bytes are no torch.save
  // zip, which the locating says).
  md.tensors[1].chunks[0].storage.offset = 16;
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir.path(), ".metadata"), EncodeDcpMetadata(md), "test").ok());
  Result<Manifest> apart = ReadDcpFolder(dir.path());
  ASSERT_FALSE(apart.ok());
  EXPECT_EQ(apart.status().message().find("overlap"), std::string::npos) << apart.status().message();
  EXPECT_NE(apart.status().message().find("no torch.save zip starts there"), std::string::npos) << apart.status().message();
}

TEST(DcpManifest, TheRanksThatReceiveItKnowItCameFromADcpFolder) {
  Manifest m = DcpLikeManifest();
  EXPECT_FALSE(BuiltFromDcpFolder(m));
  m.created.user[kDcpSourceKey] = kDcpSourceValue;
  EXPECT_TRUE(BuiltFromDcpFolder(m));
  Result<Manifest> shared = DecodeManifestMessage(EncodeManifestMessage(m), "message");
  ASSERT_TRUE(shared.ok()) << shared.status().message();
  EXPECT_TRUE(BuiltFromDcpFolder(*shared));
  // A checkpoint imported from a DCP folder may keep the mark; its files are shardckpt's own.
  m.files.push_back(m.files[0]);
  m.files.back().name = "rank-00000.bin";
  EXPECT_FALSE(BuiltFromDcpFolder(m));
}

TEST(DcpManifest, FilesWithoutChecksumsExistOnlyInMemory) {
  Manifest m = DcpLikeManifest();
  EXPECT_TRUE(ValidateManifest(m).ok()) << ValidateManifest(m).message();
  Result<std::string> text = EncodeManifest(m);
  ASSERT_TRUE(text.ok());
  // What rank 0 sends the other ranks of a load reads as it was...
  Result<Manifest> shared = DecodeManifestMessage(EncodeManifestMessage(m), "message");
  ASSERT_TRUE(shared.ok()) << shared.status().message();
  EXPECT_FALSE(shared->files[0].checksums);
  EXPECT_EQ(shared->entries[0].chunks[0].offset, 123u);
  // ...but a manifest.json on disk claiming it is refused: it would switch verification off.
  Result<Manifest> disk = DecodeManifest(*text, "step-1/manifest.json");
  ASSERT_FALSE(disk.ok());
  EXPECT_NE(disk.status().message().find("'checksums' is not allowed"), std::string::npos) << disk.status().message();
  // A chunk past the end of such a file is still refused.
  m.entries[0].chunks[0].offset = 990;
  EXPECT_NE(ValidateManifest(m).message().find("runs past the data"), std::string::npos);
}

}  // namespace
}  // namespace shardckpt
