// A load into a state whose targets share memory (engine/model/shared_targets.h). Tied weights
// (embedding and output head as one storage) are the common case: when the checkpoint stores the
// two names as one tensor (the same chunks: an import of a .pt that tied them) or holds only one
// of them, reading both into the one memory is harmless. When it holds two tensors (a save of a
// tied model's state_dict() writes each name, as dcp.save does; or a checkpoint of an untied
// model), the later name is read into a host buffer of its own, one piece's size, and compared
// with the first after the load (a device target through a bounded bounce): equal values load, a
// difference fails the load on every rank instead of leaving whichever was written last. The
// load fails after its reads, as any load failing at its end: the targets hold what was read.
// Targets the checkpoint holds that overlap without being the same bytes are refused before
// anything is read; a target it lacks is never written.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/model/shared_targets.h"

namespace shardckpt {

class TiedTargets {
 public:
  // `manifest`: the checkpoint's (names as saved; `options.rename` gives the names the targets
  // use). `first_look`: FindSharedTargets(targets.pieces()), which needs no manifest (a load
  // makes it while the manifest is read: a sort of every piece, 1 ms for 20,000).
  TiedTargets(const Manifest& manifest, const ShardedState& targets, const LoadOptions& options,
              const SharedTargets& first_look);
  // The state the load reads into: `targets`, or a copy with the later names of tied pairs in
  // buffers of their own.
  const ShardedState& targets() const { return redirected_ ? *redirected_ : *original_; }
  // Ok, or why the state is refused (targets that overlap in part): for the load's verdict.
  const Status& refusal() const { return refusal_; }
  // The pieces read into buffers of their own, to compare.
  std::vector<size_t> compared_pieces() const {
    std::vector<size_t> pieces;
    for (const Pair& pair : compared_) pieces.push_back(pair.later);
    return pieces;
  }
  // After every byte has landed: Ok, or InvalidArgument naming the first tied pair whose values
  // differ in checkpoint `dir`.
  Status Compare(const std::string& dir) const;

 private:
  struct Pair {
    size_t later, first;  // pieces
    std::unique_ptr<unsigned char[]> buffer;
  };
  const ShardedState* original_;
  Status refusal_;
  std::optional<ShardedState> redirected_;
  std::vector<Pair> compared_;
};

}  // namespace shardckpt
