#include "shardckpt/engine/core/tied_targets.h"

#include <algorithm>
#include <cstring>
#include <new>
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
  // Out of memory for a buffer (a tied embedding is a gigabyte) is this rank's refusal, agreed
  // with the others in the verdict: thrown, it left them waiting in the next collective.
  try {
    for (const auto& [later, first] : shared.same) {
      const EntryRecord* a = entry_of[pieces[first].name];
      const EntryRecord* b = entry_of[pieces[later].name];
      if (a == b || SameChunks(*a, *b)) continue;  // one value: nothing to compare
      if (!redirected_) redirected_.emplace(targets);
      const size_t bytes = static_cast<size_t>(pieces[later].bytes);
      Pair pair{later, first, std::unique_ptr<unsigned char[]>(new unsigned char[bytes])};
      redirected_->MovePieceToHost(later, pair.buffer.get());
      compared_.push_back(std::move(pair));
    }
  } catch (const std::bad_alloc&) {
    redirected_.reset();
    compared_.clear();
    refusal_ = Status(Code::kInternal, "out of memory for the buffer a load compares tied targets in (one piece of " +
                                           pieces[shared.same.front().first].name + "): give this process more memory, "
                                           "or load a model that does not tie them");
  }
}

namespace {

// Whether `first`'s memory (host or device) holds `bytes` bytes equal to `buffer`'s. Device memory
// comes over in parts of a bounded size: a host copy of a whole tied embedding on every rank of
// a node was gigabytes more.
Result<bool> Equal(const TensorPiece& first, const unsigned char* buffer, size_t bytes) {
  if (first.space == MemorySpace::kHost) return std::memcmp(first.data, buffer, bytes) == 0;
  constexpr size_t kPart = size_t{64} << 20;
  std::vector<unsigned char> bounce(std::min(bytes, kPart));
  for (size_t at = 0; at < bytes; at += kPart) {
    const size_t n = std::min(kPart, bytes - at);
    TensorPiece from = first, landing = first;
    from.data = static_cast<unsigned char*>(first.data) + at;
    from.bytes = static_cast<int64_t>(n);
    landing.data = bounce.data();
    landing.bytes = from.bytes;
    landing.space = MemorySpace::kHost;
    SC_RETURN_IF_ERROR(load_phases::CopyPiece(landing, from));
    if (std::memcmp(bounce.data(), buffer + at, n) != 0) return false;
  }
  return true;
}

}  // namespace

Status TiedTargets::Compare(const std::string& dir) const {
  try {
    for (const Pair& pair : compared_) {
      const TensorPiece& first = original_->pieces()[pair.first];
      SC_ASSIGN_OR_RETURN(const bool equal, Equal(first, pair.buffer.get(), static_cast<size_t>(first.bytes)));
      if (equal) continue;
      const std::string& later = original_->pieces()[pair.later].name;
      return InvalidArgument("'" + first.name + "' and '" + later + "' are one tensor in the state passed (tied: the " +
                             "same memory) but two tensors of different values in checkpoint " + dir +
                             " (saved from a model that did not tie them); the tensors hold what was read, '" +
                             first.name + "' its own values: load into a model that does not tie them, or leave '" +
                             later + "' out of the state and load with strict=False");
    }
  } catch (const std::bad_alloc&) {  // the device part's bounce: this rank's failure, agreed
    return Status(Code::kInternal, "out of memory comparing tied targets: give this process more memory");
  }
  return Status::Ok();
}

}  // namespace shardckpt
