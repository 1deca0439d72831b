#include "shardckpt/engine/model/save_plan.h"

#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>

#include <xxhash.h>

#include "shardckpt/engine/model/coverage.h"
#include "shardckpt/engine/model/name_index.h"
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
template <class W, class Blobs>
void WriteBlobs(W& w, const Blobs& blobs) {
  w.U64(blobs.size());
  for (const auto& b : blobs) {
    w.Str(b.name);
    w.U64(static_cast<uint64_t>(b.scope));
    w.I64(SizeOf(b));
  }
}

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
  WriteBlobs(w, blobs);
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
  w.U64(state.pieces().size());
  w.U64(state.pieces_digest());  // folded in as the pieces were added
  WriteBlobs(w, state.blobs());
  return w.sink().Digest();
}

Result<RankDescription> DecodeRankDescription(const std::string& bytes) {
  WireReader r(bytes);
  RankDescription d;
  uint64_t pieces = r.U64();
  d.pieces.reserve(std::min<uint64_t>(pieces, bytes.size() / 8));  // each piece takes more than 8 bytes
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

namespace {

// A hash of a normalized layout, for finding equal pieces (replicas) of one entry.
uint64_t LayoutHash(const Layout& l, uint64_t seed) {
  uint64_t h = XXH3_64bits_withSeed(&l.kind, sizeof(l.kind), seed);
  if (l.kind == LayoutKind::kFlatRange) {
    const int64_t range[2] = {l.begin, l.end};
    return XXH3_64bits_withSeed(range, sizeof(range), h);
  }
  if (l.kind == LayoutKind::kBox) {
    h = XXH3_64bits_withSeed(l.offsets.data(), l.offsets.size() * sizeof(int64_t), h);
    return XXH3_64bits_withSeed(l.sizes.data(), l.sizes.size() * sizeof(int64_t), h);
  }
  return h;
}

}  // namespace

// One path, one kind: a value named 'r' on one rank beside a tensor 'r.a' on another (a dict
// holding a tensor on one rank and a plain value on another) committed both, and no rank's state
// loaded the checkpoint strictly again. Names are key paths joined with '.'; values under a
// value's path ('rng' and 'rng.dropout') and tensors under a tensor's are other matters.
template <typename Entries, typename Scopes>
Status CheckValuesHoldNoTensors(const Entries& entries, const Scopes& scope_of) {
  if (entries.empty() || scope_of.empty()) return Status::Ok();
  std::vector<size_t> by_name(entries.size());
  for (size_t k = 0; k < by_name.size(); ++k) by_name[k] = k;
  std::sort(by_name.begin(), by_name.end(), [&](size_t a, size_t b) { return entries[a].name < entries[b].name; });
  // `above` (a value, or a tensor, on `rank`) holds `below`, of the other kind, on `below_rank`.
  auto refuse = [](bool above_is_value, std::string_view above, int rank, std::string_view below, int below_rank) {
    return InvalidArgument("'" + std::string(above) + "' is a " + (above_is_value ? "value" : "tensor") + " on rank " +
                           std::to_string(rank) + " but " + (above_is_value ? "tensor" : "value") + " '" +
                           std::string(below) + "' lies under it on rank " + std::to_string(below_rank) +
                           ": a key must hold the same kind (tensors, or values) on every rank");
  };
  for (const auto& [name, scope_rank] : scope_of) {  // a value above a tensor
    const std::string under = std::string(name) + ".";
    auto it = std::lower_bound(by_name.begin(), by_name.end(), under,
                               [&](size_t e, const std::string& key) { return entries[e].name < key; });
    if (it != by_name.end() && entries[*it].name.substr(0, under.size()) == under) {
      return refuse(true, name, scope_rank.second, entries[*it].name, entries[*it].first_rank);
    }
  }
  for (const auto& e : entries) {  // a tensor above a value
    const std::string under = std::string(e.name) + ".";
    auto it = scope_of.lower_bound(under);
    if (it != scope_of.end() && it->first.substr(0, under.size()) == under) {
      return refuse(false, e.name, e.first_rank, it->first, it->second.second);
    }
  }
  return Status::Ok();
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
    Holder first;
    std::vector<Holder> more;  // replicas beyond the first: only for replicated pieces
  };
  struct Entry {
    std::string_view name;
    DType dtype;
    const Shape* shape;
    int first_rank;
    std::vector<Group> groups;
  };
  // Per piece: no string, map or key built (a state of thousands of small tensors cut over many
  // ranks has millions of pieces). Entries by name, groups by a hash of (entry, layout), checked
  // for equality; on a hash collision the entry's groups are searched.
  std::vector<Entry> entries;
  NameIndex entry_of(ranks.empty() ? 0 : ranks[0].pieces.size(), [&](uint32_t e) { return entries[e].name; });
  std::unordered_map<uint64_t, size_t> group_of;  // hash -> group index in its entry
  size_t pieces = 0;
  for (const RankDescription& r : ranks) pieces += r.pieces.size();
  entries.reserve(ranks.empty() ? 0 : ranks[0].pieces.size());
  group_of.reserve(pieces);
  for (int r = 0; r < world; ++r) {
    plan.writes_piece[r].assign(ranks[r].pieces.size(), false);
    for (size_t i = 0; i < ranks[r].pieces.size(); ++i) {
      const PieceDescription& p = ranks[r].pieces[i];
      auto [entry, inserted] = entry_of.TryEmplace(p.name, static_cast<uint32_t>(entries.size()));
      if (inserted) entries.push_back(Entry{p.name, p.dtype, &p.shape, r, {}});
      Entry& e = entries[entry];
      if (!inserted && (e.dtype != p.dtype || *e.shape != p.shape)) {
        return InvalidArgument("entry '" + p.name + "' is " + DTypeName(p.dtype) + " " +
                               ShapeString(p.shape) + " on rank " + std::to_string(r) + " but " +
                               DTypeName(e.dtype) + " " + ShapeString(*e.shape) + " on rank " +
                               std::to_string(e.first_rank));
      }
      Layout normal = Normalize(p.layout, p.shape);
      const uint64_t hash = LayoutHash(normal, entry);
      auto [slot, fresh] = group_of.try_emplace(hash, e.groups.size());
      Group* group = nullptr;
      if (!fresh) {
        if (slot->second < e.groups.size() && e.groups[slot->second].layout == normal) {
          group = &e.groups[slot->second];
        } else {
          for (Group& g : e.groups) {
            if (g.layout == normal) group = &g;
          }
        }
      }
      if (group == nullptr) {
        e.groups.push_back(Group{std::move(normal), p.bytes, Holder{r, i}, {}});
      } else {
        // Ranks come in order: a holder of this rank is the group's last. Two ranks holding one
        // piece are replicas; one rank adding it twice would save only one of its two buffers.
        if ((group->more.empty() ? group->first : group->more.back()).rank == r) {
          return InvalidArgument("entry '" + p.name + "': rank " + std::to_string(r) + " adds the piece " +
                                 p.layout.ToString() + " twice");
        }
        group->more.push_back(Holder{r, i});
      }
    }
  }
  // Entries in name order, so that equal-sized replicas are assigned the same way whatever the
  // ranks' order of pieces.
  std::vector<size_t> by_name(entries.size());
  for (size_t k = 0; k < by_name.size(); ++k) by_name[k] = k;
  std::sort(by_name.begin(), by_name.end(), [&](size_t a, size_t b) { return entries[a].name < entries[b].name; });
  std::vector<Group*> replicated;
  std::vector<const Layout*> layouts;
  for (size_t k : by_name) {
    Entry& e = entries[k];
    layouts.clear();
    for (Group& g : e.groups) {
      layouts.push_back(&g.layout);
      if (g.more.empty()) {
        plan.writes_piece[g.first.rank][g.first.piece] = true;
        plan.bytes_per_rank[g.first.rank] += g.bytes;
      } else {
        replicated.push_back(&g);
      }
    }
    CoverResult cover = CheckExactCover(std::string(e.name), *e.shape, layouts,
                                        [&](size_t g) { return "rank " + std::to_string(e.groups[g].first.rank); });
    if (cover.problem == CoverProblem::kMissing) {
      // A rank that passed another rank's piece instead of its own (an index off by one) looks
      // like a replica of it; with pieces missing, that is the likelier story: say so.
      for (const Group& g : e.groups) {
        if (g.more.empty() || g.layout.kind == LayoutKind::kWhole) continue;
        return InvalidArgument(cover.status.message() + "; rank " + std::to_string(g.more[0].rank) +
                               " passed the same piece " + g.layout.ToString() + " as rank " +
                               std::to_string(g.first.rank) + " (equal pieces are taken as replicas)");
      }
      // Ranks that passed no piece of it: one that left the name out of its state is a likely
      // story, and the error (the plan is built on rank 0) named no rank but the ones that hold it.
      std::vector<bool> holds(static_cast<size_t>(world), false);
      for (const Group& g : e.groups) {
        holds[static_cast<size_t>(g.first.rank)] = true;
        for (const Holder& h : g.more) holds[static_cast<size_t>(h.rank)] = true;
      }
      std::string none;
      int listed = 0, unlisted = 0;
      for (int r = 0; r < world; ++r) {
        if (holds[static_cast<size_t>(r)]) continue;
        if (listed < 8) {
          none += (none.empty() ? "" : ", ") + std::to_string(r);
          ++listed;
        } else {
          ++unlisted;
        }
      }
      if (!none.empty()) {
        // Not an accusation: ranks of another pipeline stage hold none of it by design.
        return InvalidArgument(cover.status.message() + "; ranks with no piece of it: " + none +
                               (unlisted > 0 ? " and " + std::to_string(unlisted) + " more" : "") +
                               " (one that should hold a part left the name out of its state?)");
      }
    }
    SC_RETURN_IF_ERROR(cover.status);
  }
  std::stable_sort(replicated.begin(), replicated.end(),
                   [](const Group* a, const Group* b) { return a->bytes > b->bytes; });
  for (Group* g : replicated) {
    const Holder* best = &g->first;
    for (const Holder& h : g->more) {
      if (plan.bytes_per_rank[h.rank] < plan.bytes_per_rank[best->rank]) best = &h;
    }
    plan.writes_piece[best->rank][best->piece] = true;
    plan.bytes_per_rank[best->rank] += g->bytes;
  }
  std::map<std::string, int> global_writer;
  std::map<std::string_view, std::pair<BlobScope, int>> scope_of;  // the first rank's scope of each name
  for (int r = 0; r < world; ++r) {
    plan.writes_blob[r].assign(ranks[r].blobs.size(), false);
    for (size_t j = 0; j < ranks[r].blobs.size(); ++j) {
      const BlobDescription& b = ranks[r].blobs[j];
      // One name, one scope: a value global on one rank and per-rank on another would come back
      // as either, depending on the world size that loads it.
      auto [first, fresh] = scope_of.try_emplace(b.name, b.scope, r);
      // One name, one kind: a tensor on one rank and a value on another committed both, and no
      // rank's state loaded the checkpoint strictly again.
      if (const uint32_t entry = fresh ? entry_of.Find(b.name) : entry_of.kAbsent; entry != entry_of.kAbsent) {
        if (entries[entry].first_rank == r) {  // "a tensor on rank 0 but a value on rank 0" said nothing
          return InvalidArgument("rank " + std::to_string(r) + " saves '" + b.name +
                                 "' both as a tensor and as a value: a name is one or the other");
        }
        return InvalidArgument("'" + b.name + "' is a tensor on rank " + std::to_string(entries[entry].first_rank) +
                               " but a value on rank " + std::to_string(r) +
                               ": a name must be a tensor on every rank or a value on every rank");
      }
      if (!fresh && first->second.first != b.scope) {
        auto scope = [](BlobScope s) { return s == BlobScope::kGlobal ? "global" : "per-rank"; };
        return InvalidArgument("value '" + b.name + "' is " + scope(first->second.first) + " on rank " +
                               std::to_string(first->second.second) + " but " + scope(b.scope) + " on rank " +
                               std::to_string(r));
      }
      bool writes = b.scope == BlobScope::kPerRank || global_writer.try_emplace(b.name, r).second;
      plan.writes_blob[r][j] = writes;
      if (writes) plan.bytes_per_rank[r] += b.bytes;
    }
  }
  SC_RETURN_IF_ERROR(CheckValuesHoldNoTensors(entries, scope_of));
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
