// Pieces of a load's state whose memory is shared: tied weights (an embedding and an output head
// that are one storage under two names) and views of one buffer. A load writes every piece in
// turn, so two pieces over the same bytes end up holding whichever was written last, silently,
// unless the load knows. Pure: addresses only, nothing read or written.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "shardckpt/engine/model/state.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

struct SharedTargets {
  // (later piece, earliest piece) for pieces over exactly the same bytes (the same start and size
  // in the same memory space and device): one tensor under two names, or one name given twice.
  std::vector<std::pair<size_t, size_t>> same;
  // Pieces whose bytes overlap without being the same bytes, as pairs (a piece, an earlier one by
  // address that it overlaps): every piece that overlaps another is in one of these pairs.
  std::vector<std::pair<size_t, size_t>> overlapping;
};

// Among the pieces `among` names (indices into `pieces`; all of them when null). Empty pieces
// share nothing.
SharedTargets FindSharedTargets(const std::vector<TensorPiece>& pieces, const std::vector<size_t>* among = nullptr);

// InvalidArgument naming an `overlapping` pair: a load would write part of one over the other.
Status OverlapRefusal(const std::vector<TensorPiece>& pieces, const std::pair<size_t, size_t>& overlapping);

}  // namespace shardckpt
