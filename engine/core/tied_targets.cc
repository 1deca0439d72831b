#include "shardckpt/engine/core/tied_targets.h"

#include <cstring>
#include <string_view>
#include <unordered_map>

#include "shardckpt/engine/core/load_phases.h"
#include "shardckpt/engine/model/entry_alias.h"

namespace shardckpt {

TiedTargets::TiedTargets(const Manifest& manifest, const ShardedState& targets, const LoadOptions& options,
                         const SharedTargets& first_look)
    : original_(&targets) {
  const std::vector<TensorPiece>& pieces = targets.pieces();
  if (first_look.same.empty() && first_look.overlapping.empty()) return;  // the usual case: one sort
  // The entries of the pieces that share memory, and only theirs (one pass over the manifest, no
  // index of every name): a piece the checkpoint does not hold is never written, so it shares
  // memory harmlessly (a non-strict load of a state that reuses one buffer for what it lacks).
  std::unordered_map<std::string_view, const EntryRecord*> entry_of;
  for (const auto* pairs : {&first_look.same, &first_look.overlapping}) {
    for (const auto& [a, b] : *pairs) {
      entry_of.emplace(pieces[a].name, nullptr);
      entry_of.emplace(pieces[b].name, nullptr);
    }
  }
  for (const EntryRecord& e : manifest.entries) {
    const std::string renamed = options.rename ? options.rename(e.name) : std::string();
    auto it = entry_of.find(options.rename ? std::string_view(renamed) : std::string_view(e.name));
    if (it != entry_of.end() && it->second == nullptr) it->second = &e;
  }
  std::vector<size_t> written;
  for (size_t i = 0; i < pieces.size(); ++i) {
    auto it = entry_of.find(pieces[i].name);
    if (it != entry_of.end() && it->second != nullptr) written.push_back(i);
  }
  const SharedTargets shared = FindSharedTargets(pieces, &written);
  if (!shared.overlapping.empty()) {
    refusal_ = OverlapRefusal(pieces, shared.overlapping.front());
    return;
  }
  for (const auto& [later, first] : shared.same) {
    const EntryRecord* a = entry_of[pieces[first].name];
    const EntryRecord* b = entry_of[pieces[later].name];
    if (a == b || SameChunks(*a, *b)) continue;  // one value: nothing to compare
    if (!redirected_) redirected_.emplace(targets);
    Pair pair{later, first, std::unique_ptr<unsigned char[]>(new unsigned char[static_cast<size_t>(pieces[later].bytes)])};
    redirected_->MovePieceToHost(later, pair.buffer.get());
    compared_.push_back(std::move(pair));
  }
}

Status TiedTargets::Compare(const std::string& dir) const {
  std::vector<unsigned char> bounce;
  for (const Pair& pair : compared_) {
    const TensorPiece& first = original_->pieces()[pair.first];
    const size_t bytes = static_cast<size_t>(first.bytes);
    const unsigned char* held = static_cast<const unsigned char*>(first.data);
    if (first.space != MemorySpace::kHost) {  // compared on the host
      bounce.resize(bytes);
      TensorPiece landing = first;
      landing.data = bounce.data();
      landing.space = MemorySpace::kHost;
      SC_RETURN_IF_ERROR(load_phases::CopyPiece(landing, first));
      held = bounce.data();
    }
    if (std::memcmp(held, pair.buffer.get(), bytes) != 0) {
      const std::string& later = original_->pieces()[pair.later].name;
      return InvalidArgument("'" + first.name + "' and '" + later + "' are one tensor in the state passed (tied: the " +
                             "same memory) but two tensors of different values in checkpoint " + dir +
                             " (saved from a model that did not tie them): load into a model that does not tie "
                             "them, or leave one of the names out of the state");
    }
  }
  return Status::Ok();
}

}  // namespace shardckpt
