// Single-process save and load: the commit protocol under a failure at each step, retention,
// the writer lock, corrupt and missing files, and load options.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <tuple>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/async_save.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/consolidate.h"
#include "shardckpt/engine/core/convert.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/formats/safetensors.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/core/version.h"
#include "shardckpt/engine/core/verify.h"
#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/engine/formats/zip_reader.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// A state of every dtype and shape kind, its bytes derived from `seed` so steps differ.
struct Tensors {
  struct T {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<T> all;
  explicit Tensors(const std::string& seed) {
    const std::vector<std::pair<DType, Shape>> kinds = {
        {DType::kFloat64, {3, 5}},   {DType::kFloat32, {64, 33}}, {DType::kFloat16, {7}},
        {DType::kBFloat16, {2, 2, 3}}, {DType::kInt64, {}},        {DType::kInt32, {0, 4}},
        {DType::kInt16, {5}},        {DType::kInt8, {9}},         {DType::kUInt8, {4096}},
        {DType::kBool, {6}},         {DType::kFloat8E4M3, {8}},   {DType::kFloat8E5M2, {2, 4}}};
    for (size_t i = 0; i < kinds.size(); ++i) {
      std::string name = std::string("model.") + DTypeName(kinds[i].first);
      all.push_back(T{name, kinds[i].first, kinds[i].second,
                      testing::PieceBytes(seed + name, kinds[i].first, kinds[i].second, Layout::Whole())});
    }
  }
  ShardedState State() {
    ShardedState state;
    for (T& t : all) EXPECT_TRUE(state.AddTensor(t.name, t.dtype, t.shape, Layout::Whole(), t.bytes.data()).ok());
    EXPECT_TRUE(state.AddBlob("step", "1234").ok());
    EXPECT_TRUE(state.AddBlob("rng", "rank0-rng", BlobScope::kPerRank).ok());
    return state;
  }
};

class CheckpointTest : public ::testing::Test {
 protected:
  void TearDown() override { SetFailpoints("").IgnoreError(); }
  Result<SaveResult> SaveStep(int64_t step, const SaveOptions& options = {}) {
    Tensors tensors("step" + std::to_string(step));
    return Save(*comm_, root(), step, tensors.State(), options);
  }
  // Loads `path` and checks every byte against the state saved at `step`.
  void ExpectLoads(const std::string& path, int64_t step) {
    Tensors expected("step" + std::to_string(step));
    Tensors got("none");
    for (auto& t : got.all) std::fill(t.bytes.begin(), t.bytes.end(), 0xAB);
    ShardedState targets;
    for (auto& t : got.all) ASSERT_TRUE(targets.AddTensor(t.name, t.dtype, t.shape, Layout::Whole(), t.bytes.data()).ok());
    Result<LoadReport> report = Load(*comm_, path, targets);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->step, step);
    for (size_t i = 0; i < got.all.size(); ++i) EXPECT_EQ(got.all[i].bytes, expected.all[i].bytes) << got.all[i].name;
    EXPECT_EQ(report->blobs.at("step").bytes, "1234");
    EXPECT_TRUE(report->blobs.at("rng").available);
    EXPECT_EQ(report->blobs.at("rng").bytes, "rank0-rng");
  }
  std::string root() const { return JoinPath(dir_.path(), "ckpt"); }
  std::string Latest() const { return ReadFileLimited(JoinPath(root(), kLatestName), 100).value(); }

  testing::TempDir dir_;
  std::unique_ptr<Communicator> comm_ = CreateSingleProcessCommunicator();
};

// A C++ program's plain values (AddValue: JSON text) are values in the .pt consolidate writes, as
// the Python package's are; AddBlob's bytes stay bytes, not written there. Text that is not JSON
// is refused by name.
TEST_F(CheckpointTest, PlainValuesFromCppAreValuesInTheConsolidatedFile) {
  Tensors tensors("values");
  ShardedState state = tensors.State();
  ASSERT_TRUE(state.AddValue("epoch", "20").ok());
  ASSERT_TRUE(state.AddValue("sched", "{\"lr\": 0.001, \"kind\": \"cosine\", \"milestones\": [10, 20]}").ok());
  // A raw buffer with its size: one too small for the piece is refused, naming both sizes.
  std::vector<float> ten(10);
  ShardedState sized;
  Status short_buffer = sized.AddTensor("w", DType::kFloat32, {10, 6}, ChunkLayout({10, 6}, 0, 2, 0), ten.data(),
                                        ten.size() * sizeof(float));
  EXPECT_EQ(short_buffer.code(), Code::kInvalidArgument);
  EXPECT_THAT(short_buffer.message(), HasSubstr("tensor 'w': box(offsets=[0, 0], sizes=[5, 6]) of [10, 6] is [5, 6] of "
                                                "float32, 120 bytes, but the buffer given holds 40"));
  std::vector<float> thirty(30);
  EXPECT_TRUE(ShardedState().AddTensor("w", DType::kFloat32, {10, 6}, ChunkLayout({10, 6}, 0, 2, 0), thirty.data(),
                                       thirty.size() * sizeof(float)).ok());
  Status bad = state.AddValue("name", "cosine");
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
  EXPECT_THAT(bad.message(), HasSubstr("value 'name': 'cosine' is not JSON text"));
  ShardedState good = tensors.State();
  ASSERT_TRUE(good.AddValue("epoch", "20").ok());
  ASSERT_TRUE(good.AddValue("sched", "{\"lr\": 0.001, \"kind\": \"cosine\", \"milestones\": [10, 20]}").ok());
  ASSERT_TRUE(Save(*comm_, root(), 3, good).ok());
  ShardedState none;
  LoadOptions options;
  options.strict = false;
  Result<LoadReport> loaded = Load(*comm_, root(), none, options);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ(loaded->blobs.at("epoch").bytes, std::string(kValueBlobTag, 2) + "20");
  Result<ConsolidateReport> pt = Consolidate(root(), JoinPath(dir_.path(), "model.pt"), ConsolidateOptions{});
  ASSERT_TRUE(pt.ok()) << pt.status().ToString();
  EXPECT_THAT(pt->values, ::testing::UnorderedElementsAre("epoch", "sched"));
  EXPECT_THAT(pt->skipped, ::testing::Contains(HasSubstr("step (bytes or a tensor blob, not a plain value)")));
}

// The check of a built manifest runs beside its encoding when the manifest is large: the text
// is only used when the check passes, small or large, and a failed check is the error returned.
TEST(CheckBuiltManifestWhile, TheCheckDecidesSmallOrLargeAndTheTextIsEncodedOnce) {
  for (const size_t entries : {size_t{3}, size_t{20000}}) {
    SCOPED_TRACE(entries);
    Manifest m;
    const size_t table_pages = (entries + 511) / 512;  // a block's sum is 8 bytes
    m.files.push_back(FileRecord{"rank-00000.bin", (entries + table_pages) * 4096, entries * 4096, {}});
    m.files[0].table_page_sums.assign(table_pages, 0);
    for (size_t i = 0; i < entries; ++i) {
      EntryRecord e{"t" + std::to_string(i), DType::kFloat32, {4}, {}};
      e.chunks.push_back(ChunkRecord{0, i * 4096, 16, Layout::Whole()});
      m.entries.push_back(std::move(e));
    }
    int encoded = 0;
    std::string text;
    auto encode = [&]() -> Status {
      ++encoded;
      SC_ASSIGN_OR_RETURN(text, EncodeManifest(m));
      return Status::Ok();
    };
    Status valid = CheckBuiltManifestWhile(m, encode);
    ASSERT_TRUE(valid.ok()) << valid.ToString();
    EXPECT_EQ(encoded, 1);
    EXPECT_EQ(DecodeManifest(text, "m").value().entries.size(), entries);
    m.entries.back().chunks[0].file = 7;  // a file the manifest does not list
    Status invalid = CheckBuiltManifestWhile(m, encode);
    EXPECT_EQ(invalid.code(), Code::kInternal) << invalid.ToString();
    EXPECT_THAT(invalid.message(), HasSubstr("is invalid (a bug)"));
    EXPECT_THAT(invalid.message(), HasSubstr("t" + std::to_string(entries - 1)));
    // An encoding that fails while the check passes is the encoding's error.
    m.entries.back().chunks[0].file = 0;
    Status failed = CheckBuiltManifestWhile(m, [] { return DataLoss("encoding failed"); });
    EXPECT_EQ(failed.code(), Code::kDataLoss);
  }
}

TEST_F(CheckpointTest, RoundTripsEveryDtypeScalarsAndEmptyTensors) {
  Result<SaveResult> saved = SaveStep(7);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->path, JoinPath(root(), "step-000000007"));
  EXPECT_EQ(Latest(), "step-000000007\n");
  ExpectLoads(root(), 7);
  ExpectLoads(saved->path, 7);
  Manifest m = ReadManifest(saved->path).value();
  EXPECT_EQ(m.world_size, 1);
  EXPECT_EQ(m.entries.size(), 12u);
  for (const EntryRecord& e : m.entries) {
    // Packed (format 1.1): every chunk here is small, at a multiple of its element size.
    for (const ChunkRecord& c : e.chunks) EXPECT_EQ(c.offset % DTypeSize(e.dtype), 0u) << e.name;
  }
  EXPECT_EQ(m.format_minor, 1);
  SaveOptions unpacked;
  unpacked.pack_small_chunks = false;
  ASSERT_TRUE(SaveStep(8, unpacked).ok());
  ExpectLoads(root(), 8);
  Manifest old = ReadManifest(JoinPath(root(), StepDirName(8))).value();
  EXPECT_EQ(old.format_minor, 0);  // what older shardckpt reads
  for (const EntryRecord& e : old.entries) {
    for (const ChunkRecord& c : e.chunks) EXPECT_EQ(c.offset % 4096, 0u) << e.name;
  }
}

