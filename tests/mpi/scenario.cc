#include "tests/mpi/scenario.h"

namespace shardckpt::testing {

static std::vector<ScenarioEntry>& Entries() {
  static std::vector<ScenarioEntry> kEntries = {
      {"model.w.f32", DType::kFloat32, {37, 19}},
      {"model.w.bf16", DType::kBFloat16, {10, 7}},
      {"model.w.f16", DType::kFloat16, {6, 13}},
      {"model.w.f64", DType::kFloat64, {8, 9}},
      {"model.w.i64", DType::kInt64, {5, 3}},
      {"model.scalar", DType::kInt32, {}},
      {"model.empty", DType::kUInt8, {0, 4}},
      {"model.mask", DType::kBool, {17}},
      {"model.w.i16", DType::kInt16, {4, 4, 4}},
      {"model.w.i8", DType::kInt8, {33}},
      {"model.w.u8", DType::kUInt8, {300, 20}},
      {"model.w.fp8a", DType::kFloat8E4M3, {64}},
      {"model.w.fp8b", DType::kFloat8E5M2, {3, 5}},
      {"optim.big.exp_avg", DType::kFloat32, {512, 1024}},
      {"model.rows", DType::kFloat32, {16, 4}},
  };
  static const bool kIndexed = [] {
    for (size_t i = 0; i < kEntries.size(); ++i) kEntries[i].index = i;
    return true;
  }();
  (void)kIndexed;
  return kEntries;
}

const std::vector<ScenarioEntry>& ScenarioEntries() { return Entries(); }

void AddManySmallEntries(int count) {
  static const DType kDTypes[] = {DType::kFloat32, DType::kBFloat16, DType::kInt64, DType::kFloat16, DType::kInt8};
  for (int i = 0; i < count; ++i) {
    int64_t n = 1 + (i * 37) % 700;  // 1 to 700 elements: 1 byte to 5.6 KiB
    Shape shape = i % 53 == 0 ? Shape{} : i % 3 == 0 && n >= 8 ? Shape{n / 4, 4} : Shape{n};
    std::vector<ScenarioEntry>& entries = Entries();
    entries.push_back(ScenarioEntry{"small." + std::to_string(i), kDTypes[i % 5], shape, entries.size()});
  }
}

bool IsKnownFamily(const std::string& family) {
  return family == "replicated" || family == "flat" || family == "dim0" || family == "mixed";
}

std::vector<Layout> ScenarioLayouts(const ScenarioEntry& entry, const std::string& family, int world, int rank) {
  const Shape& shape = entry.shape;
  if (family == "replicated") return {Layout::Whole()};
  if (family == "flat") return {FlatShardLayout(shape, world, rank)};
  if (family == "dim0") return {shape.empty() ? Layout::Whole() : ChunkLayout(shape, 0, world, rank)};
  // mixed
  if (entry.name == "model.rows") {
    std::vector<Layout> rows;  // row i lives on rank i % world: several pieces per rank
    for (int64_t i = rank; i < shape[0]; i += world) rows.push_back(Layout::Box({i, 0}, {1, shape[1]}));
    if (rows.empty()) rows.push_back(Layout::Box({0, 0}, {0, shape[1]}));
    return rows;
  }
  switch (entry.index % 5) {
    case 0: return {FlatShardLayout(shape, world, rank)};
    case 1: return {shape.empty() ? Layout::Whole() : ChunkLayout(shape, 0, world, rank)};
    case 2: return {shape.empty() ? Layout::Whole() : ChunkLayout(shape, static_cast<int>(shape.size()) - 1, world, rank)};
    case 3: {
      if (shape.size() < 2) return {FlatShardLayout(shape, world, rank)};
      int p = world % 2 == 0 ? 2 : 1, q = world / p;
      Layout box = ChunkLayout(shape, 0, p, rank / q);
      Layout cols = ChunkLayout(shape, 1, q, rank % q);
      box.offsets[1] = cols.offsets[1];
      box.sizes[1] = cols.sizes[1];
      return {box};
    }
    default: return {Layout::Whole()};
  }
}

}  // namespace shardckpt::testing
