// Decides who writes what (docs/architecture.md, save 1). Pure: rank 0 runs it on the gathered
// descriptions of every rank's pieces and blobs.
//
// * Every entry must agree on dtype and global shape across ranks.
// * Equal pieces (replicas: Whole, or the same Box/FlatRange on several data-parallel ranks)
//   are written once, by the holder with the fewest bytes assigned so far; largest first, so the
//   write volume ends up balanced across ranks.
// * The distinct pieces of each entry must cover it exactly once.
// * A global blob is written by rank 0 (the lowest rank holding it); per-rank blobs by their rank.
#pragma once

#include <string>
#include <vector>

#include "shardckpt/engine/model/state.h"

namespace shardckpt {

struct PieceDescription {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  Layout layout;
  int64_t bytes = 0;
};

struct BlobDescription {
  std::string name;
  BlobScope scope = BlobScope::kGlobal;
  int64_t bytes = 0;
};

struct RankDescription {
  std::vector<PieceDescription> pieces;
  std::vector<BlobDescription> blobs;
};

RankDescription DescribeState(const ShardedState& state);
std::string EncodeRankDescription(const RankDescription& description);
// EncodeRankDescription(DescribeState(state)), written straight from the state.
std::string EncodeStateDescription(const ShardedState& state);
// A digest of what EncodeStateDescription(state) holds, computed without building it: names,
// dtypes, shapes, layouts (the pieces' part folded in by AddTensor) and blob sizes, so a rank
// tells cheaply whether its description changed since the save whose plan it keeps
// (save_plan_cache.h). Data pointers and bytes are not part of it.
uint64_t DigestStateDescription(const ShardedState& state);
Result<RankDescription> DecodeRankDescription(const std::string& bytes);

struct SavePlan {
  // writes_piece[r][i]: rank r writes its i-th piece; writes_blob[r][j] likewise for blobs.
  std::vector<std::vector<bool>> writes_piece;
  std::vector<std::vector<bool>> writes_blob;
  std::vector<int64_t> bytes_per_rank;
};

Result<SavePlan> PlanSave(const std::vector<RankDescription>& ranks);
std::string EncodeSavePlan(const SavePlan& plan);
Result<SavePlan> DecodeSavePlan(const std::string& bytes, int world_size);

}  // namespace shardckpt