// Runs in every build: without CUDA (or without a device) a piece that claims device memory is
// refused by name, on save and on load, and is never read as host memory.
TEST_F(CheckpointTest, DevicePiecesWithoutADeviceAreRefusedByName) {
  if (CudaDevicePresent()) GTEST_SKIP() << "a CUDA device is present; cuda_test covers this path";
  std::vector<float> host(64, 1.0f);
  ShardedState state;
  ASSERT_TRUE(state.AddDeviceTensor("layer.weight", DType::kFloat32, {64}, Layout::Whole(), host.data(), 0).ok());
  Result<SaveResult> saved = Save(*comm_, root(), 1, state);
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(saved.status().ToString(), HasSubstr("tensor 'layer.weight'"));
  EXPECT_THAT(saved.status().ToString(), HasSubstr("CUDA device 0"));
  EXPECT_FALSE(FileSize(JoinPath(root(), kLatestName)).ok());
  ASSERT_TRUE(SaveStep(2).ok());
  ShardedState targets;
  ASSERT_TRUE(targets.AddDeviceTensor("model.float32", DType::kFloat32, {64, 33}, Layout::Whole(), host.data(), 0).ok());
  LoadOptions options;
  options.strict = false;
  Result<LoadReport> loaded = Load(*comm_, root(), targets, options);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().ToString(), HasSubstr("tensor 'model.float32'"));
  EXPECT_THAT(loaded.status().ToString(), HasSubstr("CUDA device 0"));
  EXPECT_EQ(host[0], 1.0f);
}

// In one process (so ThreadSanitizer sees every thread): the snapshot is taken before Save
// returns, staging is reused, a background failure surfaces from its handle, and the next save
// after it succeeds.
TEST_F(CheckpointTest, AsyncSaveSnapshotsReusesStagingAndReportsBackgroundErrors) {
  auto saver = AsyncSaver::Create(*comm_);
  ASSERT_TRUE(saver.ok()) << saver.status().ToString();
  Tensors live("step1");
  ShardedState state = live.State();
  auto first = (*saver)->Save(root(), 1, state);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  for (auto& t : live.all) std::fill(t.bytes.begin(), t.bytes.end(), 0x77);  // training goes on
  ASSERT_TRUE((*first)->Wait().ok());
  ExpectLoads(root(), 1);
  // The staging area and the persist's ring, each buffer counted.
  EXPECT_EQ((*saver)->staging_allocations(), 1u + SaveOptions{}.staging_buffers);

  // From here on not one page-aligned buffer is allocated, by the saver or by the save it runs,
  // whether the persist fails or not (counted process-wide, loads left out).
  Tensors second("step2");
  ASSERT_TRUE(SetFailpoints("io.write=EIO").ok());
  ShardedState failing = second.State();
  uint64_t allocations = HostBufferAllocations();
  auto broken = (*saver)->Save(root(), 2, failing);
  ASSERT_TRUE(broken.ok());
  Status failed = (*broken)->Wait();
  EXPECT_EQ(failed.code(), Code::kIoError);
  EXPECT_THAT(failed.ToString(), HasSubstr("injected at failpoint io.write"));
  ASSERT_TRUE(SetFailpoints("").ok());
  ShardedState retry = second.State();
  auto third = (*saver)->Save(root(), 2, retry);
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE((*third)->Wait().ok());
  EXPECT_EQ(HostBufferAllocations() - allocations, 0u) << "later saves allocated staging memory";
  ExpectLoads(root(), 2);
  EXPECT_EQ((*saver)->staging_allocations(), 1u + SaveOptions{}.staging_buffers);
}

// An async save holds its root from the call: a save into the root while its persist is in
// flight is the one refused, whatever the threads' timing (the async one could be the loser);
// and a relative root means the folder it named at the call, not after a chdir.
TEST_F(CheckpointTest, AnAsyncSaveHoldsItsRootFromTheCallAndKeepsItsFolderAcrossAChdir) {
  auto saver = AsyncSaver::Create(*comm_);
  ASSERT_TRUE(saver.ok()) << saver.status().ToString();
  Tensors live("step1");
  ShardedState state = live.State();
  // The persist is held back before it takes the lock: the sync save comes first to the lock.
  ASSERT_TRUE(SetFailpoints("async.persist_start=sleep:300").ok());
  auto first = (*saver)->Save(root(), 1, state);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  Result<SaveResult> second = Save(*comm_, root(), 2, state);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(second.status().message(), HasSubstr("an async save's persist in flight in this process is writing into"));
  // Another saver's async save into the root (a second communicator) is refused as it starts.
  auto second_saver = AsyncSaver::Create(*comm_);
  ASSERT_TRUE(second_saver.ok());
  auto racing = (*second_saver)->Save(root(), 5, state);
  ASSERT_FALSE(racing.ok());
  EXPECT_THAT(racing.status().message(), HasSubstr("an async save's persist in flight in this process is writing into"));
  ASSERT_TRUE((*first)->Wait().ok());
  ASSERT_TRUE(SetFailpoints("").ok());
  ExpectLoads(root(), 1);
  ASSERT_TRUE(Save(*comm_, root(), 2, state).ok());  // free again once the persist ended

  // A relative root, then a chdir before the persist runs.
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  const std::string parent = DirName(root()), other = JoinPath(parent, "elsewhere");
  ASSERT_TRUE(MakeDirs(other).ok());
  ASSERT_EQ(::chdir(parent.c_str()), 0);
  ASSERT_TRUE(SetFailpoints("async.persist_start=sleep:200").ok());
  auto relative = (*saver)->Save(BaseName(root()), 3, state);
  ASSERT_TRUE(relative.ok()) << relative.status().ToString();
  ASSERT_EQ(::chdir(other.c_str()), 0);
  Status persisted = (*relative)->Wait();
  ASSERT_TRUE(SetFailpoints("").ok());
  ASSERT_EQ(::chdir(cwd), 0);
  ASSERT_TRUE(persisted.ok()) << persisted.ToString();
  EXPECT_TRUE(PathExists(JoinPath(root(), StepDirName(3))));
  EXPECT_FALSE(PathExists(JoinPath(other, BaseName(root()))));
}

// The consolidator's prefetch thread reads ahead while the writer writes. Each export, parsed
// with the repository's own readers, holds exactly the saved tensors: every name once, its dtype,
// shape and layout, and its bytes at the offset its header gives.
TEST_F(CheckpointTest, ConsolidateWithPrefetchMatchesTheCheckpoint) {
  ASSERT_TRUE(SaveStep(3).ok());
  Tensors expected("step3");
  for (ExportFormat format : {ExportFormat::kTorch, ExportFormat::kSafetensors}) {
    const bool torch = format == ExportFormat::kTorch;
    const std::string out = JoinPath(dir_.path(), torch ? "model.pt" : "model.safetensors");
    SCOPED_TRACE(out);
    ConsolidateOptions options;
    options.format = format;
    options.window_bytes = 4096;  // many windows, so the prefetch thread and writer interleave
    Result<ConsolidateReport> report = Consolidate(root(), out, options);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->entries, expected.all.size());
    // name -> (dtype, shape, bytes) as the export stores them.
    std::map<std::string, std::tuple<DType, Shape, std::string>> got;
    if (torch) {
      ZipReader zip = ZipReader::Open(out).value();
      UnpickledStateDict dict = UnpickleStateDict(zip.ReadRecord(zip.prefix() + "data.pkl", 1 << 20).value()).value();
      EXPECT_TRUE(dict.skipped.empty());
      for (const PickleTensor& t : dict.tensors) {
        const std::string key = zip.prefix() + "data/" + t.storage_key;
        ASSERT_EQ(zip.records().count(key), 1u) << t.name;
        EXPECT_EQ(zip.records().at(key).data_offset % 64, 0u) << t.name << ": record not aligned for mmap";
        EXPECT_EQ(t.storage_offset, 0) << t.name;
        std::vector<int64_t> contiguous(t.sizes.size());
        for (size_t d = t.sizes.size(), stride = 1; d-- > 0; stride *= static_cast<size_t>(t.sizes[d])) {
          contiguous[d] = static_cast<int64_t>(stride);
        }
        EXPECT_EQ(t.strides, contiguous) << t.name;
        EXPECT_EQ(t.storage_numel, NumElements(t.sizes).value()) << t.name;
        EXPECT_TRUE(got.emplace(t.name, std::make_tuple(t.dtype, t.sizes, zip.ReadRecord(key, 1 << 24).value())).second)
            << t.name << " twice";
      }
    } else {
      std::string file = ReadFileLimited(out, 1 << 24).value();
      ASSERT_GE(file.size(), 8u);
      uint64_t n;
      std::memcpy(&n, file.data(), 8);
      ASSERT_LE(8 + n, file.size());
      const uint64_t data = 8 + n;
      auto entries = ParseSafetensorsHeader(file.substr(8, n), file.size() - data, out);
      ASSERT_TRUE(entries.ok()) << entries.status().ToString();
      for (const SafetensorsEntry& e : *entries) {
        EXPECT_TRUE(got.emplace(e.name, std::make_tuple(e.dtype, e.shape, file.substr(data + e.begin, e.end - e.begin))).second)
            << e.name << " twice";
      }
    }
    ASSERT_EQ(got.size(), expected.all.size());
    for (const auto& t : expected.all) {
      auto it = got.find(t.name);
      ASSERT_NE(it, got.end()) << t.name << " missing from the export";
      auto& [dtype, shape, bytes] = it->second;
      EXPECT_EQ(dtype, t.dtype) << t.name;
      EXPECT_EQ(shape, t.shape) << t.name;
      EXPECT_TRUE(bytes == std::string(t.bytes.begin(), t.bytes.end())) << t.name << ": bytes differ";
    }
  }
}

