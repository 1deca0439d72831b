// The shard writer's staging: which bytes are copied and which are written in place, and device
// copies from several devices that share one staging buffer. The device is faked (no GPU here):
// its copies land only when their slot is waited for, as a real asynchronous copy may.
#include "shardckpt/engine/core/shard_writer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/sequential_writer.h"
#include "tests/test_util.h"

namespace shardckpt {
namespace {

// A copier whose copies happen only when their slot is waited for: a writer that writes a buffer
// before waiting for every copier that filled it writes bytes that have not arrived.
class DeferredCopier final : public DeviceCopier {
 public:
  explicit DeferredCopier(int device) : device_(device) {}
  int device() const override { return device_; }
  Status CopyToHostAsync(void* host, const void* device, size_t bytes, size_t slot) override {
    pending_.push_back(Copy{host, device, bytes, slot});
    return Status::Ok();
  }
  Status WaitSlot(size_t slot) override {
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (it->slot != slot) {
        ++it;
        continue;
      }
      std::memcpy(it->host, it->device, it->bytes);
      it = pending_.erase(it);
    }
    return Status::Ok();
  }
  Status CopyToDeviceAsync(void*, const void*, size_t) override { return Internal("not used"); }
  Status Synchronize() override { return Internal("not used"); }
  Status WaitForDeviceWork() override { return Status::Ok(); }
  size_t pending() const { return pending_.size(); }

 private:
  struct Copy {
    void* host;
    const void* device;
    size_t bytes;
    size_t slot;
  };
  int device_;
  std::vector<Copy> pending_;
};

// The engine saves and loads use, remembering where each write's bytes came from.
class RecordingEngine final : public IoEngine {
 public:
  explicit RecordingEngine(IoOptions options) : IoEngine(options), real_(CreateIoEngine(options)) {}
  const char* name() const override { return real_->name(); }
  size_t in_flight() const override { return real_->in_flight(); }
  Status Submit(File* file, const IoOp& op, uint64_t tag) override {
    writes.push_back(op);
    return real_->Submit(file, op, tag);
  }
  Result<uint64_t> Reap() override { return real_->Reap(); }

  std::vector<IoOp> writes;

