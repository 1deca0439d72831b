#include "shardckpt/engine/model/manifest_wire.h"

#include <climits>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "shardckpt/engine/model/wire.h"

namespace shardckpt {
namespace {

// The fewest bytes one item takes in the message, so that a count is checked against what the
// bytes left could hold (allocations stay within a small multiple of the message's size).
constexpr uint64_t kMinFileBytes = 5;   // name length, size, table_offset, checksums, sum count
constexpr uint64_t kMinEntryBytes = 4;  // name length, dtype, shape length, chunk count
constexpr uint64_t kMinChunkBytes = 4;  // file, offset, bytes, layout kind
constexpr uint64_t kMinBlobBytes = 6;   // name length, scope, rank, file, offset, bytes

// Bumped whenever the layout below changes: ranks of one job run one build, but a message from
// another must be refused rather than misread.
constexpr uint64_t kMessageVersion = 1;

uint64_t DoubleBits(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

double BitsDouble(uint64_t bits) {
  double v = 0;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

void PutLayout(WireWriter* w, const Layout& l) {
  w->Var(static_cast<uint64_t>(l.kind));
  switch (l.kind) {
    case LayoutKind::kWhole: break;
    case LayoutKind::kBox:
      w->VarInts(l.offsets);
      w->VarInts(l.sizes);
      break;
    case LayoutKind::kFlatRange:
      w->SVar(l.begin);
      w->SVar(l.end);
      break;
  }
}

void GetLayout(WireReader* r, Layout* l) {
  const uint64_t kind = r->Var();
  switch (kind) {
    case static_cast<uint64_t>(LayoutKind::kWhole): *l = Layout::Whole(); break;
    case static_cast<uint64_t>(LayoutKind::kBox):
      l->kind = LayoutKind::kBox;
      r->VarIntsInto(&l->offsets);
      r->VarIntsInto(&l->sizes);
      break;
    case static_cast<uint64_t>(LayoutKind::kFlatRange):
      l->kind = LayoutKind::kFlatRange;
      l->begin = r->SVar();
      l->end = r->SVar();
      break;
    default: r->Fail();
  }
}

void PutStringMap(WireWriter* w, const std::map<std::string, std::string>& map) {
  w->Var(map.size());
  for (const auto& [key, value] : map) {
    w->VarStr(key);
    w->VarStr(value);
  }
}

}  // namespace

std::string EncodeManifestMessage(const Manifest& m) {
  size_t chunks = 0;
  for (const EntryRecord& e : m.entries) chunks += e.chunks.size();
  WireWriter w;
  w.bytes().reserve(256 + m.entries.size() * 48 + chunks * 20);
  w.Var(kMessageVersion);
  w.SVar(m.format_major);
  w.SVar(m.format_minor);
  w.SVar(m.step);
  w.SVar(m.world_size);
  const CreationInfo& c = m.created;
  w.VarStr(c.time);
  w.VarStr(c.shardckpt_version);
  w.VarStr(c.torch_version);
  w.SVar(c.hosts);
  w.VarStr(c.git_commit);
  PutStringMap(&w, c.user);
  w.Var(m.metrics.size());
  for (const auto& [name, value] : m.metrics) {
    w.VarStr(name);
    w.U64(DoubleBits(value));
  }
  w.Var(m.files.size());
  for (const FileRecord& f : m.files) {
    w.VarStr(f.name);
    w.Var(f.size);
    w.Var(f.table_offset);
    w.Var(f.checksums ? 1 : 0);
    w.Var(f.table_page_sums.size());
    for (uint64_t sum : f.table_page_sums) w.U64(sum);
  }
  w.Var(m.entries.size());
  for (const EntryRecord& e : m.entries) {
    w.VarStr(e.name);
    w.Var(static_cast<uint64_t>(e.dtype));
    w.VarInts(e.shape);
    w.Var(e.chunks.size());
    for (const ChunkRecord& chunk : e.chunks) {
      w.Var(chunk.file);
      w.Var(chunk.offset);
      w.Var(chunk.bytes);
      PutLayout(&w, chunk.layout);
    }
  }
  w.Var(m.blobs.size());
  for (const BlobRecord& b : m.blobs) {
    w.VarStr(b.name);
    w.Var(static_cast<uint64_t>(b.scope));
    w.SVar(b.rank);
    w.Var(b.file);
    w.Var(b.offset);
    w.Var(b.bytes);
  }
  return std::move(w.bytes());
}

namespace {

Result<Manifest> DecodeMessageUnguarded(const std::string& message, const std::string& origin) {
  WireReader r(message);
  Manifest m;
  auto i32 = [&r] {
    const int64_t v = r.SVar();
    if (v < INT32_MIN || v > INT32_MAX) r.Fail();
    return static_cast<int>(v);
  };
  auto u32 = [&r] {
    const uint64_t v = r.Var();
    if (v > UINT32_MAX) r.Fail();
    return static_cast<uint32_t>(v);
  };
  if (r.Var() != kMessageVersion) r.Fail();
  m.format_major = i32();
  m.format_minor = i32();
  m.step = r.SVar();
  m.world_size = i32();
  CreationInfo& c = m.created;
  c.time = r.VarStr();
  c.shardckpt_version = r.VarStr();
  c.torch_version = r.VarStr();
  c.hosts = i32();
  c.git_commit = r.VarStr();
  for (uint64_t n = r.VarCount(); n > 0 && r.ok(); --n) {
    std::string key = r.VarStr();
    c.user[std::move(key)] = r.VarStr();
  }
  for (uint64_t n = r.VarCount(); n > 0 && r.ok(); --n) {
    std::string name = r.VarStr();
    m.metrics[std::move(name)] = BitsDouble(r.U64());
  }
  m.files.resize(r.VarCount(kMinFileBytes));
  for (FileRecord& f : m.files) {
    f.name = r.VarStr();
    f.size = r.Var();
    f.table_offset = r.Var();
    f.checksums = r.Var() != 0;
    f.table_page_sums.resize(r.VarCount(sizeof(uint64_t)));
    for (uint64_t& sum : f.table_page_sums) sum = r.U64();
    if (!r.ok()) break;
  }
  m.entries.resize(r.VarCount(kMinEntryBytes));
  // A large message's chunk lists share an arena (record_arena.h says why).
  const ArenaAllocator<ChunkRecord> chunk_memory(message.size() >= kArenaMinTextBytes ? std::make_shared<RecordArena>()
                                                                                      : nullptr);
  for (EntryRecord& e : m.entries) {
    e.name = r.VarStr();
    const uint64_t dtype = r.Var();
    if (dtype >= static_cast<uint64_t>(kNumDTypes)) r.Fail();
    e.dtype = static_cast<DType>(dtype);
    r.VarIntsInto(&e.shape);
    e.chunks = ChunkRecords(r.VarCount(kMinChunkBytes), chunk_memory);
    for (ChunkRecord& chunk : e.chunks) {
      chunk.file = u32();
      chunk.offset = r.Var();
      chunk.bytes = r.Var();
      GetLayout(&r, &chunk.layout);
    }
    if (!r.ok()) break;
  }
  m.blobs.resize(r.VarCount(kMinBlobBytes));
  for (BlobRecord& b : m.blobs) {
    b.name = r.VarStr();
    const uint64_t scope = r.Var();
    if (scope > static_cast<uint64_t>(BlobScope::kPerRank)) r.Fail();
    b.scope = static_cast<BlobScope>(scope);
    b.rank = i32();
    b.file = u32();
    b.offset = r.Var();
    b.bytes = r.Var();
    if (!r.ok()) break;
  }
  if (!r.ok() || !r.done()) return DataLoss(origin + ": the manifest another rank sent is malformed");
  return m;
}

}  // namespace

Result<Manifest> DecodeManifestMessage(const std::string& message, const std::string& origin) {
  try {
    return DecodeMessageUnguarded(message, origin);
  } catch (const std::bad_alloc&) {  // as DecodeManifest: a Status every rank hears of
    return OutOfMemoryDecoding(origin, message.size());
  }
}

}  // namespace shardckpt