// Where io_uring and O_DIRECT work here (probed without the engine), every transfer since
// `before` ran on them: a save or load that fell back to pread/pwrite or to buffered I/O fails.
void ExpectOnlyUringDirectSince(const IoUsage& before, const std::string& dir) {
  std::string why;
  if (!testing::FastPathAvailable(dir, &why)) {
    std::cout << "fast path not checked: " << why << "\n";
    return;
  }
  const IoUsage after = ProcessIoUsage();
  EXPECT_GT(after.uring_direct, before.uring_direct) << "nothing ran on io_uring with O_DIRECT";
  EXPECT_EQ(after.uring_buffered, before.uring_buffered) << "buffered I/O although O_DIRECT works";
  EXPECT_EQ(after.posix_direct, before.posix_direct) << "pread/pwrite although io_uring works";
  EXPECT_EQ(after.posix_buffered, before.posix_buffered) << "pread/pwrite, buffered, although both work";
}

TEST_F(CheckpointTest, StagedAndDirectWritesProduceTheSameBytes) {
  const IoUsage before = ProcessIoUsage();
  SaveOptions staged;
  staged.always_stage = true;
  staged.staging_buffer_bytes = 4096;  // many small buffers: exercises ring wrap-around
  staged.staging_buffers = 3;
  ASSERT_TRUE(SaveStep(1, staged).ok());
  ExpectLoads(root(), 1);
  ExpectOnlyUringDirectSince(before, dir_.path());
}

// The main path is the one that runs: sync save, async save and load.
TEST_F(CheckpointTest, SavesAndLoadsRunOnIoUringWithODirectWhereBothWork) {
  std::string why;
  if (!testing::FastPathAvailable(dir_.path(), &why)) GTEST_SKIP() << why;
  const IoUsage before = ProcessIoUsage();
  ASSERT_TRUE(SaveStep(1).ok());
  ExpectLoads(root(), 1);
  Tensors tensors("step2");
  ShardedState state = tensors.State();
  Result<std::unique_ptr<AsyncSaver>> saver = AsyncSaver::Create(*comm_);
  Result<std::shared_ptr<SaveHandle>> handle = saver.ok() ? (*saver)->Save(root(), 2, state) : saver.status();
  Status saved = handle.ok() ? (*handle)->Wait() : handle.status();
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  ExpectLoads(root(), 2);
  ExpectOnlyUringDirectSince(before, dir_.path());
}

// On tmpfs the writer skips O_DIRECT and writes unaligned tensors straight from their memory;
// the data file must be byte for byte the one the staged path writes on any other file system.
TEST_F(CheckpointTest, MemoryBackedFileSystemWritesTheSameBytes) {
  struct statfs fs;
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) GTEST_SKIP() << "no tmpfs at /dev/shm";
  SaveOptions small;
  small.staging_buffer_bytes = 4096;  // every tensor of a block or more takes the direct path
  ASSERT_TRUE(SaveStep(1, small).ok());
  const std::string shm = "/dev/shm/shardckpt-test-" + std::to_string(::getpid());
  ASSERT_TRUE(RemoveTree(shm).ok());
  Tensors tensors("step1");
  Result<SaveResult> saved = Save(*comm_, shm, 1, tensors.State(), small);
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  const std::string name = std::string("step-000000001/") + RankFileName(0);
  std::string on_disk = ReadFileLimited(JoinPath(root(), name), 1 << 24).value();
  std::string in_memory = ReadFileLimited(JoinPath(shm, name), 1 << 24).value();
  EXPECT_TRUE(on_disk == in_memory) << "data files differ (" << on_disk.size() << " vs " << in_memory.size() << " bytes)";
  ExpectLoads(shm, 1);
  // Reads there go straight into any target, aligned or not.
  const Tensors::T& big = tensors.all[1];
  std::vector<uint8_t> unaligned(big.bytes.size() + 1);
  ShardedState want;
  ASSERT_TRUE(want.AddTensor(big.name, big.dtype, big.shape, Layout::Whole(), unaligned.data() + 1).ok());
  LoadOptions options;
  options.strict = false;
  options.plan.max_extent = 4096;
  Result<LoadReport> report = Load(*comm_, shm, want, options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  // The blocks wholly inside the (packed) chunk are read in place; the partial ones are staged.
  Manifest m = ReadManifest(JoinPath(shm, "step-000000001")).value();
  ChunkRecord chunk;
  for (const EntryRecord& e : m.entries) {
    if (e.name == big.name) chunk = e.chunks[0];
  }
  ASSERT_EQ(chunk.bytes, big.bytes.size());
  EXPECT_EQ(report->stats.bytes_read_in_place,
            AlignDown(chunk.offset + chunk.bytes, kBlockSize) - AlignUp(chunk.offset, kBlockSize));
  EXPECT_TRUE(std::equal(big.bytes.begin(), big.bytes.end(), unaligned.begin() + 1));
  ASSERT_TRUE(RemoveTree(shm).ok());
}

// From tmpfs a load cuts its reads at ReadPlanOptions::memory_backed_max_extent, so each is
// verified while still in the CPU's cache; 0 keeps max_extent, and so does a load that does not
// verify, or one from storage.
TEST_F(CheckpointTest, ALoadFromTmpfsCutsItsReadsForTheCache) {
  struct statfs fs;
  if (::statfs("/dev/shm", &fs) != 0 || fs.f_type != TMPFS_MAGIC) GTEST_SKIP() << "no tmpfs at /dev/shm";
  const std::string shm = "/dev/shm/shardckpt-test-cut-" + std::to_string(::getpid());
  ASSERT_TRUE(RemoveTree(shm).ok());
  const Shape shape = {256, 1024};  // 1 MiB of float32
  std::vector<uint8_t> saved_bytes = testing::PieceBytes("cut", DType::kFloat32, shape, Layout::Whole());
  ShardedState state;
  ASSERT_TRUE(state.AddTensor("w", DType::kFloat32, shape, Layout::Whole(), saved_bytes.data()).ok());
  ASSERT_TRUE(Save(*comm_, shm, 1, state, SaveOptions{}).ok());
  auto extents = [&](const std::string& root, uint64_t cut, bool verify) -> uint64_t {
    std::vector<uint8_t> loaded(saved_bytes.size(), 0);
    ShardedState want;
    EXPECT_TRUE(want.AddTensor("w", DType::kFloat32, shape, Layout::Whole(), loaded.data()).ok());
    LoadOptions options;
    options.plan.memory_backed_max_extent = cut;
    options.verify_checksums = verify;
    Result<LoadReport> report = Load(*comm_, root, want, options);
    EXPECT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_TRUE(loaded == saved_bytes) << root << " " << cut;
    return report.ok() ? report->stats.extents : 0;
  };
  for (uint64_t cut : {ReadPlanOptions{}.memory_backed_max_extent, uint64_t{256} << 10, uint64_t{0}}) {
    EXPECT_EQ(extents(shm, cut, true), cut == 0 ? 1u : (1u << 20) / cut) << cut;
  }
  EXPECT_EQ(extents(shm, 128u << 10, false), 1u);
  ASSERT_TRUE(RemoveTree(shm).ok());
  // The test's own folder, where it is on storage (CI's may be tmpfs too).
  ASSERT_TRUE(Save(*comm_, root(), 1, state, SaveOptions{}).ok());
  if (!IsMemoryBacked(JoinPath(root(), "latest"))) {
    EXPECT_EQ(extents(root(), 128u << 10, true), 1u);
  }
}

