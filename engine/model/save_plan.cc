#include "shardckpt/engine/model/save_plan.h"

#include <algorithm>
#include <map>
#include <unordered_map>

#include <xxhash.h>

#include "shardckpt/engine/model/coverage.h"
#include "shardckpt/engine/model/wire.h"

namespace shardckpt {

RankDescription DescribeState(const ShardedState& state) {
  RankDescription d;
  for (const TensorPiece& p : state.pieces()) {
    d.pieces.push_back(PieceDescription{p.name, p.dtype, p.global_shape, p.layout, p.bytes});
  }
  for (const BlobItem& b : state.blobs()) {
    d.blobs.push_back(BlobDescription{b.name, b.scope, static_cast<int64_t>(b.bytes.size())});
  }
  return d;
}

namespace {

// The fields of a piece or blob, whether described (PieceDescription) or held (TensorPiece).
const Shape& ShapeOf(const PieceDescription& p) { return p.shape; }
const Shape& ShapeOf(const TensorPiece& p) { return p.global_shape; }
int64_t SizeOf(const BlobDescription& b) { return b.bytes; }
int64_t SizeOf(const BlobItem& b) { return static_cast<int64_t>(b.bytes.size()); }

// One encoding for a description and for a state described in place: a state's encoding and
// digest need no RankDescription built first (a million pieces on a repeat save).
template <class W, class Pieces, class Blobs>
void WriteDescription(W& w, const Pieces& pieces, const Blobs& blobs) {
  w.U64(pieces.size());
  for (const auto& p : pieces) {
    w.Str(p.name);
    w.U64(static_cast<uint64_t>(p.dtype));
    w.Ints(ShapeOf(p));
    w.Layout(p.layout);
    w.I64(p.bytes);
  }
  w.U64(blobs.size());
  for (const auto& b : blobs) {
    w.Str(b.name);
    w.U64(static_cast<uint64_t>(b.scope));
    w.I64(SizeOf(b));
  }
}

// XXH3 of everything appended, fed in 64 KiB runs (a call per 8-byte field would cost more
// than the hashing).
class HashSink {
 public:
  HashSink() : state_(XXH3_createState()) { XXH3_64bits_reset(state_); }
  ~HashSink() { XXH3_freeState(state_); }
  HashSink(const HashSink&) = delete;
  HashSink& operator=(const HashSink&) = delete;
  void Append(const void* data, size_t n) {
    buffer_.append(static_cast<const char*>(data), n);
    if (buffer_.size() >= (64u << 10)) Flush();
  }
  uint64_t Digest() {
    Flush();
    return XXH3_64bits_digest(state_);
  }

