// `shardckpt import` of hostile and honest torch.save files: every tensor record validated and
// refused naming the tensor and the field, the restricted unpickler held to torch's weights_only
// rules and to a memory budget, views read element by element, interrupted reads retried.
#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

#include "shardckpt/engine/core/checkpoint_reader.h"
#include "shardckpt/engine/core/convert.h"
#include "shardckpt/engine/formats/safetensors.h"
#include "shardckpt/engine/formats/torch_file.h"
#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"
#include "tests/test_util.h"
#include "tests/torch_files.h"

using ::testing::HasSubstr;

namespace shardckpt {
namespace {

// Linked with -Wl,--wrap=pread,--wrap=pread64: while armed, every other read is "interrupted by a
// signal" before it starts, as a SIGCHLD or a profiler's timer would do.
std::atomic<bool> g_interrupt_reads{false};
std::atomic<int> g_interrupted{0};

template <typename Real>
ssize_t MaybeInterrupted(Real real, int fd, void* buf, size_t n, off_t offset) {
  static std::atomic<unsigned> calls{0};
  if (g_interrupt_reads && calls++ % 2 == 0) {
    g_interrupted++;
    errno = EINTR;
    return -1;
  }
  return real(fd, buf, n, offset);
}

}  // namespace
}  // namespace shardckpt

extern "C" ssize_t __real_pread(int fd, void* buf, size_t n, off_t offset);
extern "C" ssize_t __real_pread64(int fd, void* buf, size_t n, off_t offset);
extern "C" ssize_t __wrap_pread(int fd, void* buf, size_t n, off_t offset) {
  return shardckpt::MaybeInterrupted(__real_pread, fd, buf, n, offset);
}
extern "C" ssize_t __wrap_pread64(int fd, void* buf, size_t n, off_t offset) {
  return shardckpt::MaybeInterrupted(__real_pread64, fd, buf, n, offset);
}