TEST_F(CheckpointTest, AFailureAtEachCommitStepKeepsThePreviousCheckpoint) {
  const char* steps[] = {"save.write_data",       "io.write",            "io.fsync",
                         "commit.manifest.write", "commit.manifest.fsync", "commit.sync_tmp",
                         "commit.rename_dir",     "commit.sync_root",    "commit.latest.write",
                         "commit.latest.fsync",   "commit.latest.rename"};
  ASSERT_TRUE(SaveStep(1).ok());
  int64_t step = 2;
  for (const char* failpoint : steps) {
    ASSERT_TRUE(SetFailpoints(std::string(failpoint) + "=EIO").ok());
    Result<SaveResult> failed = SaveStep(step);
    ASSERT_FALSE(failed.ok()) << failpoint;
    EXPECT_THAT(failed.status().message(), HasSubstr(std::string("failpoint ") + failpoint));
    EXPECT_EQ(Latest(), "step-000000001\n") << failpoint;
    EXPECT_FALSE(PathExists(JoinPath(root(), StepDirName(step)))) << failpoint;
    for (const std::string& name : ListDir(root()).value()) {
      EXPECT_FALSE(IsTempDirName(name)) << failpoint << " left " << name;
      EXPECT_NE(name, std::string(kLatestName) + ".tmp") << failpoint << " left it";
    }
    ExpectLoads(root(), 1);
    // The root works again once the failure is gone.
    ASSERT_TRUE(SetFailpoints("").ok());
    ASSERT_TRUE(SaveStep(step).ok()) << failpoint;
    ExpectLoads(root(), step);
    ASSERT_TRUE(RemoveTree(JoinPath(root(), StepDirName(step))).ok());
    ASSERT_TRUE(WriteFileAtomic(JoinPath(root(), kLatestName), "step-000000001\n", "test").ok());
    ++step;
  }
}

TEST_F(CheckpointTest, FailureAfterLatestIsPublishedIsASuccessfulSave) {
  ASSERT_TRUE(SaveStep(1).ok());
  ASSERT_TRUE(SetFailpoints("commit.latest.sync_dir=EIO").ok());
  Result<SaveResult> saved = SaveStep(2);
  // `latest` was renamed before the directory fsync failed: the checkpoint is published, so the
  // save succeeded (a caller that retried would only be told it exists); the failure is a warning.
  ASSERT_TRUE(saved.ok()) << saved.status().ToString();
  EXPECT_EQ(saved->path, JoinPath(root(), StepDirName(2)));
  EXPECT_EQ(Latest(), "step-000000002\n");
  ExpectLoads(root(), 2);
}

TEST_F(CheckpointTest, RetentionKeepsTheLastK) {
  SaveOptions options;
  options.keep_last = 2;
  for (int64_t step = 1; step <= 4; ++step) ASSERT_TRUE(SaveStep(step * 10, options).ok());
  auto committed = ListCommitted(root()).value();
  ASSERT_EQ(committed.size(), 2u);
  EXPECT_EQ(committed[0].first, 30);
  EXPECT_EQ(committed[1].first, 40);
  ExpectLoads(JoinPath(root(), StepDirName(30)), 30);
}

TEST_F(CheckpointTest, RefusesToOverwriteACommittedStep) {
  ASSERT_TRUE(SaveStep(5).ok());
  Result<SaveResult> again = SaveStep(5);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), Code::kAlreadyExists);
  EXPECT_THAT(again.status().message(), HasSubstr("step 5 is already committed"));
}

// A piece the state refused (bad ChunkLayout arguments here) with its Status left unchecked, as
// an example that discards Statuses would: the save and the load refuse the state, naming the
// tensor and the reason, rather than saving or loading everything but that tensor.
TEST_F(CheckpointTest, AStateThatRefusedAPieceIsNeitherSavedNorLoaded) {
  std::vector<float> a(64, 1.0f), b(64, 2.0f);
  ShardedState state;
  ASSERT_TRUE(state.AddTensor("model.a", DType::kFloat32, {8, 8}, ChunkLayout({8, 8}, 0, 1, 0), a.data()).ok());
  Status refused = state.AddTensor("model.tp", DType::kFloat32, {8, 8}, ChunkLayout({8, 8}, 2, 1, 0), b.data());
  EXPECT_THAT(refused.message(), HasSubstr("tensor 'model.tp': ChunkLayout: chunk dim 2 is outside shape [8, 8]"));
  EXPECT_TRUE(state.AddTensor("model.c", DType::kFloat32, {8, 8}, Layout::Whole(), b.data()).ok());  // later ones still add
  // Layouts made first and added later: each refusal names its own reason.
  const Layout bad_index = FlatShardLayout({8, 8}, 2, 3), bad_parts = ChunkLayout({8, 8}, 0, 0, 0);
  const std::string index_why = state.AddTensor("model.f", DType::kFloat32, {8, 8}, bad_index, b.data()).message();
  EXPECT_THAT(index_why, HasSubstr("tensor 'model.f': FlatShardLayout: "));
  EXPECT_THAT(index_why, Not(HasSubstr("ChunkLayout")));
  EXPECT_THAT(state.AddTensor("model.g", DType::kFloat32, {8, 8}, bad_parts, b.data()).message(),
              HasSubstr("tensor 'model.g': ChunkLayout: "));
  // A flat range of the caller's own is judged as one.
  EXPECT_THAT(state.AddTensor("model.h", DType::kFloat32, {8, 8}, Layout::FlatRange(-1, -1), b.data()).message(),
              HasSubstr("flat[-1, -1)"));
  const std::string why = "tensor 'model.tp': ChunkLayout: chunk dim 2 is outside shape [8, 8] (refused when it was added";
  Result<SaveResult> saved = Save(*comm_, root(), 1, state);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(saved.status().message(), HasSubstr("save of step 1 failed"));
  EXPECT_THAT(saved.status().message(), HasSubstr(why));  // the first refusal
  EXPECT_FALSE(PathExists(root()));
  auto saver = AsyncSaver::Create(*comm_);
  ASSERT_TRUE(saver.ok());
  Result<std::shared_ptr<SaveHandle>> started = (*saver)->Save(root(), 1, state);
  ASSERT_FALSE(started.ok());
  EXPECT_THAT(started.status().message(), HasSubstr(why));
  EXPECT_FALSE(PathExists(root()));

  ASSERT_TRUE(SaveStep(1).ok());
  Tensors got("none");
  ShardedState targets;
  for (auto& t : got.all) ASSERT_TRUE(targets.AddTensor(t.name, t.dtype, t.shape, Layout::Whole(), t.bytes.data()).ok());
  EXPECT_FALSE(targets.AddTensor("", DType::kFloat32, {1}, Layout::Whole(), b.data()).ok());
  Result<LoadReport> loaded = Load(*comm_, root(), targets);
  ASSERT_FALSE(loaded.ok());
  EXPECT_THAT(loaded.status().message(), HasSubstr("a tensor needs a name (refused when it was added"));
  targets.Clear();
  EXPECT_TRUE(targets.CheckNothingRefused().ok());
}

// Every step Save takes is a folder the listing reads back, up to INT64_MAX: the name parser
// refused the last eight values, so such a save committed a folder that loads, lists and prunes
// never saw (a root then loaded an older step without a word).
TEST_F(CheckpointTest, TheLargestStepsAreListedAndLoaded) {
  ASSERT_TRUE(SaveStep(5).ok());
  for (int64_t step : {INT64_MAX - 8, INT64_MAX - 7, INT64_MAX}) {
    ASSERT_TRUE(SaveStep(step).ok()) << step;
    int64_t parsed = -1;
    EXPECT_TRUE(ParseStepDirName(StepDirName(step), &parsed)) << step;
    EXPECT_EQ(parsed, step);
    ExpectLoads(root(), step);
    EXPECT_EQ(ListCommitted(root()).value().back().first, step);
  }
  int64_t parsed = -1;
  EXPECT_FALSE(ParseStepDirName("step-9223372036854775808", &parsed));  // INT64_MAX + 1
  EXPECT_FALSE(ParseStepDirName("step-99999999999999999999", &parsed));
}

