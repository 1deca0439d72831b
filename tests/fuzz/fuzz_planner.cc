// libFuzzer target: the load planner on fuzzed manifests and fuzzed wanted pieces.
//
// The input picks a shape, a dtype, saved chunk layouts (structured ones a real job writes, and
// free-form boxes and ranges that are usually invalid) and, sometimes, a tampered chunk record.
// Whatever ValidateManifest accepts is planned for fuzzed wanted layouts, and the plan is checked
// the way a load would use it: extents aligned and inside their file's data area, every wanted
// byte written exactly once, and (untampered manifests) every byte equal to the saved one.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/model/read_plan.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/log.h"
#include "tests/test_util.h"

using namespace shardckpt;

namespace {

constexpr int64_t kMaxFuzzBytes = 1 << 20;

Layout FuzzLayout(FuzzedDataProvider& in, const Shape& shape, int parts, int index) {
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0: return FlatShardLayout(shape, parts, index);
    case 1:
      if (shape.empty()) return Layout::Whole();
      return ChunkLayout(shape, in.ConsumeIntegralInRange<int>(0, static_cast<int>(shape.size()) - 1), parts, index);
    case 2: return Layout::Whole();
    case 3: {
      int64_t begin = in.ConsumeIntegralInRange<int64_t>(-2, 5000);
      return Layout::FlatRange(begin, begin + in.ConsumeIntegralInRange<int64_t>(-2, 5000));
    }
    default: {
      std::vector<int64_t> offsets, sizes;
      for (size_t d = 0; d < shape.size(); ++d) {
        offsets.push_back(in.ConsumeIntegralInRange<int64_t>(-1, shape[d]));
        sizes.push_back(in.ConsumeIntegralInRange<int64_t>(-1, shape[d] + 1));
      }
      return Layout::Box(offsets, sizes);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SetLogLevel(LogLevel::kOff);
  FuzzedDataProvider in(data, size);
  static const DType kTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kInt8, DType::kFloat64};
  const DType dtype = kTypes[in.ConsumeIntegralInRange<int>(0, 3)];
  Shape shape(in.ConsumeIntegralInRange<int>(0, 3));
  for (int64_t& d : shape) d = in.ConsumeBool() ? in.ConsumeIntegralInRange<int64_t>(0, 40) : in.ConsumeIntegralInRange<int64_t>(0, 3000);
  Result<int64_t> total = NumBytes(shape, DTypeSize(dtype));
  if (!total.ok() || total.value() > kMaxFuzzBytes) return 0;

  // Saved: `n` writer files, chunks appended at 4096-aligned offsets with fuzzed gaps.
  const int n = in.ConsumeIntegralInRange<int>(1, 6);
  Manifest manifest;
  EntryRecord entry{"e", dtype, shape, {}};
  std::vector<uint64_t> file_end(n, 0);
  for (int r = 0; r < n; ++r) {
    int pieces = in.ConsumeIntegralInRange<int>(0, 2);
    for (int p = 0; p < pieces; ++p) {
      Layout layout = FuzzLayout(in, shape, n, r);
      Result<int64_t> elements = ValidateLayout(layout, shape);
      uint64_t bytes = elements.ok() ? static_cast<uint64_t>(elements.value()) * DTypeSize(dtype) : 0;
      uint64_t offset = file_end[r] + kBlockSize * in.ConsumeIntegralInRange<int>(0, 2);
      entry.chunks.push_back(ChunkRecord{static_cast<uint32_t>(r), offset, bytes, layout});
      file_end[r] = AlignUp(offset + bytes, kBlockSize);
    }
  }
  bool tampered = false;
  if (!entry.chunks.empty() && in.ConsumeIntegralInRange<int>(0, 7) == 0) {
    ChunkRecord& c = entry.chunks[in.ConsumeIntegralInRange<size_t>(0, entry.chunks.size() - 1)];
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: c.offset += in.ConsumeIntegralInRange<uint64_t>(1, 8192); break;
      case 1: c.bytes += in.ConsumeIntegralInRange<int>(0, 1) ? 1 : -1; break;
      case 2: c.file = static_cast<uint32_t>(in.ConsumeIntegralInRange<int>(0, n)); break;
      default: c.offset = in.ConsumeIntegral<uint64_t>(); break;
    }
    tampered = true;
  }
  std::vector<std::vector<uint8_t>> files(n);
  for (int r = 0; r < n; ++r) {
    uint64_t table = file_end[r] + kBlockSize * in.ConsumeIntegralInRange<int>(0, 1);
    manifest.files.push_back(FileRecord{"r" + std::to_string(r), DataFileSize(table), table,
                                        std::vector<uint64_t>(TablePages(table), 0)});
    files[r].assign(table, 0xEE);
  }
  manifest.entries.push_back(entry);
  if (!ValidateManifest(manifest).ok()) return 0;
  if (!tampered) {
    for (const ChunkRecord& c : entry.chunks) {
      std::vector<uint8_t> bytes = testing::PieceBytes("e", dtype, shape, c.layout);
      if (!bytes.empty()) std::memcpy(files[c.file].data() + c.offset, bytes.data(), bytes.size());
    }
  }

  ChunkIndex index(&manifest);
  const int m = in.ConsumeIntegralInRange<int>(1, 6);
  for (int r = 0; r < m && in.remaining_bytes() > 0; ++r) {
    Layout want = FuzzLayout(in, shape, m, r);
    Result<int64_t> elements = ValidateLayout(want, shape);
    if (!elements.ok()) continue;
    std::vector<CopyRequest> copies;
    PlanPieceCopies(manifest, index, {WantedPiece{0, want, 0}}, &copies);
    ReadPlanOptions options{kBlockSize * in.ConsumeIntegralInRange<uint64_t>(0, 3),
                            kBlockSize * in.ConsumeIntegralInRange<uint64_t>(1, 8)};
    ReadPlan plan = CoalesceReads(copies, options);
    const size_t wanted_bytes = static_cast<size_t>(elements.value()) * DTypeSize(dtype);
    std::vector<uint8_t> got(wanted_bytes, 0);
    std::vector<uint8_t> writes(wanted_bytes, 0);
    for (const ReadExtent& e : plan.extents) {
      if (e.file >= files.size() || e.offset % kBlockSize || e.length % kBlockSize || e.length > options.max_extent ||
          e.offset + e.length > manifest.files[e.file].table_offset) {
        std::abort();
      }
      for (size_t k = e.first_copy; k < e.first_copy + e.copy_count; ++k) {
        const ScatterCopy& c = plan.copies.at(k);
        if (c.extent_offset + c.length > e.length || c.target_offset + c.length > wanted_bytes) std::abort();
        std::memcpy(got.data() + c.target_offset, files[e.file].data() + e.offset + c.extent_offset, c.length);
        for (uint64_t b = 0; b < c.length; ++b) ++writes[c.target_offset + b];
      }
    }
    for (uint8_t w : writes) {
      if (w != 1) std::abort();  // a byte never written, or written twice
    }
    if (plan.bytes_wanted != wanted_bytes) std::abort();
    if (!tampered && got != testing::PieceBytes("e", dtype, shape, want)) std::abort();
  }
  return 0;
}