namespace shardckpt {
namespace {

using testing::TempDir;

std::string ReadAll(const std::string& path) { return ReadFileLimited(path, 1 << 30).value(); }

class ImportTest : public ::testing::Test {
 protected:
  void SetUp() override { SetLogLevel(LogLevel::kWarn); }
  std::string Path(const std::string& name) const { return JoinPath(dir_.path(), name); }
  ConvertOptions Options(int world = 2) const {
    ConvertOptions o;
    o.world_size = world;
    return o;
  }
  TempDir dir_;
};

TEST_F(ImportTest, HostileTensorRecordsAreRefusedNamingTensorAndField) {
  for (const testing::TorchFileCase& c : testing::HostileTensorRecords()) {
    SCOPED_TRACE(c.name);
    const std::string file = Path(c.name + ".pt"), root = Path("root-" + c.name);
    ASSERT_TRUE(testing::WriteTorchFile(file, c).ok());
    Result<ConvertReport> r = ImportFile(file, root, Options());
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr(c.refusal));
    EXPECT_THAT(r.status().message(), HasSubstr(file));
    EXPECT_FALSE(PathExists(root)) << "a refused file must leave no output root behind";
    // The same bytes from memory (the fuzz target's path) are refused the same way.
    Result<ZipReader> zip = ZipReader::Open(ByteSource::FromBytes(ReadAll(file), c.name));
    ASSERT_TRUE(zip.ok()) << zip.status().ToString();
    Result<UnpickledStateDict> dict = ReadTorchStateDict(*zip);
    ASSERT_FALSE(dict.ok());
    EXPECT_THAT(dict.status().message(), HasSubstr(c.refusal));
  }
}

// One view under many names (nn.ModuleList([block] * 12)) is written once, so it counts once
// against the bound on bytes viewed: six names of a 256 MiB view of a 4-byte storage are 256
// MiB, not 1.5 GiB, and pass; six different such views do not.
TEST(TorchViewBound, AViewUnderManyNamesCountsOnce) {
  using D = DType;
  std::vector<PickleTensor> same, different;
  for (int i = 0; i < 6; ++i) {
    same.push_back(PickleTensor{"block" + std::to_string(i), D::kFloat32, {int64_t{1} << 26}, {0}, 0, "0", 1});
    different.push_back(PickleTensor{"view" + std::to_string(i), D::kFloat32, {(int64_t{1} << 26) - i}, {0}, 0, "0", 1});
  }
  for (const bool tied : {true, false}) {
    const testing::TorchFileCase c{tied ? "tied" : "views", PickleStateDict(tied ? same : different).value(), {{"0", 4}}, "", ""};
    TempDir dir;
    const std::string file = JoinPath(dir.path(), c.name + ".pt");
    ASSERT_TRUE(testing::WriteTorchFile(file, c).ok());
    Result<ZipReader> zip = ZipReader::Open(ByteSource::FromBytes(ReadAll(file), c.name));
    ASSERT_TRUE(zip.ok()) << zip.status().ToString();
    Result<UnpickledStateDict> dict = ReadTorchStateDict(*zip);
    EXPECT_EQ(dict.ok(), tied) << (dict.ok() ? std::string("read") : dict.status().ToString());
    if (!tied) {
      EXPECT_THAT(dict.status().message(), HasSubstr("more than 4x the 4 bytes stored plus 1 GiB"));
    }
  }
}

// What the tensors of ValidTorchFiles() hold, gathered here the slow and obvious way.
std::vector<uint8_t> Gather(const PickleTensor& t) {
  const size_t element = DTypeSize(t.dtype);
  std::vector<uint8_t> out;
  const int64_t numel = NumElements(t.sizes).value();
  for (int64_t i = 0; i < numel; ++i) {
    int64_t at = t.storage_offset, rest = i;
    for (size_t d = t.sizes.size(); d-- > 0;) {
      at += (rest % t.sizes[d]) * t.strides[d];
      rest /= t.sizes[d];
    }
    for (size_t k = 0; k < element; ++k) out.push_back(testing::RecordByte(t.storage_key, at * element + k));
  }
  return out;
}

TEST_F(ImportTest, ViewsIntoSharedStoragesImportElementByElement) {
  for (const testing::TorchFileCase& c : testing::ValidTorchFiles()) {
    const std::string file = Path(c.name + ".pt"), root = Path("root-" + c.name);
    ASSERT_TRUE(testing::WriteTorchFile(file, c).ok());
    Result<ConvertReport> r = ImportFile(file, root, Options(3));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    UnpickledStateDict dict = UnpickleStateDict(c.pickle).value();
    auto reader = CheckpointReader::Open(root).value();
    ASSERT_EQ(reader->manifest().entries.size(), dict.tensors.size());
    for (const PickleTensor& t : dict.tensors) {
      SCOPED_TRACE(t.name);
      size_t index = 0;
      while (reader->manifest().entries[index].name != t.name) ++index;
      const EntryRecord& e = reader->manifest().entries[index];
      EXPECT_EQ(e.dtype, t.dtype);
      EXPECT_EQ(e.shape, t.sizes);
      std::vector<uint8_t> expected = Gather(t), got(expected.size() + 1, 0xAB);
      ASSERT_TRUE(reader->ReadPiece(index, Layout::Whole(), got.data()).ok());
      EXPECT_EQ(got.back(), 0xAB);
      got.pop_back();
      EXPECT_EQ(got, expected);
    }
  }
}

TEST_F(ImportTest, Float8IsWrittenAsTorch2WritesItAndReadBack) {
  const std::vector<PickleTensor> tensors = {PickleTensor{"e4m3", DType::kFloat8E4M3, {2, 3}, {3, 1}, 0, "0", 6},
                                             PickleTensor{"e5m2", DType::kFloat8E5M2, {4}, {1}, 0, "1", 4},
                                             PickleTensor{"f32", DType::kFloat32, {1}, {1}, 0, "2", 1}};
  const std::string pickle = PickleStateDict(tensors).value();
  // No Float8_e4m3fnStorage (a class torch never had): an UntypedStorage and _rebuild_tensor_v3.
  EXPECT_EQ(pickle.find("Float8"), std::string::npos);
  EXPECT_NE(pickle.find("_rebuild_tensor_v3"), std::string::npos);
  EXPECT_NE(pickle.find("UntypedStorage"), std::string::npos);
  EXPECT_NE(pickle.find("float8_e5m2"), std::string::npos);
  EXPECT_NE(pickle.find("FloatStorage"), std::string::npos) << "other dtypes keep what torch 1.13 reads";
  const testing::TorchFileCase c{"f8", pickle, {{"0", 6}, {"1", 4}, {"2", 4}}, "", ""};
  ASSERT_TRUE(testing::WriteTorchFile(Path("f8.pt"), c).ok());
  ASSERT_TRUE(ImportFile(Path("f8.pt"), Path("root"), Options()).ok());
  auto reader = CheckpointReader::Open(Path("root")).value();
  ASSERT_EQ(reader->manifest().entries.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    const EntryRecord& e = reader->manifest().entries[i];
    const PickleTensor& t = *std::find_if(tensors.begin(), tensors.end(), [&](const PickleTensor& x) { return x.name == e.name; });
    EXPECT_EQ(e.dtype, t.dtype);
    EXPECT_EQ(e.shape, t.sizes);
    std::vector<uint8_t> got(static_cast<size_t>(t.storage_numel) * DTypeSize(t.dtype));
    ASSERT_TRUE(reader->ReadPiece(i, Layout::Whole(), got.data()).ok());
    for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k], testing::RecordByte(t.storage_key, k)) << e.name << " byte " << k;
  }
}