// Loading a root reads its newest checkpoint: an earlier step saved beside it would be hidden,
// with `latest` naming it. Refused before anything is written; the later checkpoint stays newest.
TEST_F(CheckpointTest, RefusesAStepEarlierThanTheNewest) {
  ASSERT_TRUE(SaveStep(50).ok());
  Result<SaveResult> earlier = SaveStep(45);
  ASSERT_FALSE(earlier.ok());
  EXPECT_EQ(earlier.status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(earlier.status().message(),
              HasSubstr("step 45 is earlier than step-000000050, the newest checkpoint in " + root()));
  EXPECT_FALSE(PathExists(JoinPath(root(), StepDirName(45))));
  EXPECT_EQ(ReadLatestName(root()), StepDirName(50));
  ExpectLoads(root(), 50);
  ASSERT_TRUE(SaveStep(51).ok());
}

// A reshard is a new checkpoint, written now by this shardckpt: it carried its source's creation
// time (and a DCP folder's import an empty time and version), which list and inspect showed.
TEST_F(CheckpointTest, AReshardRecordsItsOwnMaking) {
  ASSERT_TRUE(SaveStep(1).ok());
  const std::string source = JoinPath(root(), StepDirName(1));
  Manifest m = ReadManifest(source).value();
  m.created.time = "2001-02-03T04:05:06Z";
  m.created.shardckpt_version = "";
  m.created.torch_version = "2.15.0";
  m.created.git_commit = "abc123";
  ASSERT_TRUE(WriteFileAtomic(JoinPath(source, kManifestName), *EncodeManifest(m), "test").ok());
  ConvertOptions two;
  two.world_size = 2;
  const std::string out = JoinPath(dir_.path(), "resharded");
  ASSERT_TRUE(Reshard(source, out, two).ok());
  const Manifest made = ReadManifest(JoinPath(out, StepDirName(1))).value();
  EXPECT_NE(made.created.time, "2001-02-03T04:05:06Z");
  EXPECT_EQ(made.created.time.size(), 20u) << made.created.time;
  EXPECT_EQ(made.created.shardckpt_version, kVersion);
  EXPECT_EQ(made.created.torch_version, "2.15.0");
  EXPECT_EQ(made.created.git_commit, "abc123");
  EXPECT_EQ(made.created.user.at("resharded_from"), source);
}

// Import and reshard write into a new root: a reshard of another run's step 5 into this root
// (which holds step 1) was committed beside it and became its `latest`, so the run's next
// resume loaded the other run's state. Refused before anything is written, naming the root.
TEST_F(CheckpointTest, ImportAndReshardRefuseARootThatHoldsCheckpoints) {
  ASSERT_TRUE(SaveStep(1).ok());
  const std::string other = JoinPath(dir_.path(), "other");
  Tensors tensors("other");
  ASSERT_TRUE(Save(*comm_, other, 5, tensors.State()).ok());
  ConsolidateOptions pt;
  pt.format = ExportFormat::kTorch;
  const std::string file = JoinPath(dir_.path(), "other.pt");
  ASSERT_TRUE(Consolidate(other, file, pt).ok());
  const std::vector<std::string> before = ListDir(root()).value();
  ConvertOptions two;
  two.world_size = 2;
  for (bool import : {false, true}) {
    SCOPED_TRACE(import ? "import" : "reshard");
    Result<ConvertReport> into = import ? ImportFile(file, root(), two) : Reshard(other, root(), two);
    ASSERT_FALSE(into.ok());
    EXPECT_EQ(into.status().code(), Code::kAlreadyExists);
    EXPECT_THAT(into.status().message(),
                HasSubstr(root() + " already holds checkpoints (latest: " + StepDirName(1) +
                          "): import and reshard write each into a new root; give an --out root (Python: out_root) "
                          "that holds no checkpoint"));
    EXPECT_EQ(ListDir(root()).value(), before);
    EXPECT_EQ(ReadLatestName(root()), StepDirName(1));
  }
  // A folder holding other files (no checkpoint) is a new root.
  const std::string empty = JoinPath(dir_.path(), "empty");
  ASSERT_TRUE(MakeDirs(empty).ok());
  std::ofstream(JoinPath(empty, "notes.txt")) << "mine";
  ASSERT_TRUE(Reshard(other, empty, two).ok());
  EXPECT_EQ(ReadLatestName(empty), StepDirName(5));
}

// A checkpoint folder given for a root: saving there nested new checkpoints inside it, which
// loading it never reads (it has a manifest), and retention of the real root would delete them.
// Refused before anything is written into it, by saves, reshards and imports alike; and a
// consolidation never writes into the checkpoint it reads.
TEST_F(CheckpointTest, ACheckpointFolderIsNeitherARootNorAnOutputFolder) {
  ASSERT_TRUE(SaveStep(1).ok());
  const std::string folder = JoinPath(root(), StepDirName(1));
  const std::vector<std::string> before = ListDir(folder).value();
  const std::string refused = folder + " is a checkpoint, not a root";
  Tensors tensors("step2");
  Result<SaveResult> saved = Save(*comm_, folder, 2, tensors.State());
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(saved.status().message(), HasSubstr(refused + ": write checkpoints into the folder that holds its step folders"));
  ConvertOptions two;
  two.world_size = 2;
  Result<ConvertReport> resharded = Reshard(root(), folder, two);
  ASSERT_FALSE(resharded.ok());
  EXPECT_THAT(resharded.status().message(), HasSubstr(refused));
  EXPECT_THAT(CheckNoLaterStep(folder, 3).message(), HasSubstr(refused));
  for (const std::string& out : {JoinPath(folder, RankFileName(0)), JoinPath(folder, "model.pt"),
                                 JoinPath(root(), "./" + StepDirName(1) + "/sub/model.safetensors")}) {
    ConsolidateOptions options;
    options.format = out.size() > 3 && out.substr(out.size() - 3) == ".pt" ? ExportFormat::kTorch : ExportFormat::kSafetensors;
    Result<ConsolidateReport> written = Consolidate(root(), out, options);
    ASSERT_FALSE(written.ok()) << out;
    EXPECT_THAT(written.status().message(), HasSubstr(out + " lies inside the checkpoint " + folder)) << out;
  }
  EXPECT_EQ(ListDir(folder).value(), before);
  ExpectLoads(root(), 1);
  // Beside the checkpoint, in its root, is fine.
  ConsolidateOptions pt;
  pt.format = ExportFormat::kTorch;
  ASSERT_TRUE(Consolidate(root(), JoinPath(root(), StepDirName(1) + ".pt"), pt).ok());
  // Nor into another checkpoint of the root, nor over its `latest`: reading step 2, the output
  // replaced step 1's manifest (step 1 no longer loaded) or turned `latest` into a .pt.
  ASSERT_TRUE(SaveStep(2).ok());
  const std::string step2 = JoinPath(root(), StepDirName(2));
  for (const std::string& out : {JoinPath(folder, kManifestName), JoinPath(folder, "sub/model.pt")}) {
    Result<ConsolidateReport> written = Consolidate(step2, out, pt);
    ASSERT_FALSE(written.ok()) << out;
    EXPECT_EQ(written.status().code(), Code::kInvalidArgument);
    EXPECT_THAT(written.status().message(), HasSubstr(out + " lies inside the checkpoint " + folder)) << out;
  }
  // Through '..', and into a step folder that is a link into an archive (its target's name is
  // no step folder's): found along the path as spelled.
  const std::string dotted = JoinPath(step2, "../" + StepDirName(1) + "/m2.pt");
  EXPECT_THAT(Consolidate(step2, dotted, pt).status().message(), HasSubstr(dotted + " lies inside the checkpoint " + folder));
  const std::string archived = JoinPath(dir_.path(), "archive-run1");
  ASSERT_EQ(::rename(folder.c_str(), archived.c_str()), 0);
  ASSERT_EQ(::symlink(archived.c_str(), folder.c_str()), 0);
  const std::string linked = JoinPath(folder, "model.pt");
  EXPECT_THAT(Consolidate(step2, linked, pt).status().message(), HasSubstr(linked + " lies inside the checkpoint " + folder));
  EXPECT_EQ(ListDir(archived).value(), before);
  // A folder holding some other manifest.json (a web app's) is no checkpoint.
  const std::string app = JoinPath(dir_.path(), "webapp");
  ASSERT_TRUE(MakeDirs(JoinPath(app, "models")).ok());
  ASSERT_TRUE(WriteFileAtomic(JoinPath(app, kManifestName), "{\"name\": \"my app\"}", "test").ok());
  EXPECT_TRUE(Consolidate(step2, JoinPath(app, "models/model.pt"), pt).ok());
  // Nor under a name the root's saves write (not committed yet): prune and the next save took
  // it for a dead save's leftover and deleted it.
  for (const std::string& out : {JoinPath(root(), StepDirName(100) + "/model.pt"), JoinPath(root(), StepDirName(9))}) {
    Result<ConsolidateReport> written = Consolidate(step2, out, pt);
    ASSERT_FALSE(written.ok()) << out;
    EXPECT_THAT(written.status().message(), HasSubstr(", named as the checkpoint folders of the root " + root() +
                                                      " are: its next save or prune would delete it")) << out;
    EXPECT_FALSE(PathExists(out)) << out;
  }
  Result<ConsolidateReport> over_latest = Consolidate(step2, JoinPath(root(), kLatestName), pt);
  ASSERT_FALSE(over_latest.ok());
  EXPECT_THAT(over_latest.status().message(),
              HasSubstr(JoinPath(root(), kLatestName) + " would replace the `latest` of the root " + root()));
  const std::string latest_tmp = JoinPath(root(), std::string(kLatestName) + ".tmp");  // a commit's own
  EXPECT_THAT(Consolidate(step2, latest_tmp, pt).status().message(),
              HasSubstr(latest_tmp + " would replace the `latest` of the root " + root()));
  // Nor a root that a save, import or reshard makes inside a checkpoint, or as a name the root's
  // saves write: the next retention of root() deleted it with the step folder.
  const std::string inside = JoinPath(step2, "rs"), named = JoinPath(root(), StepDirName(50));
  for (const std::string& out : {inside, named}) {
    SCOPED_TRACE(out);
    const std::string why = out == inside ? out + " lies inside the checkpoint " + step2
                                          : ", named as the checkpoint folders of the root " + root();
    ConvertOptions three;
    three.world_size = 3;
    EXPECT_THAT(Reshard(step2, out, three).status().message(), HasSubstr(why));
    EXPECT_THAT(ImportFile(JoinPath(root(), StepDirName(1) + ".pt"), out, three).status().message(), HasSubstr(why));
    Tensors again("again");
    Result<SaveResult> into = Save(*comm_, out, 3, again.State());
    ASSERT_FALSE(into.ok());
    EXPECT_EQ(into.status().code(), Code::kInvalidArgument);
    EXPECT_THAT(into.status().message(), HasSubstr(why));
    EXPECT_FALSE(PathExists(out));
  }
  EXPECT_EQ(ListDir(folder).value(), before);
  ExpectLoads(root(), 2);
  ExpectLoads(folder, 1);
}

// Metric names and user metadata are text: a NUL in them was committed, then cut short by list,
// inspect and keep-best's --metric.
TEST_F(CheckpointTest, ANulInAMetricNameOrUserMetadataIsRefusedBeforeWriting) {
  for (int which = 0; which < 3; ++which) {
    SaveOptions options;
    if (which == 0) options.metrics[std::string("lo\0ss", 5)] = 1.0;
    if (which == 1) options.user_metadata[std::string("k\0ey", 5)] = "v";
    if (which == 2) options.user_metadata["key"] = std::string("v\0al", 5);
    Result<SaveResult> saved = SaveStep(1, options);
    ASSERT_FALSE(saved.ok()) << which;
    EXPECT_EQ(saved.status().code(), Code::kInvalidArgument) << which;
    EXPECT_THAT(saved.status().message(), HasSubstr("NUL byte")) << which;
    EXPECT_FALSE(PathExists(JoinPath(root(), StepDirName(1)))) << which;
  }
}

// A NUL in a tensor's or value's name: refused naming it whole (in a state of thousands of
// names, "a tensor's name has a NUL byte" left the user to search).
TEST(ShardedStateNames, ANulInANameIsRefusedNamingIt) {
  float data[2] = {};
  ShardedState tensors;
  Status refused = tensors.AddTensor(std::string("model.emb\0ed", 12), DType::kFloat32, {2}, Layout::Whole(), data);
  EXPECT_EQ(refused.code(), Code::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("tensor 'model.emb\\0ed': its name has a NUL byte in it"));
  ShardedState values;
  refused = values.AddBlob(std::string("rng\0x", 5), "bytes", BlobScope::kGlobal);
  EXPECT_THAT(refused.message(), HasSubstr("value 'rng\\0x': its name has a NUL byte in it"));
}

// An empty path (an unset variable): refused before anything is made in the working directory.
TEST_F(CheckpointTest, AnEmptyRootOrPathIsRefusedBeforeAnythingIsMade) {
  Tensors tensors("empty");
  Result<SaveResult> saved = Save(*comm_, "", 1, tensors.State());
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(saved.status().message(), HasSubstr("the checkpoint root is an empty path (an unset variable?)"));
  EXPECT_FALSE(PathExists(kLockName));  // the working directory's
  Result<std::string> resolved = ResolveCheckpoint("");
  ASSERT_FALSE(resolved.ok());
  EXPECT_THAT(resolved.status().message(), HasSubstr("the checkpoint path is empty"));
}

TEST_F(CheckpointTest, SecondWriterGetsALockError) {
  ASSERT_TRUE(MakeDirs(root()).ok());
  Result<RootLock> held = RootLock::Acquire(root());
  ASSERT_TRUE(held.ok());
  // Held by this process (an async save's persist in flight): said so, with what to do.
  Result<SaveResult> saved = SaveStep(1);
  ASSERT_FALSE(saved.ok());
  EXPECT_EQ(saved.status().code(), Code::kFailedPrecondition);
  EXPECT_THAT(saved.status().message(), HasSubstr("is writing into " + root() + ": wait for it"));
  EXPECT_THAT(saved.status().message(), HasSubstr("a save of this process (another thread's, or an async save's persist"));
  EXPECT_THAT(saved.status().message(), HasSubstr("wait for it"));
  { RootLock released = std::move(held).value(); }
  // Held by another process: another job.
  int ready[2], done[2];
  ASSERT_EQ(::pipe(ready), 0);
  ASSERT_EQ(::pipe(done), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(done[1]);  // so the parent closing its end is this read's end of file
    Result<RootLock> other = RootLock::Acquire(root());
    char byte = other.ok() ? 1 : 0;
    (void)!::write(ready[1], &byte, 1);
    (void)!::read(done[0], &byte, 1);  // until the parent closes its end
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 1);
  saved = SaveStep(1);
  ::close(done[1]);
  ::waitpid(child, nullptr, 0);
  ::close(done[0]);
  ::close(ready[0]);
  ::close(ready[1]);
  ASSERT_FALSE(saved.ok());
  EXPECT_THAT(saved.status().message(), HasSubstr("another save is writing into " + root()));
  EXPECT_THAT(saved.status().message(), HasSubstr("two jobs must not save into one root"));
  ASSERT_TRUE(SaveStep(1).ok());
}

TEST_F(CheckpointTest, LeftoverTempFoldersAreRemovedByTheNextSave) {
  ASSERT_TRUE(MakeDirs(JoinPath(root(), "step-000000003.tmp-00000000deaddead")).ok());
  ASSERT_TRUE(SaveStep(4).ok());
  EXPECT_FALSE(PathExists(JoinPath(root(), "step-000000003.tmp-00000000deaddead")));
}

// ---- Damage on disk. ----

// Saved with every chunk on a block (format 1.0's layout): whole blocks of one tensor, read in
// place. Corruption of blocks packed chunks share: chunk_packing_test.
class DamagedCheckpointTest : public CheckpointTest {
 protected:
  void SetUp() override {
    SaveOptions unpacked;
    unpacked.pack_small_chunks = false;
    ASSERT_TRUE(SaveStep(1, unpacked).ok());
    dir1_ = JoinPath(root(), StepDirName(1));
  }
  Status LoadStatus() {
    Tensors got("x");
    ShardedState targets;
    for (auto& t : got.all) EXPECT_TRUE(targets.AddTensor(t.name, t.dtype, t.shape, Layout::Whole(), t.bytes.data()).ok());
    return Load(*comm_, root(), targets).status();
  }
  void Patch(const std::string& file, uint64_t offset, uint8_t xor_mask) {
    std::fstream f(JoinPath(dir1_, file), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(offset));
    char c;
    f.read(&c, 1);
    c = static_cast<char>(c ^ xor_mask);
    f.seekp(static_cast<std::streamoff>(offset));
    f.write(&c, 1);
  }
  std::string dir1_;
};

TEST_F(DamagedCheckpointTest, FlippedBitInDataNamesFileOffsetAndEntry) {
  Manifest m = ReadManifest(dir1_).value();
  const EntryRecord* f32 = nullptr;
  for (const EntryRecord& e : m.entries) {
    if (e.name == "model.float32") f32 = &e;
  }
  ASSERT_NE(f32, nullptr);
  Patch("rank-00000.bin", f32->chunks[0].offset + 5000, 0x10);
  Status status = LoadStatus();
  EXPECT_EQ(status.code(), Code::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("rank-00000.bin: checksum mismatch in the block at offset " +
                                          std::to_string(f32->chunks[0].offset + 4096)));
  EXPECT_THAT(status.message(), HasSubstr("'model.float32'"));
}

// A page-aligned target takes whole extents straight from the file (O_DIRECT, no staging
// copy); its blocks are verified in place, and a flipped bit there is reported like any other.
TEST_F(DamagedCheckpointTest, AlignedTargetsAreReadInPlaceAndVerifiedThere) {
  Tensors expected("step1");
  const Tensors::T& big = expected.all[1];  // model.float32 [64, 33]: two whole blocks and a tail
  ASSERT_EQ(big.name, "model.float32");
  AlignedBuffer target = AlignedBuffer::Allocate(big.bytes.size()).value();
  LoadOptions options;
  options.strict = false;
  options.plan.max_extent = 4096;  // one extent per block: the whole ones go in place
  ShardedState want;
  ASSERT_TRUE(want.AddTensor(big.name, big.dtype, big.shape, Layout::Whole(), target.data()).ok());
  Result<LoadReport> report = Load(*comm_, root(), want, options);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->stats.bytes_read_in_place, 2u * 4096);
  EXPECT_EQ(std::memcmp(target.data(), big.bytes.data(), big.bytes.size()), 0);

  Manifest m = ReadManifest(dir1_).value();
  for (const EntryRecord& e : m.entries) {
    if (e.name == big.name) Patch("rank-00000.bin", e.chunks[0].offset + 100, 0x01);
  }
  Status status = Load(*comm_, root(), want, options).status();
  EXPECT_EQ(status.code(), Code::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("'model.float32'"));
}