 private:
  void Flush() {
    XXH3_64bits_update(state_, buffer_.data(), buffer_.size());
    buffer_.clear();
  }
  XXH3_state_t* state_;
  std::string buffer_;
};

}  // namespace

std::string EncodeRankDescription(const RankDescription& d) {
  WireWriter w;
  WriteDescription(w, d.pieces, d.blobs);
  return std::move(w.bytes());
}

std::string EncodeStateDescription(const ShardedState& state) {
  WireWriter w;
  WriteDescription(w, state.pieces(), state.blobs());
  return std::move(w.bytes());
}

uint64_t DigestStateDescription(const ShardedState& state) {
  BasicWireWriter<HashSink> w;
  WriteDescription(w, state.pieces(), state.blobs());
  return w.sink().Digest();
}

Result<RankDescription> DecodeRankDescription(const std::string& bytes) {
  WireReader r(bytes);
  RankDescription d;
  uint64_t pieces = r.U64();
  for (uint64_t i = 0; i < pieces && r.ok(); ++i) {
    PieceDescription p;
    p.name = r.Str();
    uint64_t dtype = r.U64();
    if (dtype >= static_cast<uint64_t>(kNumDTypes)) return Internal("bad dtype in a rank description");
    p.dtype = static_cast<DType>(dtype);
    p.shape = r.Ints();
    p.layout = r.Layout();
    p.bytes = r.I64();
    d.pieces.push_back(std::move(p));
  }
  uint64_t blobs = r.U64();
  for (uint64_t i = 0; i < blobs && r.ok(); ++i) {
    BlobDescription b;
    b.name = r.Str();
    b.scope = r.U64() == 0 ? BlobScope::kGlobal : BlobScope::kPerRank;
    b.bytes = r.I64();
    d.blobs.push_back(std::move(b));
  }
  if (!r.ok() || !r.done()) return Internal("truncated rank description");
  return d;
}

Result<SavePlan> PlanSave(const std::vector<RankDescription>& ranks) {
  const int world = static_cast<int>(ranks.size());
  SavePlan plan;
  plan.writes_piece.resize(world);
  plan.writes_blob.resize(world);
  plan.bytes_per_rank.assign(world, 0);

  struct Holder {
    int rank;
    size_t piece;
  };
  struct Group {  // one distinct piece of one entry and every rank holding it
    Layout layout;
    int64_t bytes;
    std::vector<Holder> holders;
  };
  struct Entry {
    DType dtype;
    Shape shape;
    int first_rank;
    std::vector<Group> groups;
    std::unordered_map<std::string, size_t> group_of;  // encoded layout -> groups index
  };
  std::map<std::string, Entry> entries;
  for (int r = 0; r < world; ++r) {
    plan.writes_piece[r].assign(ranks[r].pieces.size(), false);
    for (size_t i = 0; i < ranks[r].pieces.size(); ++i) {
      const PieceDescription& p = ranks[r].pieces[i];
      auto [it, inserted] = entries.try_emplace(p.name, Entry{p.dtype, p.shape, r, {}, {}});
      Entry& e = it->second;
      if (!inserted && (e.dtype != p.dtype || e.shape != p.shape)) {
        return InvalidArgument("entry '" + p.name + "' is " + DTypeName(p.dtype) + " " +
                               ShapeString(p.shape) + " on rank " + std::to_string(r) + " but " +
                               DTypeName(e.dtype) + " " + ShapeString(e.shape) + " on rank " +
                               std::to_string(e.first_rank));
      }
      Layout normal = Normalize(p.layout, p.shape);
      WireWriter key;
      key.Layout(normal);
      auto [slot, fresh] = e.group_of.try_emplace(key.bytes(), e.groups.size());
      if (fresh) e.groups.push_back(Group{normal, p.bytes, {}});
      e.groups[slot->second].holders.push_back(Holder{r, i});
    }
  }
  std::vector<Group*> replicated;
  for (auto& [name, e] : entries) {
    std::vector<Layout> layouts;
    std::vector<std::string> owners;
    for (Group& g : e.groups) {
      layouts.push_back(g.layout);
      owners.push_back("rank " + std::to_string(g.holders[0].rank));
      if (g.holders.size() == 1) {
        plan.writes_piece[g.holders[0].rank][g.holders[0].piece] = true;
        plan.bytes_per_rank[g.holders[0].rank] += g.bytes;
      } else {
        replicated.push_back(&g);
      }
    }
    SC_RETURN_IF_ERROR(CheckExactCover(name, e.shape, layouts, owners));
  }
  std::stable_sort(replicated.begin(), replicated.end(),
                   [](const Group* a, const Group* b) { return a->bytes > b->bytes; });
  for (Group* g : replicated) {
    const Holder* best = &g->holders[0];
    for (const Holder& h : g->holders) {
      if (plan.bytes_per_rank[h.rank] < plan.bytes_per_rank[best->rank]) best = &h;
    }
    plan.writes_piece[best->rank][best->piece] = true;
    plan.bytes_per_rank[best->rank] += g->bytes;
  }
  std::map<std::string, int> global_writer;
  for (int r = 0; r < world; ++r) {
    plan.writes_blob[r].assign(ranks[r].blobs.size(), false);
    for (size_t j = 0; j < ranks[r].blobs.size(); ++j) {
      const BlobDescription& b = ranks[r].blobs[j];
      bool writes = b.scope == BlobScope::kPerRank || global_writer.try_emplace(b.name, r).second;
      plan.writes_blob[r][j] = writes;
      if (writes) plan.bytes_per_rank[r] += b.bytes;
    }
  }
  return plan;
}

std::string EncodeSavePlan(const SavePlan& plan) {
  WireWriter w;
  for (size_t r = 0; r < plan.writes_piece.size(); ++r) {
    w.U64(plan.writes_piece[r].size());
    for (bool b : plan.writes_piece[r]) w.U64(b);
    w.U64(plan.writes_blob[r].size());
    for (bool b : plan.writes_blob[r]) w.U64(b);
    w.I64(plan.bytes_per_rank[r]);
  }
  return std::move(w.bytes());
}

Result<SavePlan> DecodeSavePlan(const std::string& bytes, int world_size) {
  WireReader r(bytes);
  SavePlan plan;
  plan.writes_piece.resize(world_size);
  plan.writes_blob.resize(world_size);
  plan.bytes_per_rank.resize(world_size);
  for (int k = 0; k < world_size && r.ok(); ++k) {
    uint64_t n = r.U64();
    for (uint64_t i = 0; i < n && r.ok(); ++i) plan.writes_piece[k].push_back(r.U64() != 0);
    n = r.U64();
    for (uint64_t i = 0; i < n && r.ok(); ++i) plan.writes_blob[k].push_back(r.U64() != 0);
    plan.bytes_per_rank[k] = r.I64();
  }
  if (!r.ok() || !r.done()) return Internal("truncated save plan");
  return plan;
}

}  // namespace shardckpt