std::string Le(uint64_t v, int n) {
  std::string out;
  for (int k = 0; k < n; ++k) out += static_cast<char>((v >> (8 * k)) & 0xFF);
  return out;
}

// A zip of stored records, as torch.save writes one; `extra` is the central directory's extra
// field of the last record, whose sizes are then 0xFFFFFFFF (zip64's, in that field) when given.
std::string StoredZip(const std::vector<std::pair<std::string, std::string>>& records, const std::string& extra = "") {
  std::string zip, dir;
  for (size_t i = 0; i < records.size(); ++i) {
    const auto& [name, data] = records[i];
    const bool last_with_extra = i + 1 == records.size() && !extra.empty();
    const uint64_t offset = zip.size();
    zip += Le(0x04034b50, 4) + Le(20, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + Le(0, 4) + Le(data.size(), 4) +
           Le(data.size(), 4) + Le(name.size(), 2) + Le(0, 2) + name + data;
    const uint64_t size = last_with_extra ? 0xFFFFFFFF : data.size();
    const std::string own_extra = last_with_extra ? extra : "";
    dir += Le(0x02014b50, 4) + Le(20, 2) + Le(20, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) + Le(0, 4) + Le(size, 4) +
           Le(size, 4) + Le(name.size(), 2) + Le(own_extra.size(), 2) + Le(0, 2) + Le(0, 2) + Le(0, 2) + Le(0, 4) +
           Le(offset, 4) + name + own_extra;
  }
  const uint64_t dir_offset = zip.size();
  zip += dir + Le(0x06054b50, 4) + Le(0, 2) + Le(0, 2) + Le(records.size(), 2) + Le(records.size(), 2) +
         Le(dir.size(), 4) + Le(dir_offset, 4) + Le(0, 2);
  return zip;
}

// The last central directory entry's zip64 extra field claims 24 bytes where its entry holds
// none: its sizes must not be read from past the directory (ASan: a heap overflow of the copy).
TEST(ZipReaderTest, AnExtraFieldLongerThanItsEntryIsRefused) {
  const std::string zip = StoredZip({{"archive/data.pkl", "\x80\x02}."}}, Le(1, 2) + Le(24, 2));
  Result<ZipReader> r = ZipReader::Open(ByteSource::FromBytes(zip, "extra.pt"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("extra.pt: not a valid torch.save zip: record 'archive/data.pkl': an extra field runs past its entry"));
}

// Two records of one name: torch.load reads the first, import read the last (other tensor
// values, silently). Refused, naming the record.
TEST(ZipReaderTest, ARecordNamedTwiceIsRefused) {
  const std::string zip = StoredZip({{"archive/data.pkl", "\x80\x02}."}, {"archive/data/0", "1234"}, {"archive/data/0", "9999"}});
  Result<ZipReader> r = ZipReader::Open(ByteSource::FromBytes(zip, "dup.pt"));
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("dup.pt: not a valid torch.save zip: record 'archive/data/0' occurs twice"));
  ASSERT_TRUE(ZipReader::Open(ByteSource::FromBytes(StoredZip({{"archive/data.pkl", "\x80\x02}."}, {"archive/data/0", "1234"}}),
                                                    "once.pt")).ok());
}

// An import reads a .pt's tensors through a window of the file: every read, in file order or
// not, inside the window or across its edge, wider than it or past the file's end, returns the
// bytes (or the refusal) a read of the source itself does.
TEST(ReadAheadWindowTest, EveryReadReturnsWhatTheSourceHolds) {
  std::string bytes(1000, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + i / 256);
  const ByteSource source = ByteSource::FromBytes(bytes, "w.pt");
  ReadAheadWindow window(source, 64);
  const struct {
    uint64_t at;
    size_t n;
  } reads[] = {{0, 10},  {10, 20},  {30, 34},  {64, 8},   {60, 10},  // in order, then across a refill
               {5, 3},   {500, 40}, {520, 30}, {540, 33}, {100, 0},  // behind, ahead, half a window, none
               {990, 10}, {998, 2}, {980, 200}, {1000, 1}, {2000, 4}};  // the end, wider, past the end
  for (const auto& r : reads) {
    std::string got(r.n, '?'), want(r.n, '?');
    const Status a = window.ReadAt(r.at, got.data(), r.n);
    const Status b = source.ReadAt(r.at, want.data(), r.n);
    ASSERT_EQ(a.ok(), b.ok()) << r.at << " +" << r.n << ": " << a.ToString();
    if (b.ok()) {
      EXPECT_EQ(got, want) << r.at << " +" << r.n;
    } else {
      EXPECT_EQ(a.message(), b.message());
      EXPECT_THAT(a.message(), HasSubstr("w.pt: read of"));
    }
  }
}

// torch.load byte-swaps a file written on a big-endian host; import, which does not, refuses it.
TEST_F(ImportTest, BigEndianFilesAreRefusedNotReadSwapped) {
  testing::TorchFileCase c = testing::ValidTorchFiles()[0];
  c.byteorder = "big";
  ASSERT_TRUE(testing::WriteTorchFile(Path("big.pt"), c).ok());
  Result<ConvertReport> r = ImportFile(Path("big.pt"), Path("root-big"), Options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnimplemented) << r.status().ToString();
  EXPECT_THAT(r.status().message(), HasSubstr(Path("big.pt") + ": a big-endian torch.save file (byteorder 'big')"));
  EXPECT_FALSE(PathExists(Path("root-big")));
  c.byteorder = "middle";
  ASSERT_TRUE(testing::WriteTorchFile(Path("odd.pt"), c).ok());
  r = ImportFile(Path("odd.pt"), Path("root-odd"), Options());
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("unknown byteorder 'middle'"));
  c.byteorder = "little";  // what torch 2.x writes on x86 and arm64
  ASSERT_TRUE(testing::WriteTorchFile(Path("little.pt"), c).ok());
  r = ImportFile(Path("little.pt"), Path("root-little"), Options());
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

// torch.save(..., _use_new_zipfile_serialization=False): five pickles, then each storage as an
// 8-byte element count and its elements. One float tensor of 3 elements, viewed from offset 1.
template <size_t N>
std::string Bytes(const char (&text)[N]) {  // a literal with its NULs
  return std::string(text, N - 1);
}

const std::string kMagicProtocol2 = Bytes("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.");

std::string LegacyFile(int64_t count, const std::string& data, const std::string& magic = kMagicProtocol2) {
  std::string f = magic;
  f += Bytes("\x80\x02M\xe9\x03.");                                                   // 1001
  f += Bytes("\x80\x02}(X\x0d\0\0\0little_endian\x88u.");                             // system info
  f += Bytes("\x80\x02}(X\x01\0\0\0wctorch._utils\n_rebuild_tensor_v2\n((X\x07\0\0\0storage"
             "ctorch\nFloatStorage\nX\x03\0\0\0k42X\x03\0\0\0cpuK\x03NtQK\x01K\x02\x85K\x01\x85\x89"
             "ccollections\nOrderedDict\n)RtRu.");
  f += Bytes("\x80\x02](X\x03\0\0\0k42e.");  // storage keys
  f.append(reinterpret_cast<const char*>(&count), 8);
  return f + data;
}

TEST_F(ImportTest, LegacyFormatIsRead) {
  const float values[3] = {1.5f, -2.0f, 8.25f};
  const std::string data(reinterpret_cast<const char*>(values), 12);
  std::ofstream(Path("old.pt"), std::ios::binary) << LegacyFile(3, data);
  Result<ConvertReport> r = ImportFile(Path("old.pt"), Path("root"), Options());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::Open(r->path).value();
  ASSERT_EQ(reader->manifest().entries.size(), 1u);
  EXPECT_EQ(reader->manifest().entries[0].shape, (Shape{2}));
  float got[2];
  ASSERT_TRUE(reader->ReadPiece(0, Layout::Whole(), got).ok());
  EXPECT_EQ(got[0], -2.0f);
  EXPECT_EQ(got[1], 8.25f);
  // Counts that disagree with the file or the state dict, and a file cut short, are DataLoss or
  // refusals naming the storage; none is "not a zip".
  struct Case {
    std::string bytes, refusal;
  } cases[] = {
      {LegacyFile(1000, data), "storage 'k42' claims 1000 elements, past the end of the file"},
      {LegacyFile(2, data.substr(0, 8)), "storage data/k42 holds 8 bytes, not 3 float32 elements"},
      {LegacyFile(3, data).substr(0, 100), "the legacy file ends inside its state dict pickle"},
      {Bytes("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.") + std::string(100, '\0'),
       "a pickle of protocol 0 or 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.refusal);
    std::ofstream(Path("bad.pt"), std::ios::binary) << c.bytes;
    Result<ConvertReport> bad = ImportFile(Path("bad.pt"), Path("root-bad"), Options());
    ASSERT_FALSE(bad.ok());
    EXPECT_THAT(bad.status().message(), HasSubstr(c.refusal));
    EXPECT_THAT(bad.status().message(), ::testing::Not(HasSubstr("zip")));
    EXPECT_FALSE(PathExists(Path("root-bad")));
  }
}

// torch.save(..., pickle_protocol=p, _use_new_zipfile_serialization=False) starts with the magic
// number pickled at protocol p: FRAMEd from 4 on, as LONG text below 2. The first kind is read;
// the second refused by its protocol, never as "not a zip".
TEST_F(ImportTest, LegacyFilesOfEveryPickleProtocolAreReadOrRefusedByProtocol) {
  const float values[3] = {1.5f, -2.0f, 8.25f};
  const std::string data(reinterpret_cast<const char*>(values), 12);
  const std::string long1 = Bytes("\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.");
  const std::string frame = Bytes("\x95\x0d\0\0\0\0\0\0\0");
  for (const std::string& magic : {Bytes("\x80\x03") + long1, Bytes("\x80\x04") + frame + long1,
                                   Bytes("\x80\x05") + frame + long1}) {
    SCOPED_TRACE(static_cast<int>(magic[1]));
    std::ofstream(Path("p.pt"), std::ios::binary) << LegacyFile(3, data, magic);
    Result<ConvertReport> r = ImportFile(Path("p.pt"), Path("root-p" + std::to_string(magic[1])), Options());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    std::unique_ptr<CheckpointReader> reader = CheckpointReader::Open(r->path).value();
    float got[2];
    ASSERT_TRUE(reader->ReadPiece(0, Layout::Whole(), got).ok());
    EXPECT_EQ(got[1], 8.25f);
  }
  std::ofstream(Path("p0.pt"), std::ios::binary) << LegacyFile(3, data, "L119547037146038801333356L\n.");
  Result<ConvertReport> p0 = ImportFile(Path("p0.pt"), Path("root-p0"), Options());
  ASSERT_FALSE(p0.ok());
  EXPECT_THAT(p0.status().message(), HasSubstr("a pickle of protocol 0 or 1 (no PROTO opcode) is not supported"));
  EXPECT_FALSE(PathExists(Path("root-p0")));
}

TEST_F(ImportTest, InterruptedReadsAreRetriedNotReportedAsDataLoss) {
  const testing::TorchFileCase c = testing::ValidTorchFiles()[0];
  ASSERT_TRUE(testing::WriteTorchFile(Path("v.pt"), c).ok());
  std::vector<SafetensorsEntry> entries = {{"a", DType::kFloat32, {3}, 0, 0}, {"b", DType::kInt8, {5}, 0, 0}};
  std::string st = EncodeSafetensorsHeader(entries, {}).value();
  for (int k = 0; k < 17; ++k) st += static_cast<char>(k * 3);
  std::ofstream(Path("v.safetensors"), std::ios::binary) << st;
  g_interrupted = 0;
  g_interrupt_reads = true;
  Result<ConvertReport> pt = ImportFile(Path("v.pt"), Path("root-pt"), Options());
  Result<ConvertReport> sf = ImportFile(Path("v.safetensors"), Path("root-st"), Options());
  g_interrupt_reads = false;
  ASSERT_TRUE(pt.ok()) << pt.status().ToString();
  ASSERT_TRUE(sf.ok()) << sf.status().ToString();
  EXPECT_GT(g_interrupted.load(), 4) << "the wrapper never interrupted a read: the test proves nothing";
  auto reader = CheckpointReader::Open(Path("root-st")).value();
  std::vector<uint8_t> b(5);
  ASSERT_TRUE(reader->ReadPiece(1, Layout::Whole(), b.data()).ok());
  EXPECT_EQ(b, (std::vector<uint8_t>{36, 39, 42, 45, 48}));
}

TEST_F(ImportTest, SafetensorsWithTypesOrNamesWeLackAreRefusedPlainly) {
  struct Case {
    std::string header, refusal;
    Code code;
  } cases[] = {
      {R"({"z":{"dtype":"F8_E8M0","shape":[8],"data_offsets":[0,8]}})", "tensor 'z': dtype F8_E8M0 is not supported by shardckpt",
       Code::kUnimplemented},
      {R"({"u":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,8]}})", "tensor 'u': dtype F6_E2M3 is not supported by shardckpt",
       Code::kUnimplemented},
      // What safetensors 0.8 writes for torch's float8_e4m3fnuz and float8_e5m2fnuz.
      {R"({"f":{"dtype":"F8_E4M3FNUZ","shape":[8],"data_offsets":[0,8]}})", "tensor 'f': dtype F8_E4M3FNUZ is not supported by shardckpt",
       Code::kUnimplemented},
      {R"({"g":{"dtype":"F8_E5M2FNUZ","shape":[8],"data_offsets":[0,8]}})", "tensor 'g': dtype F8_E5M2FNUZ is not supported by shardckpt",
       Code::kUnimplemented},
      {R"({"":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "a tensor has an empty name", Code::kInvalidArgument},
      {R"({"x":{"dtype":"NOPE","shape":[2],"data_offsets":[0,8]}})", "invalid safetensors", Code::kDataLoss},
  };
  int i = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    std::string header = c.header + std::string((8 - c.header.size() % 8) % 8, ' ');
    uint64_t n = header.size();
    const std::string file = Path("t" + std::to_string(i++) + ".safetensors");
    std::ofstream(file, std::ios::binary) << std::string(reinterpret_cast<const char*>(&n), 8) << header << std::string(8, '\1');
    Result<ConvertReport> r = ImportFile(file, Path("root"), Options());
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), c.code) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(c.refusal));
    EXPECT_FALSE(PathExists(Path("root")));
  }
}