TEST_F(DamagedCheckpointTest, CorruptChecksumTableIsDetected) {
  Manifest m = ReadManifest(dir1_).value();
  Patch("rank-00000.bin", m.files[0].table_offset + 3, 0x01);
  Status status = LoadStatus();
  EXPECT_EQ(status.code(), Code::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("checksum table page 0"));
  // Named by what it leaves unverified, as a damaged data block is.
  EXPECT_THAT(status.message(), HasSubstr("the blocks it sums cannot be verified (they hold "));
  EXPECT_THAT(status.message(), HasSubstr("'model.float32'"));
}

TEST_F(DamagedCheckpointTest, TruncatedFileIsNamed) {
  ASSERT_EQ(::truncate(JoinPath(dir1_, "rank-00000.bin").c_str(), 5000), 0);
  Status status = LoadStatus();
  EXPECT_EQ(status.code(), Code::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("'rank-00000.bin' is 5000 bytes"));
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
}

// A folder where a data file should be: named as what it is, not as a truncated file of the
// folder's own size (4096 bytes).
TEST_F(DamagedCheckpointTest, AFolderInPlaceOfADataFileIsNamed) {
  const std::string file = JoinPath(dir1_, "rank-00000.bin");
  ASSERT_EQ(::unlink(file.c_str()), 0);
  ASSERT_TRUE(MakeDir(file).ok());
  Status status = LoadStatus();
  EXPECT_THAT(status.message(), HasSubstr(file + " is not a regular file (a directory)"));
  EXPECT_THAT(status.message(), Not(HasSubstr("truncated")));
  Result<VerifyReport> report = VerifyCheckpoint(dir1_);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_FALSE(report->problems.empty());
  EXPECT_THAT(report->problems[0].what, HasSubstr("is not a regular file (a directory)"));
  EXPECT_THAT(report->problems[0].what, Not(HasSubstr("missing")));
}