 private:
  std::unique_ptr<IoEngine> real_;
};

std::vector<uint8_t> Pattern(size_t bytes, uint8_t seed) {
  std::vector<uint8_t> out(bytes);
  for (size_t i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(seed * 31 + i * 7 + (i >> 9));
  return out;
}

// The file's checksum table matches the bytes the file holds, block by block.
void ExpectTableMatches(const std::string& file, const FileRecord& record) {
  ASSERT_EQ(file.size(), record.size);
  for (uint64_t block = 0; block < record.table_offset / kBlockSize; ++block) {
    uint64_t stored;
    std::memcpy(&stored, file.data() + record.table_offset + block * 8, 8);
    EXPECT_EQ(stored, Checksum64(file.data() + block * kBlockSize, kBlockSize)) << "block " << block;
  }
}

std::string Bytes(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// The disk starts on a file's first MiB rather than idling while a whole buffer fills: the
// first staged writes are 1, 2, then 4 MiB, then whole buffers; the bytes are the same.
TEST(SequentialWriter, TheFirstWritesOfAFileRampUpToTheBufferSize) {
  testing::TempDir dir;
  RecordingEngine io(IoOptions{});
  auto pool = BufferPool::Create(3, 4 << 20).value();
  const std::vector<uint8_t> bytes = Pattern((13 << 20) + 1000, 9);
  {
    SequentialWriter writer(&io, pool.get());
    ASSERT_TRUE(writer.Open(JoinPath(dir.path(), "f")).ok());
    for (size_t at = 0; at < bytes.size(); at += 1000) {
      ASSERT_TRUE(writer.Stage(bytes.data() + at, std::min<size_t>(1000, bytes.size() - at)).ok());
    }
    ASSERT_TRUE(writer.Finish(bytes.size()).ok());
  }
  std::vector<uint64_t> lengths, offsets;
  for (const IoOp& op : io.writes) {
    lengths.push_back(op.length);
    offsets.push_back(op.offset);
  }
  EXPECT_EQ(lengths, (std::vector<uint64_t>{1 << 20, 2 << 20, 4 << 20, 4 << 20, (2 << 20) + 4096}));
  EXPECT_EQ(offsets, (std::vector<uint64_t>{0, 1 << 20, 3 << 20, 7 << 20, 11 << 20}));
  EXPECT_EQ(ReadFileLimited(JoinPath(dir.path(), "f"), 32 << 20).value(), Bytes(bytes));
  // A pool of small buffers (tests, tools) writes whole buffers from the start.
  RecordingEngine small(IoOptions{});
  auto small_pool = BufferPool::Create(2, 64 << 10).value();
  SequentialWriter writer(&small, small_pool.get());
  ASSERT_TRUE(writer.Open(JoinPath(dir.path(), "g")).ok());
  ASSERT_TRUE(writer.Stage(bytes.data(), 200 << 10).ok());
  ASSERT_TRUE(writer.Finish().ok());
  ASSERT_EQ(small.writes.size(), 4u);
  EXPECT_EQ(small.writes[0].length, 64u << 10);
}

// Two pieces from two devices land in one staging buffer; the buffer is checksummed and written
// only once both copies have arrived.
TEST(ShardFileWriter, WaitsForEveryDeviceThatFilledABuffer) {
  testing::TempDir dir;
  std::unique_ptr<IoEngine> io = CreateIoEngine();
  auto pool = BufferPool::Create(2, 64 << 10).value();
  std::vector<uint8_t> on_gpu0 = Pattern(1000, 1), on_gpu1 = Pattern(3000, 2), on_gpu0_again = Pattern(500, 3);
  DeferredCopier gpu0(0), gpu1(1);
  ShardFileWriter writer(io.get(), pool.get(), /*always_stage=*/false);
  ASSERT_TRUE(writer.Open(dir.path(), "rank-00000.bin").ok());
  uint64_t a = writer.AppendFromDevice(on_gpu0.data(), on_gpu0.size(), &gpu0).value();
  uint64_t b = writer.AppendFromDevice(on_gpu1.data(), on_gpu1.size(), &gpu1).value();
  uint64_t c = writer.AppendFromDevice(on_gpu0_again.data(), on_gpu0_again.size(), &gpu0).value();
  Result<FileRecord> record = writer.Finish();
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  EXPECT_EQ(gpu0.pending() + gpu1.pending(), 0u);
  std::string file = ReadFileLimited(JoinPath(dir.path(), "rank-00000.bin"), 1 << 20).value();
  EXPECT_EQ(file.substr(a, on_gpu0.size()), Bytes(on_gpu0)) << "device 0's bytes were written before they arrived";
  EXPECT_EQ(file.substr(b, on_gpu1.size()), Bytes(on_gpu1));
  EXPECT_EQ(file.substr(c, on_gpu0_again.size()), Bytes(on_gpu0_again));
  ExpectTableMatches(file, *record);
}

// A save that fails after queuing device copies (a later piece's copy refused, a write error)
// never reaches Finish; the pool outlives the writer (the async ring, the kept spare), so the
// writer must not end with copies still landing in it: its next user's bytes would be overwritten.
TEST(ShardFileWriter, AWriterLeftMidwayWaitsForTheCopiesIntoItsPool) {
  testing::TempDir dir;
  std::unique_ptr<IoEngine> io = CreateIoEngine();
  auto pool = BufferPool::Create(2, 64 << 10).value();
  std::vector<uint8_t> on_gpu = Pattern(3000, 4);
  DeferredCopier gpu(0);
  {
    ShardFileWriter writer(io.get(), pool.get(), /*always_stage=*/false);
    ASSERT_TRUE(writer.Open(dir.path(), "rank-00000.bin").ok());
    ASSERT_TRUE(writer.AppendFromDevice(on_gpu.data(), on_gpu.size(), &gpu).ok());
    EXPECT_EQ(gpu.pending(), 1u);  // queued into a buffer not written yet
  }  // abandoned without Finish, as a failed save leaves it
  EXPECT_EQ(gpu.pending(), 0u) << "a device copy was still landing in the pool after its writer ended";
}

// AsyncSaver's snapshot layout: pieces at page offsets with zeros between. Every piece that goes
// on a block (here all: packing off, as format 1.0 laid them out; packed small pieces are staged),
// and every tail, is written from that memory, adjacent pieces in buffer-sized writes; the
// staging ring only carries what is not a padded piece (a blob, the table).
TEST(ShardFileWriter, PaddedPiecesAreWrittenInPlaceTailsIncluded) {
  const std::vector<size_t> sizes = {1000, 4096, 20000, 0, 1, 9000};  // an empty piece: no break
  size_t total = 0;
  std::vector<size_t> at;
  for (size_t bytes : sizes) {
    at.push_back(total);
    total += AlignUp(bytes, kBlockSize);
  }
  AlignedBuffer area = AlignedBuffer::Allocate(total).value();
  std::memset(area.data(), 0, total);
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t> piece = Pattern(sizes[i], static_cast<uint8_t>(10 + i));
    if (!piece.empty()) std::memcpy(area.data() + at[i], piece.data(), piece.size());
  }
  // Every piece, then without piece 1 (another rank writes it): the run breaks and resumes.
  for (const std::vector<size_t>& chosen : {std::vector<size_t>{0, 1, 2, 3, 4, 5}, std::vector<size_t>{0, 2, 3, 4, 5}}) {
    testing::TempDir dir;
    IoOptions options;
    options.queue_depth = 8;
    RecordingEngine io(options);
    auto pool = BufferPool::Create(3, 16 << 10).value();
    ShardFileWriter writer(&io, pool.get(), /*always_stage=*/false, /*padded=*/true);
    writer.set_packing(ChunkPacking{/*pack=*/false});
    ASSERT_TRUE(writer.Open(dir.path(), "rank-00000.bin").ok());
    std::vector<uint64_t> offsets;
    for (size_t i : chosen) offsets.push_back(writer.Append(area.data() + at[i], sizes[i]).value());
    const std::string blob = "a blob, staged";
    uint64_t blob_at = writer.AppendStaged(blob.data(), blob.size()).value();
    Result<FileRecord> record = writer.Finish();
    ASSERT_TRUE(record.ok()) << record.status().ToString();

    uint64_t in_place = 0;
    size_t in_place_writes = 0;
    for (const IoOp& op : io.writes) {
      auto* from = static_cast<unsigned char*>(op.buffer);
      bool from_area = from >= area.data() && from < area.data() + total;
      EXPECT_EQ(from_area, op.offset < blob_at) << "write at " << op.offset << " came from the wrong memory";
      if (!from_area) continue;
      in_place += op.length;
      in_place_writes++;
      EXPECT_LE(op.length, pool->buffer_bytes());
    }
    EXPECT_EQ(in_place, blob_at);
    if (chosen.size() == sizes.size()) {
      EXPECT_EQ(in_place_writes, total / pool->buffer_bytes() + 1);
    }

    std::string file = ReadFileLimited(JoinPath(dir.path(), "rank-00000.bin"), 1 << 20).value();
    for (size_t k = 0; k < chosen.size(); ++k) {
      size_t i = chosen[k];
      EXPECT_EQ(file.substr(offsets[k], AlignUp(sizes[i], kBlockSize)),
                std::string(reinterpret_cast<char*>(area.data() + at[i]), AlignUp(sizes[i], kBlockSize)))
          << "piece " << i;
    }
    EXPECT_EQ(file.substr(blob_at, blob.size()), blob);
    ExpectTableMatches(file, *record);
  }
}

// A blob handed to a padded writer (an async save) from memory that happens to start on a page:
// only its bytes are copied. Written in place with its "tail", the file got whatever the heap held
// after it (seen in an FSDP2 resume: heap pointers on disk and a block whose sum no longer matched).
TEST(ShardFileWriter, BlobsAreNeverWrittenPastTheirEndFromAPaddedWriter) {
  AlignedBuffer memory = AlignedBuffer::Allocate(2 * kBlockSize).value();
  std::memset(memory.data(), 0xAB, 2 * kBlockSize);  // what lies past the blob is not zero
  const std::string blob = "[{\"lr\": 0.001}]";
  std::memcpy(memory.data(), blob.data(), blob.size());
  testing::TempDir dir;
  RecordingEngine io(IoOptions{});
  auto pool = BufferPool::Create(2, 16 << 10).value();
  ShardFileWriter writer(&io, pool.get(), /*always_stage=*/false, /*padded=*/true);
  ASSERT_TRUE(writer.Open(dir.path(), "rank-00000.bin").ok());
  const uint64_t at = writer.AppendStaged(memory.data(), blob.size()).value();
  EXPECT_EQ(at % kBlockSize, 0u);  // the first record of the file: on a block, as in the failure
  Result<FileRecord> record = writer.Finish();
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  for (const IoOp& op : io.writes) {
    auto* from = static_cast<unsigned char*>(op.buffer);
    EXPECT_FALSE(from >= memory.data() && from < memory.data() + 2 * kBlockSize)
        << "the blob's memory was written in place";
  }
  std::string file = ReadFileLimited(JoinPath(dir.path(), "rank-00000.bin"), 1 << 20).value();
  EXPECT_EQ(file.substr(at, blob.size()), blob);
  EXPECT_EQ(file.substr(at + blob.size(), kBlockSize - blob.size()),
            std::string(kBlockSize - blob.size(), '\0'));
  ExpectTableMatches(file, *record);
}

// The same through Append on a file opened without O_DIRECT (a memory-backed file system, as
// CI's /tmp is): any address may be written from there, but a chunk that does not start on a page
// is not padded memory, so its tail must not be written (or summed) from it.
TEST(ShardFileWriter, AnUnalignedChunkIsNotWrittenPastItsEndWithoutODirect) {
  AlignedBuffer memory = AlignedBuffer::Allocate(2 * kBlockSize).value();
  std::memset(memory.data(), 0xAB, 2 * kBlockSize);
  const std::string bytes = "not padded memory";
  std::memcpy(memory.data() + 64, bytes.data(), bytes.size());
  testing::TempDir dir;
  IoOptions options;
  options.use_direct = false;
  RecordingEngine io(options);
  auto pool = BufferPool::Create(2, 16 << 10).value();
  ShardFileWriter writer(&io, pool.get(), /*always_stage=*/false, /*padded=*/true);
  writer.set_packing(ChunkPacking{/*pack=*/false});
  ASSERT_TRUE(writer.Open(dir.path(), "rank-00000.bin").ok());
  const uint64_t at = writer.Append(memory.data() + 64, bytes.size()).value();
  Result<FileRecord> record = writer.Finish();
  ASSERT_TRUE(record.ok()) << record.status().ToString();
  std::string file = ReadFileLimited(JoinPath(dir.path(), "rank-00000.bin"), 1 << 20).value();
  EXPECT_EQ(file.substr(at, bytes.size()), bytes);
  EXPECT_EQ(file.substr(at + bytes.size(), kBlockSize - bytes.size()), std::string(kBlockSize - bytes.size(), '\0'))
      << "bytes past the chunk's end were written from the caller's memory";
  ExpectTableMatches(file, *record);
}

// Staged chunks are summed as they are copied (a run at a time, issue 14 part 3): the table must
// still hold every block's sum in file order, whatever mix of odd-sized staged chunks (a partial
// last block completed by padding), runs longer than a buffer, device copies still landing and
// in-place writes shares the buffers.
TEST(ShardFileWriter, SumsTakenWhileCopyingMatchTheFileInOrder) {
  testing::TempDir dir;
  std::unique_ptr<IoEngine> io = CreateIoEngine();
  // In-place runs of a MiB or more are summed on helper threads (none, one, three) meanwhile.
  for (auto [buffer_bytes, helpers] : std::vector<std::pair<size_t, size_t>>{
           {12 << 10, 0}, {64 << 10, 2}, {256 << 10, 0}, {1 << 20, 0}, {1 << 20, 1}, {1 << 20, 3}}) {
    auto pool = BufferPool::Create(3, buffer_bytes).value();
    ShardFileWriter writer(io.get(), pool.get(), /*always_stage=*/false, /*padded=*/false, helpers);
    const std::string name = "rank-" + std::to_string(buffer_bytes) + "-" + std::to_string(helpers) + ".bin";
    ASSERT_TRUE(writer.Open(dir.path(), name).ok());
    DeferredCopier gpu(0);
    AlignedBuffer aligned = AlignedBuffer::Allocate(3300 << 10).value();
    std::vector<uint8_t> big = Pattern(3300 << 10, 9);
    std::memcpy(aligned.data(), big.data(), big.size());
    std::vector<std::vector<uint8_t>> staged = {Pattern(100, 1), Pattern(4096, 2), Pattern(70000, 3), Pattern(5000, 4),
                                                Pattern(200000, 5), Pattern(1, 6)};
    std::vector<uint8_t> device = Pattern(9000, 7);
    std::vector<std::pair<uint64_t, std::string>> expected;
    auto add = [&](const std::vector<uint8_t>& v, uint64_t at) { expected.emplace_back(at, Bytes(v)); };
    add(staged[0], writer.Append(staged[0].data(), staged[0].size()).value());
    add(device, writer.AppendFromDevice(device.data(), device.size(), &gpu).value());
    add(staged[1], writer.Append(staged[1].data(), staged[1].size()).value());  // after a device copy in the buffer
    add(staged[2], writer.Append(staged[2].data(), staged[2].size()).value());
    add(big, writer.Append(aligned.data(), big.size()).value());  // in place when a buffer or more
    for (size_t i = 3; i < staged.size(); ++i) add(staged[i], writer.Append(staged[i].data(), staged[i].size()).value());
    Result<FileRecord> record = writer.Finish();
    ASSERT_TRUE(record.ok()) << record.status().ToString();
    std::string file = ReadFileLimited(JoinPath(dir.path(), name), 8 << 20).value();
    for (const auto& [at, bytes] : expected) EXPECT_EQ(file.substr(at, bytes.size()), bytes) << "chunk at " << at;
    ExpectTableMatches(file, *record);
  }
}

}  // namespace
}  // namespace shardckpt