TEST_F(ImportTest, AFailedImportLeavesNoRootItCreated) {
  const testing::TorchFileCase c = testing::ValidTorchFiles()[0];
  ASSERT_TRUE(testing::WriteTorchFile(Path("v.pt"), c).ok());
  ASSERT_TRUE(SetFailpoints("io.fsync=EIO").ok());
  Result<ConvertReport> fresh = ImportFile(Path("v.pt"), Path("new-root"), Options());
  ASSERT_TRUE(MakeDirs(Path("old-root")).ok());
  Result<ConvertReport> old = ImportFile(Path("v.pt"), Path("old-root"), Options());
  ASSERT_TRUE(SetFailpoints("").ok());
  ASSERT_FALSE(fresh.ok());
  EXPECT_THAT(fresh.status().message(), HasSubstr("injected at failpoint io.fsync"));
  EXPECT_FALSE(PathExists(Path("new-root"))) << "no empty root holding a lock file";
  ASSERT_FALSE(old.ok());
  EXPECT_TRUE(IsDirectory(Path("old-root"))) << "a root that was there before stays";
}

// ---------------------------------------------------------------- the unpickler alone

TEST(UnpickleTest, FollowsTorchWeightsOnlyRules) {
  for (const testing::PickleCase& c : testing::WeightsOnlyCases()) {
    SCOPED_TRACE(c.name);
    Result<UnpickledStateDict> r = UnpickleStateDict(c.pickle);
    if (c.refusal.empty()) {
      EXPECT_TRUE(r.ok()) << r.status().ToString();
    } else {
      ASSERT_FALSE(r.ok());
      EXPECT_THAT(r.status().message(), HasSubstr(c.refusal));
    }
  }
}