TEST_F(DamagedCheckpointTest, MissingRankFileIsNamed) {
  ASSERT_EQ(::unlink(JoinPath(dir1_, "rank-00000.bin").c_str()), 0);
  Status status = LoadStatus();
  EXPECT_EQ(status.code(), Code::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("data file 'rank-00000.bin' is missing"));
}

TEST_F(DamagedCheckpointTest, HostileFileNameInManifestIsRefused) {
  // A hostile writer can recompute the manifest's own checksum: validation must still refuse.
  Manifest m = ReadManifest(dir1_).value();
  m.files[0].name = "../../etc/pass";
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir1_, kManifestName), *EncodeManifest(m), "test").ok());
  Status status = LoadStatus();
  EXPECT_EQ(status.code(), Code::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("'../../etc/pass' is not a plain file name"));
}

TEST_F(DamagedCheckpointTest, EditedManifestIsRefusedByItsChecksum) {
  std::string text = ReadFileLimited(JoinPath(dir1_, kManifestName), 1 << 20).value();
  size_t at = text.find("\"time\"");
  text[at + 10] ^= 0x01;  // inside the creation time: metadata is covered too
  ASSERT_TRUE(WriteFileAtomic(JoinPath(dir1_, kManifestName), text, "test").ok());
  Status status = LoadStatus();
  EXPECT_EQ(status.code(), Code::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("manifest checksum mismatch"));
  // verify reports it as the checkpoint's damage (a problem of manifest.json), not as an error.
  Result<VerifyReport> report = VerifyCheckpoint(dir1_);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_EQ(report->problems[0].file, kManifestName);
  EXPECT_EQ(HoldersText(report->problems[0]), "the manifest");
  EXPECT_THAT(report->problems[0].what, ::testing::StartsWith("manifest checksum mismatch"));
}

// An editor's save of manifest.json: a final newline (vim's 'fixeol') changes no JSON and leaves
// the checkpoint whole; line endings turned into CRLF change the bytes sealed, and are said so
// (the message was "the checksum field is missing or damaged", though it was intact).
TEST_F(DamagedCheckpointTest, AnEditorsSaveOfTheManifestIsToldApartFromDamage) {
  const std::string path = JoinPath(dir1_, kManifestName);
  const std::string text = ReadFileLimited(path, 1 << 20).value();
  ASSERT_TRUE(WriteFileAtomic(path, text + "\n", "test").ok());
  EXPECT_TRUE(LoadStatus().ok()) << LoadStatus().ToString();
  ASSERT_TRUE(WriteFileAtomic(path, text + " \r\n\n", "test").ok());
  EXPECT_TRUE(LoadStatus().ok()) << LoadStatus().ToString();
  Result<VerifyReport> clean = VerifyCheckpoint(dir1_);
  ASSERT_TRUE(clean.ok()) << clean.status().ToString();
  EXPECT_TRUE(clean->problems.empty());
  std::string crlf;
  for (char c : text) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  ASSERT_TRUE(WriteFileAtomic(path, crlf, "test").ok());
  Status status = LoadStatus();
  EXPECT_EQ(status.code(), Code::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("manifest.json: the manifest was reformatted around its checksum field (line "
                                          "endings or spacing changed, as an editor's save may)"));
  // A digit of the checksum gone is damage, not reformatting.
  std::string cut = text;
  cut.erase(cut.rfind("\"\n}") - 1, 1);
  ASSERT_TRUE(WriteFileAtomic(path, cut, "test").ok());
  EXPECT_THAT(LoadStatus().message(), HasSubstr("the manifest's checksum field is missing or damaged"));
  // Text after the closing brace that is not whitespace is no editor's newline: refused.
  ASSERT_TRUE(WriteFileAtomic(path, text + "\nx", "test").ok());
  EXPECT_EQ(LoadStatus().code(), Code::kDataLoss);
}

TEST_F(DamagedCheckpointTest, NoLatestAndNoManifestIsNotFound) {
  // Without `latest` a root still resolves to its newest committed folder (retention_test); with
  // neither a `latest` nor a committed folder there is nothing to load.
  ASSERT_EQ(::unlink(JoinPath(root(), kLatestName).c_str()), 0);
  ASSERT_EQ(::unlink(JoinPath(dir1_, kManifestName).c_str()), 0);
  Status status = LoadStatus();
  EXPECT_EQ(status.code(), Code::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("is a root with no committed checkpoint yet: only folders of saves that are "
                                          "running or did not finish"));
}

// ---- Load options. ----

TEST_F(CheckpointTest, StrictLoadNamesMissingAndUnexpectedEntries) {
  ASSERT_TRUE(SaveStep(1).ok());
  std::vector<float> buffer(64 * 33);
  ShardedState targets;
  ASSERT_TRUE(targets.AddTensor("model.float32", DType::kFloat32, {64, 33}, Layout::Whole(), buffer.data()).ok());
  ASSERT_TRUE(targets.AddTensor("model.extra", DType::kFloat32, {2}, Layout::Whole(), buffer.data()).ok());
  Result<LoadReport> strict = Load(*comm_, root(), targets);
  ASSERT_FALSE(strict.ok());
  EXPECT_THAT(strict.status().message(), HasSubstr("not in checkpoint"));
  EXPECT_THAT(strict.status().message(), HasSubstr("'model.extra'"));
  LoadOptions partial;
  partial.strict = false;
  Result<LoadReport> report = Load(*comm_, root(), targets, partial);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->missing, std::vector<std::string>{"model.extra"});
  EXPECT_EQ(report->unexpected.size(), 11u);
  Tensors expected("step1");
  for (auto& t : expected.all) {
    if (t.name == "model.float32") {
      EXPECT_EQ(std::memcmp(buffer.data(), t.bytes.data(), t.bytes.size()), 0);
    }
  }
}

// Targets that share memory: tied weights (one buffer under two names) load when the checkpoint
// gives both names the same values and fail, naming both, when it does not (a checkpoint of an
// untied model); targets over part of each other's bytes are refused before anything is read.
TEST_F(CheckpointTest, TiedTargetsAreComparedAndOverlappingOnesRefused) {
  auto save = [&](int64_t step, float wte, float head) {
    std::vector<float> a(12, wte), b(12, head), other(4, 7.0f);
    ShardedState state;
    EXPECT_TRUE(state.AddTensor("wte", DType::kFloat32, {4, 3}, Layout::Whole(), a.data()).ok());
    EXPECT_TRUE(state.AddTensor("lm_head", DType::kFloat32, {4, 3}, Layout::Whole(), b.data()).ok());
    EXPECT_TRUE(state.AddTensor("other", DType::kFloat32, {4}, Layout::Whole(), other.data()).ok());
    return Save(*comm_, root(), step, state);
  };
  std::vector<float> shared(16, 0.0f);
  LoadOptions loose;
  loose.strict = false;
  auto tied = [&](const std::string& step_dir) {
    ShardedState state;
    EXPECT_TRUE(state.AddTensor("wte", DType::kFloat32, {4, 3}, Layout::Whole(), shared.data()).ok());
    EXPECT_TRUE(state.AddTensor("lm_head", DType::kFloat32, {4, 3}, Layout::Whole(), shared.data()).ok());
    return Load(*comm_, JoinPath(root(), step_dir), state, loose);
  };
  ASSERT_TRUE(save(1, 1.0f, 2.0f).ok());
  ASSERT_TRUE(save(2, 3.0f, 3.0f).ok());
  Result<LoadReport> untied = tied("step-000000001");
  ASSERT_FALSE(untied.ok());
  EXPECT_EQ(untied.status().code(), Code::kInvalidArgument);
  EXPECT_THAT(untied.status().message(),
              HasSubstr("'wte' and 'lm_head' are one tensor in the state passed (tied: the same memory) but two "
                        "tensors of different values in checkpoint "));
  Result<LoadReport> equal = tied("step-000000002");
  ASSERT_TRUE(equal.ok()) << equal.status().ToString();
  EXPECT_EQ(std::vector<float>(shared.begin(), shared.begin() + 12), std::vector<float>(12, 3.0f));
  EXPECT_EQ(shared[12], 0.0f);
  // Two views of one buffer, both in the checkpoint: refused, the buffer untouched.
  std::fill(shared.begin(), shared.end(), -1.0f);
  ShardedState views;
  ASSERT_TRUE(views.AddTensor("wte", DType::kFloat32, {4, 3}, Layout::Whole(), shared.data()).ok());
  ASSERT_TRUE(views.AddTensor("other", DType::kFloat32, {4}, Layout::Whole(), shared.data() + 10).ok());
  Result<LoadReport> overlapping = Load(*comm_, root(), views, loose);
  ASSERT_FALSE(overlapping.ok());
  EXPECT_THAT(overlapping.status().message(), HasSubstr("tensors 'wte' and 'other' of the state passed overlap in memory "
                                                        "without being the same bytes"));
  EXPECT_EQ(shared, std::vector<float>(16, -1.0f));
  // The same views where the checkpoint lacks one name: that one is never written, so no refusal.
  ShardedState lacking;
  ASSERT_TRUE(lacking.AddTensor("wte", DType::kFloat32, {4, 3}, Layout::Whole(), shared.data()).ok());
  ASSERT_TRUE(lacking.AddTensor("not_saved", DType::kFloat32, {4}, Layout::Whole(), shared.data() + 10).ok());
  Result<LoadReport> partial = Load(*comm_, root(), lacking, loose);
  ASSERT_TRUE(partial.ok()) << partial.status().ToString();
  EXPECT_EQ(std::vector<float>(shared.begin(), shared.begin() + 12), std::vector<float>(12, 3.0f));
}

