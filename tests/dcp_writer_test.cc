#include "shardckpt/engine/formats/dcp_writer.h"

#include <gtest/gtest.h>

namespace shardckpt {
namespace {

std::string Pickle2(const std::string& body) { return std::string("\x80\x02", 2) + body + "."; }

// _codecs.encode(text, "latin1"), as protocol 2 (torch.save) pickles bytes; the global's first
// use, memoized at 0.
std::string CodecsBytes(const std::string& latin1_text) {
  std::string n(4, '\0');
  n[0] = static_cast<char>(latin1_text.size());
  return std::string("c_codecs\nencode\nq\0(X", 20) + n + latin1_text + std::string("X\x06\0\0\0latin1tR", 13);
}

TEST(DcpBlobPickle, BytesBlobsAreBytesObjects) {
  // Tagged raw bytes and the C++ API's untagged blobs, in the form torch.save writes and torch
  // 2.x's weights_only reader takes (it refuses protocol 3's BINBYTES).
  Result<std::string> tagged = PickleBlobValue(std::string("\0Bab", 4));
  ASSERT_TRUE(tagged.ok());
  EXPECT_EQ(*tagged, Pickle2(CodecsBytes("ab")));
  Result<std::string> bytearray = PickleBlobValue(std::string("\0bab", 4));  // the Python package's bytearray
  ASSERT_TRUE(bytearray.ok()) << bytearray.status().ToString();
  EXPECT_EQ(*bytearray, Pickle2(CodecsBytes("ab")));
  // Bytes past 0x7f are latin1 code points, two bytes each in the UTF-8 of the str.
  Result<std::string> raw = PickleBlobValue(std::string("x\xff", 2));
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(*raw, Pickle2(CodecsBytes("x\xc3\xbf")));
}

TEST(DcpBlobPickle, TypedJsonBecomesTheValue) {
  // {"n": 42, "t": (None, True)}, as the Python package encodes it.
  Result<std::string> p = PickleBlobValue(std::string("\0J", 2) +
                                          R"({"n": 42, "t": {"__shardckpt__": "tuple", "v": [null, true]}})");
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  std::string body = "}(";
  body += std::string("X\x01\0\0\0n", 6) + "K*";
  body += std::string("X\x01\0\0\0t", 6) + "(N\x88t";
  body += "u";
  EXPECT_EQ(*p, Pickle2(body));
}

TEST(DcpBlobPickle, RefusesWhatHasNoPythonValueHere) {
  Result<std::string> tensor = PickleBlobValue(std::string("\0T{}\n", 5));
  ASSERT_FALSE(tensor.ok());
  EXPECT_NE(tensor.status().message().find("per-rank tensor"), std::string::npos);
  Result<std::string> bad = PickleBlobValue(std::string("\0J{", 3));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("does not parse"), std::string::npos);
}

TEST(DcpTensorPickle, RebuildsTheDtypeAndShape) {
  std::string p = PickleContiguousTensor(DType::kBFloat16, {2, 3});
  EXPECT_NE(p.find("ctorch._utils\n_rebuild_tensor_v2\n"), std::string::npos);
  EXPECT_NE(p.find("ctorch\nBFloat16Storage\n"), std::string::npos);
  // sizes (2, 3) and strides (3, 1) follow storage_offset 0.
  EXPECT_NE(p.find("QK\x00(K\x02K\x03t(K\x03K\x01t\x89", 0, 16), std::string::npos);
  std::string f8 = PickleContiguousTensor(DType::kFloat8E4M3, {4});
  EXPECT_NE(f8.find("_rebuild_tensor_v3"), std::string::npos);
  EXPECT_NE(f8.find("ctorch\nfloat8_e4m3fn\n"), std::string::npos);
}

TEST(DcpMetadata, NamesTheClassesDcpUnpickles) {
  DcpMetadata md;
  md.tensors.push_back(DcpTensor{"w", DType::kFloat32, {4}, {DcpChunk{{0}, {4}, DcpStorage{"__0_0.distcp", 0, 100}}}});
  md.bytes.push_back(DcpBytes{"step", DcpStorage{"__0_0.distcp", 100, 50}});
  std::string p = EncodeDcpMetadata(md);
  for (const char* cls : {"Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
                          "BytesStorageMetadata", "MetadataIndex", "StorageMeta"}) {
    EXPECT_NE(p.find("ctorch.distributed.checkpoint.metadata\n" + std::string(cls) + "\n"), std::string::npos) << cls;
  }
  EXPECT_NE(p.find("ctorch.distributed.checkpoint.filesystem\n_StorageInfo\n"), std::string::npos);
  EXPECT_NE(p.find("X\x05\0\0\0" "1.0.0", 0, 10), std::string::npos);
  EXPECT_EQ(p.back(), '.');
}

}  // namespace
}  // namespace shardckpt