// bytearray(b"a\xffb") and bytearray() as torch.save pickles them (torch 2.x's weights_only reads
// them): values, tagged as bytearrays so that the Python package gives bytearrays back.
TEST(UnpickleTest, BytearraysAreValuesOfTheirType) {
  using namespace std::string_literals;  // the pickles hold NUL bytes
  const std::string pickle = "\x80\x02}(X\x02\x00\x00\x00"s + "ba" + "c__builtin__\nbytearray\n" +
                             "c_codecs\nencode\nX\x04\x00\x00\x00"s + "a\xc3\xbf" + "bX\x06\x00\x00\x00latin1\x86R\x85R"s +
                             "X\x01\x00\x00\x00"s + "ec__builtin__\nbytearray\n)Ru.";
  Result<UnpickledStateDict> r = UnpickleStateDict(pickle);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->values.size(), 2u);
  EXPECT_EQ(r->values[0].name, "ba");
  EXPECT_EQ(r->values[0].blob.substr(2), R"({"__shardckpt__":"bytearray","v":"Yf9i"})");
  EXPECT_EQ(r->values[1].blob.substr(2), R"({"__shardckpt__":"bytearray","v":""})");
  // Called only as torch.save calls it.
  Result<UnpickledStateDict> bad = UnpickleStateDict("\x80\x02}(X\x01\x00\x00\x00x"s + "c__builtin__\nbytearray\nK\x05\x85Ru.");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("bytearray() is called only as torch.save pickles a bytearray"));
}