// A tensor loaded in parts that leave some of it out: too few elements, or as many as the tensor
// with one part twice and another never (a wrong rank index), the shape a power of two in each
// dim (a fingerprint kept mod a power of two missed those). Here one process holds every part, as
// the ranks of a job would between them.
TEST_F(CheckpointTest, AStrictLoadRefusesPartsThatLeaveElementsOut) {
  const Shape shape = {2048, 1024};
  std::vector<float> saved(2048 * 1024);
  for (size_t i = 0; i < saved.size(); ++i) saved[i] = static_cast<float>(i);
  ShardedState state;
  ASSERT_TRUE(state.AddTensor("w", DType::kFloat32, shape, Layout::Whole(), saved.data()).ok());
  ASSERT_TRUE(Save(*comm_, root(), 1, state).ok());
  const size_t half = saved.size() / 2;
  std::vector<std::vector<float>> buffers;
  // Loads "w" as the given halves (0: rows 0-1023, 1: the rest), each into a buffer of its own.
  auto load = [&](const std::vector<int>& halves, bool strict) {
    buffers.assign(halves.size(), std::vector<float>(half));
    ShardedState targets;
    for (size_t i = 0; i < halves.size(); ++i) {
      EXPECT_TRUE(targets.AddTensor("w", DType::kFloat32, shape, ChunkLayout(shape, 0, 2, halves[i]), buffers[i].data()).ok());
    }
    LoadOptions options;
    options.strict = strict;
    return Load(*comm_, root(), targets, options);
  };
  for (const std::vector<int>& exact : {std::vector<int>{0, 1}, std::vector<int>{1, 0, 0, 1}}) {
    ::testing::internal::CaptureStderr();
    Result<LoadReport> report = load(exact, true);
    const std::string log = ::testing::internal::GetCapturedStderr();
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_TRUE(report->loaded_in_part.empty());
    EXPECT_EQ(buffers[0][0], saved[exact[0] * half]);
    EXPECT_THAT(log, Not(HasSubstr("not every element"))) << exact.size();
  }
  struct Case {
    std::vector<int> halves;
    const char* expected;
  };
  const char* twice = "'w' (2097152 elements for 2097152, but some loaded more than once and others by no rank)";
  for (const Case& c : {Case{{0}, "'w' (1048576 elements for 2097152)"}, Case{{0, 0}, twice}, Case{{1, 1}, twice}}) {
    Result<LoadReport> strict = load(c.halves, true);
    ASSERT_FALSE(strict.ok()) << c.expected;
    EXPECT_EQ(strict.status().code(), Code::kInvalidArgument);
    EXPECT_THAT(strict.status().message(), HasSubstr("has entries no rank loads all of"));
    EXPECT_THAT(strict.status().message(), HasSubstr(c.expected));
    Result<LoadReport> loose = load(c.halves, false);
    ASSERT_TRUE(loose.ok()) << loose.status().ToString();
    EXPECT_EQ(loose->loaded_in_part, std::vector<std::string>{"w"}) << c.expected;
    EXPECT_EQ(buffers[0][1], saved[c.halves[0] * half + 1]);  // the parts asked for are loaded all the same
  }
  // More than the tensor, not each element equally often: the layouts decide. Half 0 three times
  // and half 1 once holds every element (uneven replicas): passes, silently.
  ::testing::internal::CaptureStderr();
  Result<LoadReport> uneven = load({0, 0, 1, 0}, true);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(uneven.ok()) << uneven.status().ToString();
  EXPECT_TRUE(uneven->loaded_in_part.empty());
  EXPECT_THAT(log, Not(HasSubstr("checkpoint")));
  // Half 0 two or three times and half 1 never (every replica group loading shard 0; a wrong
  // shard of an uneven split counts a fraction over the tensor the same way): refused.
  for (const std::vector<int>& missing : {std::vector<int>{0, 0, 0}, std::vector<int>{0, 0, 0, 0}}) {
    Result<LoadReport> strict = load(missing, true);
    ASSERT_FALSE(strict.ok()) << missing.size();
    EXPECT_THAT(strict.status().message(), HasSubstr("'w' (" + std::to_string(missing.size() * half) +
                                                     " elements for 2097152, but some loaded by no rank)"));
    Result<LoadReport> loose = load(missing, false);
    ASSERT_TRUE(loose.ok()) << loose.status().ToString();
    EXPECT_EQ(loose->loaded_in_part, std::vector<std::string>{"w"});
  }
}

// Parts over the tensor's count cut so finely (a column of a tall tensor: one run per row) that
// checking them element by element would take more than a million runs: a warning, not a refusal.
TEST_F(CheckpointTest, PartsTooFineToCheckAreWarnedAbout) {
  const Shape shape = {int64_t{1} << 20, 4};
  std::vector<int8_t> saved((size_t{1} << 20) * 4, 7);
  ShardedState state;
  ASSERT_TRUE(state.AddTensor("tall", DType::kInt8, shape, Layout::Whole(), saved.data()).ok());
  ASSERT_TRUE(Save(*comm_, root(), 1, state).ok());
  std::vector<std::vector<int8_t>> columns(5, std::vector<int8_t>(size_t{1} << 20));
  ShardedState targets;
  for (int c = 0; c < 5; ++c) {  // columns 0, 1, 2, 3 and 0 again: 1.25 times the tensor, all of it
    ASSERT_TRUE(targets.AddTensor("tall", DType::kInt8, shape, Layout::Box({0, c % 4}, {int64_t{1} << 20, 1}),
                                  columns[static_cast<size_t>(c)].data()).ok());
  }
  ::testing::internal::CaptureStderr();
  Result<LoadReport> report = Load(*comm_, root(), targets);
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_TRUE(report->loaded_in_part.empty());
  EXPECT_THAT(log, HasSubstr("cut too finely to check element by element: 'tall' (5242880 elements for 4194304)"));
  EXPECT_EQ(columns[4][12345], 7);
}

TEST_F(CheckpointTest, RenameDtypeAndShapeChecks) {
  ASSERT_TRUE(SaveStep(1).ok());
  std::vector<double> buffer(15);
  LoadOptions options;
  options.strict = false;
  {
    // Renamed entries load their own bytes: each into the target its new name names.
    Tensors expected("step1");
    std::vector<int8_t> int8(9, 0);
    ShardedState targets;
    ASSERT_TRUE(targets.AddTensor("float64", DType::kFloat64, {3, 5}, Layout::Whole(), buffer.data()).ok());
    ASSERT_TRUE(targets.AddTensor("int8", DType::kInt8, {9}, Layout::Whole(), int8.data()).ok());
    options.rename = StripPrefix("model.");
    Result<LoadReport> report = Load(*comm_, root(), targets, options);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_TRUE(report->missing.empty());
    EXPECT_EQ(report->unexpected.size(), 10u);
    for (const auto& t : expected.all) {
      const void* loaded = t.name == "model.float64" ? static_cast<void*>(buffer.data())
                           : t.name == "model.int8"  ? static_cast<void*>(int8.data())
                                                     : nullptr;
      if (loaded != nullptr) {
        EXPECT_EQ(std::memcmp(loaded, t.bytes.data(), t.bytes.size()), 0) << t.name;
      }
    }
  }
  options.rename = nullptr;
  {
    ShardedState targets;
    ASSERT_TRUE(targets.AddTensor("model.float64", DType::kFloat32, {3, 5}, Layout::Whole(), buffer.data()).ok());
    Result<LoadReport> report = Load(*comm_, root(), targets, options);
    ASSERT_FALSE(report.ok());
    EXPECT_THAT(report.status().message(), HasSubstr("'model.float64' is float64 in the checkpoint but float32"));
  }
  {
    ShardedState targets;
    ASSERT_TRUE(targets.AddTensor("model.float64", DType::kFloat64, {5, 3}, Layout::Whole(), buffer.data()).ok());
    Result<LoadReport> report = Load(*comm_, root(), targets, options);
    ASSERT_FALSE(report.ok());
    EXPECT_THAT(report.status().message(), HasSubstr("shape [3, 5] in the checkpoint but [5, 3]"));
  }
}

}  // namespace
}  // namespace shardckpt