TEST(UnpickleTest, SharedReferencesAreFlattenedUnderEveryName) {
  Result<UnpickledStateDict> r = UnpickleStateDict(testing::SharedReferenceBomb(3));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->values.size(), 8u);
  EXPECT_EQ(r->values.front().name, "a.a.a.x");
  EXPECT_EQ(r->values.back().name, "b.b.b.x");
}

TEST(UnpickleTest, SharedReferenceBombFailsFast) {
  const std::string bomb = testing::SharedReferenceBomb(60);  // 2^60 names
  ASSERT_LT(bomb.size(), 1500u);
  auto start = std::chrono::steady_clock::now();
  Result<UnpickledStateDict> r = UnpickleStateDict(bomb);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("bytes of memory, the budget for a pickle of " + std::to_string(bomb.size())));
  EXPECT_LT(seconds, 10.0);
}

TEST(UnpickleTest, MemoryIsBoundedByABudgetProportionalToThePickle) {
  const std::string flood = testing::ObjectFlood(size_t{4} << 20);
  Result<UnpickledStateDict> r = UnpickleStateDict(flood);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(),
              HasSubstr("needs more than " + std::to_string(UnpickleMemoryBudget(flood.size())) + " bytes of memory"));
  EXPECT_TRUE(UnpickleStateDict(testing::ObjectFlood(100000)).ok());
  // A real state dict of many tensors stays well inside its budget.
  std::vector<PickleTensor> tensors;
  for (int i = 0; i < 20000; ++i) {
    tensors.push_back(PickleTensor{"layers." + std::to_string(i) + ".weight", DType::kBFloat16, {64, 32}, {32, 1}, 0,
                                   std::to_string(i), 2048});
  }
  Result<UnpickledStateDict> big = UnpickleStateDict(PickleStateDict(tensors).value());
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  EXPECT_EQ(big->tensors.size(), tensors.size());
  EXPECT_EQ(big->tensors.back().name, "layers.19999.weight");
}

}  // namespace
}  // namespace shardckpt
