#include "shardckpt/engine/core/load_phases.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/per_rank_left.h"
#include "shardckpt/engine/core/tied_targets.h"
#include "shardckpt/engine/core/save_phases.h"
#include "shardckpt/engine/core/staging_cache.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/model/coverage.h"
#include "shardckpt/engine/model/index_fingerprint.h"
#include "shardckpt/engine/model/manifest_wire.h"
#include "shardckpt/engine/model/name_index.h"
#include "shardckpt/engine/model/wire.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt::load_phases {
namespace {

// Broadcasts an entry's bytes from `root`'s piece into every rank's `piece`. Device pieces go
// straight over `device_comm` (NCCL) when every rank's piece is on a device; otherwise through a
// host buffer. The return is the collective's status; a local copy's error goes to `*local`
// and never skips the broadcast, so every rank stays in step and the error is agreed on later.
Status BroadcastPiece(Communicator& comm, Communicator* device_comm, bool all_on_device, const TensorPiece& piece,
                      int root, Status* local) {
  const size_t bytes = static_cast<size_t>(piece.bytes);
  if (piece.space == MemorySpace::kHost) return comm.Broadcast(piece.data, bytes, root);
  if (all_on_device && device_comm != nullptr) return device_comm->Broadcast(piece.data, bytes, root);
  TensorPiece host = piece;
  std::vector<unsigned char> buffer(bytes);
  host.data = buffer.data();
  host.space = MemorySpace::kHost;
  if (comm.rank() == root && local->ok()) *local = CopyPiece(host, piece);
  SC_RETURN_IF_ERROR(comm.Broadcast(buffer.data(), bytes, root));
  if (comm.rank() != root && local->ok()) *local = CopyPiece(piece, host);
  return Status::Ok();
}

bool IsWhole(const TensorPiece& piece) {
  return Normalize(piece.layout, piece.global_shape).kind == LayoutKind::kWhole;
}

}  // namespace

Status CopyPiece(const TensorPiece& to, const TensorPiece& from) {
  const size_t bytes = static_cast<size_t>(from.bytes);
  if (to.space == MemorySpace::kHost && from.space == MemorySpace::kHost) {
    std::memcpy(to.data, from.data, bytes);
    return Status::Ok();
  }
  std::vector<unsigned char> bounce;
  const void* host = from.data;
  if (from.space == MemorySpace::kCuda) {
    SC_ASSIGN_OR_RETURN(DeviceCopier * copier, CudaCopier(from.device));
    void* landing = to.data;
    if (to.space == MemorySpace::kCuda) {
      bounce.resize(bytes);
      landing = bounce.data();
    }
    SC_RETURN_IF_ERROR(copier->CopyToHostAsync(landing, from.data, bytes, 0));
    SC_RETURN_IF_ERROR(copier->WaitSlot(0));
    if (to.space == MemorySpace::kHost) return Status::Ok();
    host = landing;
  }
  SC_ASSIGN_OR_RETURN(DeviceCopier * copier, CudaCopier(to.device));
  SC_RETURN_IF_ERROR(copier->CopyToDeviceAsync(to.data, host, bytes));
  return copier->Synchronize();
}

// ---- 1.
ManifestRead OpenManifestOnRoot(int rank, int world, const std::string& path) {
  ManifestRead read;
  if (rank != 0) return read;
  Result<CheckpointHold> resolved = HoldCheckpoint(path);
  read.status = resolved.status();
  if (!read.status.ok()) return read;
  read.hold = std::move(resolved).value();
  read.dir = read.hold.dir();
  const std::string manifest_path = JoinPath(read.dir, kManifestName);
  read.status = Failpoint("load.read_manifest", "read " + manifest_path);
  if (!read.status.ok() || IsDcpFolder(read.dir)) return read;  // a DCP folder is read whole when decoded
  Result<std::string> text = ReadManifestText(manifest_path);
  read.status = text.status();
  if (!text.ok()) return read;
  read.text = std::move(text).value();
  read.hint.manifest_bytes = read.text.size();
  read.hint.same_world = PathExists(JoinPath(read.dir, RankFileName(world - 1))) &&
                         !PathExists(JoinPath(read.dir, RankFileName(world)));
  return read;
}

void DecodeManifestText(int rank, ManifestRead* read) {
  if ((rank != 0 && !read->every_rank_parses) || !read->status.ok()) return;
  if (rank != 0) read->status = Failpoint("load.decode_manifest", "read the shared " + JoinPath(read->dir, kManifestName));
  if (!read->status.ok()) return;
  const bool dcp = rank == 0 && IsDcpFolder(read->dir);
  Result<Manifest> manifest =
      dcp ? ReadManifest(read->dir) : DecodeManifest(read->text, JoinPath(read->dir, kManifestName), read->decode_threads);
  std::string().swap(read->text);
  if (read->status.ok()) read->status = manifest.status();
  if (read->status.ok()) read->manifest = std::move(manifest).value();
}

// ---- 2.
Status ShareFolder(Communicator& comm, const std::string& path, const LoadOptions& options, ManifestRead* read) {
  // Rank 0's verdict first: on a bad folder every rank reports what its check found.
  SC_RETURN_IF_ERROR(BroadcastStatus(comm, read->status, 0));
  if (comm.size() == 1) return Status::Ok();
  // The folder and the path rank 0 was given, in one message (a path holds no NUL): a rank that
  // was given another says so, at no collective of its own.
  std::string shared = comm.rank() == 0 ? read->dir + '\0' + path : std::string();
  SC_RETURN_IF_ERROR(BroadcastString(comm, &shared, 0));
  const size_t split = shared.find('\0');
  read->dir = shared.substr(0, split);
  const std::string given = split == std::string::npos ? std::string() : shared.substr(split + 1);
  if (comm.rank() != 0 && given != path) {
    SC_LOG(kWarn) << "rank " << comm.rank() << " named '" << path << "' to load, rank 0 '" << given
                  << "': rank 0's is loaded on every rank (rank 0 resolves the checkpoint for all)";
  }
  // Rank 0's sharing mode drives every rank's collectives; a DCP folder has no text to share.
  const ManifestSharing mode = comm.rank() == 0 && read->text.empty() ? ManifestSharing::kRootSends : options.manifest_sharing;
  uint64_t hint[3] = {read->hint.manifest_bytes, read->hint.same_world ? 1u : 0u, static_cast<uint64_t>(mode)};
  SC_RETURN_IF_ERROR(comm.Broadcast(hint, sizeof(hint), 0));
  read->hint = ReadAheadHint{hint[0], hint[1] != 0};
  read->sharing = static_cast<ManifestSharing>(hint[2]);
  return Status::Ok();
}

Status ShareManifestText(Communicator& comm, ManifestRead* read) {
  if (comm.size() == 1) {
    read->decode_threads = ThisProcessDecodeThreads();
    return Status::Ok();
  }
  std::vector<std::string> ranks;
  std::string mine;
  if (read->sharing == ManifestSharing::kAuto) {
    mine = ThisRanksCpus();
    SC_RETURN_IF_ERROR(comm.AllGather(mine + " " + save_phases::HostName(), &ranks));
  }
  read->every_rank_parses = EveryRankParses(read->sharing, ranks);
  // Known only where gathered (kAuto): a forced mode decodes on one thread per rank. Capped by
  // this rank's own CPUs: ranks bound unevenly (one to a single CPU, another to seven) share their
  // host's CPUs unevenly too.
  if (read->every_rank_parses && !ranks.empty()) {
    read->decode_threads = std::min(DecodeThreadsFor(CpusPerRank(ranks)), ThisProcessDecodeThreads(mine));
  }
  if (read->every_rank_parses) SC_RETURN_IF_ERROR(BroadcastString(comm, &read->text, 0));
  return Status::Ok();
}

std::string ThisRanksCpus() {
  // The CPUs this rank may run on (binding, taskset, a Slurm allocation), as hex digits of four
  // CPUs each, CPU 0 in the first digit's lowest bit.
  std::string mask;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) {
    int last = -1;
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &set)) last = cpu;
    }
    for (int first = 0; first <= last; first += 4) {
      int digit = 0;
      for (int bit = 0; bit < 4; ++bit) digit |= CPU_ISSET(first + bit, &set) ? 1 << bit : 0;
      mask += "0123456789abcdef"[digit];
    }
  }
  // A cgroup v2 CPU quota ("200000 100000": two CPUs' time; "max": none) caps the CPUs the
  // whole container's ranks get, whatever their masks.
  long quota_cpus = 0;
  if (std::FILE* f = std::fopen("/sys/fs/cgroup/cpu.max", "r")) {
    long quota = 0, period = 0;
    if (std::fscanf(f, "%ld %ld", &quota, &period) == 2 && quota > 0 && period > 0) quota_cpus = (quota + period - 1) / period;
    std::fclose(f);
  }
  return std::to_string(quota_cpus) + " " + (mask.empty() ? "0" : mask);
}

long CpusPerRank(const std::vector<std::string>& ranks) {
  struct Host {
    long ranks = 0;
    long quota = 0;              // the smallest of its ranks' quotas; 0: none
    std::vector<uint8_t> cpus;   // the union of its ranks' masks, as hex digits' values
  };
  std::map<std::string, Host> hosts;
  for (const std::string& rank : ranks) {  // "<quota CPUs> <mask> <host>"
    const size_t first = rank.find(' ');
    const size_t second = first == std::string::npos ? first : rank.find(' ', first + 1);
    if (second == std::string::npos) return 0;
    Host& host = hosts[rank.substr(second + 1)];
    host.ranks++;
    const long quota = std::atol(rank.c_str());
    if (quota > 0) host.quota = host.quota == 0 ? quota : std::min(host.quota, quota);
    const std::string_view mask = std::string_view(rank).substr(first + 1, second - first - 1);
    if (host.cpus.size() < mask.size()) host.cpus.resize(mask.size(), 0);
    for (size_t i = 0; i < mask.size(); ++i) {
      const char c = mask[i];
      const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
      if (digit < 0) return 0;
      host.cpus[i] |= static_cast<uint8_t>(digit);
    }
  }
  if (hosts.empty()) return 0;
  long fewest = LONG_MAX;
  for (const auto& [name, host] : hosts) {
    long cpus = 0;
    for (uint8_t digit : host.cpus) cpus += __builtin_popcount(digit);
    if (host.quota > 0) cpus = std::min(cpus, host.quota);
    fewest = std::min(fewest, cpus / host.ranks);
  }
  return fewest;
}

bool EveryRankParses(ManifestSharing mode, const std::vector<std::string>& ranks) {
  if (mode != ManifestSharing::kAuto) return mode == ManifestSharing::kEveryRankParses;
  return CpusPerRank(ranks) >= 1;
}

size_t DecodeThreadsFor(long cpus_per_rank) { return static_cast<size_t>(std::clamp(cpus_per_rank, 1L, 4L)); }

size_t ThisProcessDecodeThreads(const std::string& cpus) { return DecodeThreadsFor(CpusPerRank({cpus + " this-host"})); }

std::unique_ptr<FileReadAhead> StartReadAhead(const ManifestRead& read, int rank, const LoadOptions& options) {
  return FileReadAhead::Start(JoinPath(read.dir, RankFileName(rank)), read.hint, options.read_ahead_max_bytes,
                              options.io, options.keep_staging);
}

// ---- 2.
Result<Manifest> DecodeSharedManifest(const std::string& dir, const std::string& message) {
  const std::string manifest_path = JoinPath(dir, kManifestName);
  SC_RETURN_IF_ERROR(Failpoint("load.decode_manifest", "read the shared " + manifest_path));
  return DecodeManifestMessage(message, manifest_path);
}

Status ShareManifest(Communicator& comm, ManifestRead* read) {
  // Rank 0's verdict first: on a bad manifest every rank reports what its full check found.
  SC_RETURN_IF_ERROR(BroadcastStatus(comm, read->status, 0));
  if (comm.size() == 1) return Status::Ok();
  // Every rank parsed the same text as rank 0, so it failed alike; only a failure of its own
  // (memory) differs, and the next all-gather sizes its message by the manifest.
  if (read->every_rank_parses) return AgreeOnStatus(comm, read->status);
  std::string message;
  if (comm.rank() == 0) message = EncodeManifestMessage(read->manifest);
  SC_RETURN_IF_ERROR(BroadcastString(comm, &message, 0));
  Status parsed;
  if (comm.rank() != 0) {
    Result<Manifest> m = DecodeSharedManifest(read->dir, message);
    parsed = m.status();
    if (parsed.ok()) read->manifest = std::move(m).value();
  }
  // The next all-gather sizes its message by the manifest: every rank must hold one.
  return AgreeOnStatus(comm, parsed);
}

// ---- 3.
Status RenameCollision(const std::string& first, const std::string& second, std::string_view as) {
  return InvalidArgument("'" + first + "' and '" + second + "' of the checkpoint both become '" + std::string(as) +
                         "' after the rename (strip_prefix), which this load wants: load without it, or load the "
                         "other name into another target");
}

LocalMatch MatchPieces(const Manifest& manifest, const ShardedState& targets, const LoadOptions& options) {
  // Names as views of the manifest's (or of their renamed copies): no string copied per entry.
  std::vector<std::string> renamed;
  if (options.rename) {
    renamed.reserve(manifest.entries.size());
    for (const EntryRecord& e : manifest.entries) renamed.push_back(options.rename(e.name));
  }
  auto name_of = [&](uint32_t i) -> std::string_view { return options.rename ? renamed[i] : manifest.entries[i].name; };
  NameIndex by_name(manifest.entries.size(), name_of);
  // A name longer than a string's inline 15 bytes lives on the heap, a cache miss away.
  constexpr size_t kNameAhead = 16;
  const uint32_t entry_count = static_cast<uint32_t>(manifest.entries.size());
  // Two entries the rename makes one name: refused if a piece wants that name (below), else
  // harmless (a partial load that takes neither).
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> collided;
  for (uint32_t i = 0; i < entry_count; ++i) {
    if (i + kNameAhead < entry_count) __builtin_prefetch(name_of(i + kNameAhead).data());
    const auto [first, fresh] = by_name.TryEmplace(name_of(i), i);
    if (!fresh && options.rename) collided.try_emplace(name_of(i), first, i);
  }
  LocalMatch match;
  match.wants.assign(manifest.entries.size(), EntryWant());
  match.entry_of_piece.assign(targets.pieces().size(), -1);
  std::unordered_set<std::string_view> missing;
  // Every entry whose dtype or shape differs is counted and the first few named: a model cast to
  // bfloat16, or resized, differs in hundreds of entries, and naming only the first had users
  // fixing them one load at a time.
  constexpr size_t kMismatchesShown = 5;
  std::vector<std::string> mismatches;
  std::vector<bool> mismatched(manifest.entries.size(), false);
  size_t mismatch_count = 0;
  // Each lookup misses cache four or five times, one after the other: the piece's name, its
  // slot, the entry, the entry's name and shape (entries are sorted by name, pieces come in the
  // caller's order). Lookups are independent, so the misses of the pieces a few places ahead are
  // started early, a stage per distance (as a hash join pipelines its probes): at kNameAhead the
  // piece's name is fetched, at kSlotAhead it is hashed and its slot fetched, at kEntryAhead the
  // entry the slot names, at kDataAhead that entry's name and shape and the piece's shape.
  const std::vector<TensorPiece>& pieces = targets.pieces();
  constexpr size_t kSlotAhead = 12, kEntryAhead = 8, kDataAhead = 4, kRing = 16;
  // Piece p's hash and likely entry sit at p % kRing from kSlotAhead (kEntryAhead) places ahead
  // until p is matched: a ring longer than the farthest stage never overwrites one still needed.
  static_assert(kNameAhead > kSlotAhead && kRing > kSlotAhead && kSlotAhead > kEntryAhead && kEntryAhead > kDataAhead);
  constexpr uint32_t kAbsent = decltype(by_name)::kAbsent;
  uint64_t hash_ring[kRing];
  uint32_t likely_ring[kRing];
  auto hash_of = [&](size_t p) -> uint64_t& { return hash_ring[p % kRing]; };
  auto likely_of = [&](size_t p) -> uint32_t& { return likely_ring[p % kRing]; };
  for (size_t p = 0; p < std::min(kNameAhead, pieces.size()); ++p) __builtin_prefetch(pieces[p].name.data());
  for (size_t p = 0; p < std::min(kSlotAhead, pieces.size()); ++p) hash_of(p) = by_name.HashOf(pieces[p].name);
  for (size_t p = 0; p < std::min(kEntryAhead, pieces.size()); ++p) likely_of(p) = kAbsent;
  for (size_t p = 0; p < pieces.size(); ++p) {
    if (const size_t q = p + kNameAhead; q < pieces.size()) __builtin_prefetch(pieces[q].name.data());
    if (const size_t q = p + kSlotAhead; q < pieces.size()) {
      hash_of(q) = by_name.HashOf(pieces[q].name);
      by_name.PrefetchSlot(hash_of(q));
    }
    if (const size_t q = p + kEntryAhead; q < pieces.size()) {
      likely_of(q) = by_name.LikelyIndex(hash_of(q));
      if (likely_of(q) != kAbsent) __builtin_prefetch(&manifest.entries[likely_of(q)]);
    }
    if (const size_t q = p + kDataAhead; q < pieces.size()) {
      if (const uint32_t e = likely_of(q); e != kAbsent) {
        __builtin_prefetch(name_of(e).data());
        __builtin_prefetch(manifest.entries[e].shape.data());
      }
      __builtin_prefetch(pieces[q].global_shape.data());
    }
    const TensorPiece& piece = pieces[p];
    const uint32_t entry = by_name.Find(piece.name, hash_of(p));
    if (entry == kAbsent) {
      if (missing.insert(piece.name).second) match.missing.push_back(piece.name);
      continue;
    }
    const EntryRecord& e = manifest.entries[entry];
    if ((e.dtype != piece.dtype || e.shape != piece.global_shape) && !mismatched[entry]) {
      mismatched[entry] = true;
      if (mismatches.size() < kMismatchesShown) {
        mismatches.push_back(e.dtype != piece.dtype
                                 ? "entry '" + e.name + "' is " + DTypeName(e.dtype) + " in the checkpoint but " +
                                       DTypeName(piece.dtype) + " in the target (no silent casts)"
                                 : "entry '" + e.name + "' has shape " + ShapeString(e.shape) + " in the checkpoint but " +
                                       ShapeString(piece.global_shape) + " in the target");
      }
      ++mismatch_count;
    }
    match.entry_of_piece[p] = static_cast<long>(entry);
    match.wants[entry].Add(IsWhole(piece), piece.space == MemorySpace::kCuda);
    if (!collided.empty() && match.status.ok()) {
      if (auto it = collided.find(piece.name); it != collided.end()) {
        match.status = RenameCollision(manifest.entries[it->second.first].name, manifest.entries[it->second.second].name,
                                       piece.name);
      }
    }
  }
  if (!mismatches.empty()) {
    std::string text = mismatches[0];
    if (mismatch_count > 1) {
      text += "; " + std::to_string(mismatch_count - 1) + " more " + (mismatch_count == 2 ? "entry differs" : "entries differ");
      for (size_t k = 1; k < mismatches.size(); ++k) text += (k == 1 ? ": " : "; ") + mismatches[k];
      if (mismatch_count > mismatches.size()) text += "; ...";
    }
    if (match.status.ok()) match.status = InvalidArgument(text);  // a rename's collision, the cause, kept
  }
  return match;
}

Demand CombineWants(const std::vector<std::string>& all_wants, size_t entries) {
  AllRanksWant all = CombineEntryWants(all_wants, entries);
  return Demand{std::move(all.any), std::move(all.whole_by_all), std::move(all.whole_on_device_everywhere),
                std::move(all.whole_by_some), all.compared_anywhere};
}

namespace {

// A rank's layouts of some entries, for every rank to decide their coverage alike: per piece its
// slot in `slots`' order, then its layout, in the wire encoding the ranks' descriptions use.
std::string EncodeLayouts(const std::vector<std::pair<uint32_t, const Layout*>>& pieces) {
  WireWriter w;
  for (const auto& [slot, layout] : pieces) {
    w.U64(slot);
    w.Layout(*layout);
  }
  return std::move(w.bytes());
}

// The layouts of one rank's message, by slot.
Status DecodeLayouts(const std::string& in, std::vector<std::vector<Layout>>* by_slot) {
  WireReader r(in);
  while (r.ok() && !r.done()) {
    const uint64_t slot = r.U64();
    Layout layout = r.Layout();
    if (!r.ok() || slot >= by_slot->size()) break;
    (*by_slot)[slot].push_back(std::move(layout));
  }
  return r.ok() && r.done() ? Status::Ok() : Internal("a malformed message of layouts in the coverage check");
}

// Runs a coverage decision may take per tensor (16 bytes each): past that, a warning instead.
constexpr uint64_t kMaxCoverageRuns = 1u << 20;

}  // namespace

Result<std::vector<PartlyLoaded>> EntriesLoadedInPart(Communicator& comm, const Manifest& manifest,
                                                      const ShardedState& targets, const LocalMatch& local,
                                                      const Demand& demand) {
  constexpr size_t kNone = SIZE_MAX;
  std::vector<size_t> slot_of(manifest.entries.size(), kNone);
  std::vector<size_t> checked;  // the entries wanted only in parts, in manifest order
  for (size_t e = 0; e < manifest.entries.size(); ++e) {
    if (demand.wanted_any[e] && !demand.wanted_whole_by_some[e]) {
      slot_of[e] = checked.size();
      checked.push_back(e);
    }
  }
  std::vector<PartlyLoaded> short_of;
  if (checked.empty()) return short_of;  // the same on every rank: none calls the reduction
  // Per entry, its element count and its index fingerprint (index_fingerprint.h: one or two
  // slots by world size), summed in one reduction of doubles. A count short of or equal to the
  // tensor's (under 2^50) is exact.
  const size_t slots = FingerprintSlots(comm.size());
  const size_t per_entry = 1 + slots;
  std::vector<double> sums(per_entry * checked.size(), 0.0);
  std::vector<uint64_t> fingerprints(checked.size(), 0);
  const std::vector<TensorPiece>& pieces = targets.pieces();
  // Calls `visit(piece, slot)` for this rank's pieces of the checked entries. A piece of another
  // shape than its entry's is a match error already; its layout means nothing in the entry's
  // index space, so it is left out.
  auto for_each_checked_piece = [&](auto&& visit) {
    for (size_t p = 0; p < pieces.size(); ++p) {
      const long e = local.entry_of_piece[p];
      if (e < 0 || slot_of[static_cast<size_t>(e)] == kNone) continue;
      if (pieces[p].global_shape != manifest.entries[static_cast<size_t>(e)].shape) continue;
      visit(pieces[p], slot_of[static_cast<size_t>(e)]);
    }
  };
  for_each_checked_piece([&](const TensorPiece& piece, size_t k) {
    // The piece's element count, as AddTensor sized its bytes (no shape built per piece).
    sums[per_entry * k] += static_cast<double>(piece.bytes / static_cast<int64_t>(DTypeSize(piece.dtype)));
    fingerprints[k] = AddIndexFingerprints(fingerprints[k], IndexFingerprint(piece.layout, piece.global_shape));
  });
  for (size_t k = 0; k < checked.size(); ++k) PackFingerprint(fingerprints[k], slots, &sums[per_entry * k + 1]);
  SC_RETURN_IF_ERROR(comm.AllReduceSumDouble(sums.data(), sums.size()));
  std::vector<size_t> suspects;  // slots whose coverage only the layouts themselves can decide
  for (size_t k = 0; k < checked.size(); ++k) {
    const EntryRecord& entry = manifest.entries[checked[k]];
    const Result<int64_t> whole = NumElements(entry.shape);
    const int64_t numel = whole.ok() ? *whole : 0;
    const double loaded = sums[per_entry * k];
    if (loaded < static_cast<double>(numel)) {
      short_of.push_back(PartlyLoaded{entry.name, static_cast<int64_t>(loaded), numel, PartlyLoaded::kShort});
      continue;
    }
    // Past 2^53 the count is not exact, and past kIndexFingerprintMaxElements the fingerprint
    // says nothing; an empty tensor has nothing to leave out.
    if (numel == 0 || numel > kIndexFingerprintMaxElements || loaded > 0x1p53) continue;
    const uint64_t all = UnpackFingerprintSum(&sums[per_entry * k + 1], slots);
    const double times = loaded / static_cast<double>(numel);
    const bool whole_copies = times == static_cast<double>(static_cast<uint64_t>(times));
    if (whole_copies &&
        all == ScaleIndexFingerprint(IndexFingerprint(Layout::Whole(), entry.shape), static_cast<uint64_t>(times))) {
      continue;
    }
    if (times == 1) {  // as many elements as the tensor, yet not each once: some twice, others never
      short_of.push_back(PartlyLoaded{entry.name, numel, numel, PartlyLoaded::kOverlapping});
    } else {  // more than the tensor, not each element equally often: decided below
      suspects.push_back(k);
    }
  }
  if (suspects.empty()) return short_of;  // the same on every rank, as the sums are
  // Rare (a wrong layout, or replicas cut in different ways): every rank's layouts of these
  // entries, gathered, and the same coverage decided on every rank.
  std::vector<uint32_t> suspect_of(checked.size(), UINT32_MAX);
  for (size_t s = 0; s < suspects.size(); ++s) suspect_of[suspects[s]] = static_cast<uint32_t>(s);
  std::vector<std::pair<uint32_t, const Layout*>> mine;
  for_each_checked_piece([&](const TensorPiece& piece, size_t k) {
    if (suspect_of[k] != UINT32_MAX) mine.emplace_back(suspect_of[k], &piece.layout);
  });
  std::vector<std::string> everyone;
  SC_RETURN_IF_ERROR(comm.AllGather(EncodeLayouts(mine), &everyone));
  std::vector<std::vector<Layout>> parts(suspects.size());
  for (const std::string& message : everyone) SC_RETURN_IF_ERROR(DecodeLayouts(message, &parts));
  for (size_t s = 0; s < suspects.size(); ++s) {
    const EntryRecord& entry = manifest.entries[checked[suspects[s]]];
    const std::optional<bool> covered = PartsCoverWhole(parts[s], entry.shape, kMaxCoverageRuns);
    if (covered.has_value() && *covered) continue;  // every element, some more often than others
    short_of.push_back(PartlyLoaded{entry.name, static_cast<int64_t>(sums[per_entry * suspects[s]]),
                                    NumElements(entry.shape).value(),
                                    covered.has_value() ? PartlyLoaded::kUncovered : PartlyLoaded::kUndecided});
  }
  return short_of;
}

std::vector<std::string> UnwantedEntries(const Manifest& manifest, const Demand& demand) {
  std::vector<std::string> names;
  for (size_t i = 0; i < manifest.entries.size(); ++i) {
    if (!demand.wanted_any[i]) names.push_back(manifest.entries[i].name);
  }
  return names;
}

ValueMatch MatchValues(const Manifest& manifest, const std::vector<std::string>& wanted_values, const LoadOptions& options,
                       int rank) {
  std::set<std::string> blobs;  // one name per value, however many ranks stored it
  std::set<std::string> own;    // of those, this rank's own per-rank ones
  std::map<std::string, std::string> original_of;  // with a rename: the saved name of each
  std::map<std::string, std::pair<std::string, std::string>> collided;  // two saved names made one
  for (const BlobRecord& b : manifest.blobs) {
    if (rank >= 0 && b.scope == BlobScope::kPerRank && b.rank != rank) continue;  // another rank's own
    std::string name = options.rename ? options.rename(b.name) : b.name;
    if (options.rename) {
      auto [it, fresh] = original_of.try_emplace(name, b.name);
      if (!fresh && it->second != b.name) collided.try_emplace(name, it->second, b.name);
    }
    if (rank >= 0 && b.scope == BlobScope::kPerRank) own.insert(name);
    blobs.insert(std::move(name));
  }
  // Per-rank values a reshard left out: matched as those of another world size are (the load
  // reports them unavailable), not missing.
  for (const auto& [left, saved_by] : PerRankValuesLeft(manifest)) {
    blobs.insert(options.rename ? options.rename(left) : left);
  }
  ValueMatch out;
  auto refuse_if_collided = [&](const std::string& name) {
    auto it = collided.find(name);
    if (it != collided.end() && out.status.ok()) out.status = RenameCollision(it->second.first, it->second.second, name);
  };
  std::set<std::string> taken;
  const bool dcp = BuiltFromDcpFolder(manifest);
  const std::set<std::string> nothing_stored(options.wanted_values_dcp_stores_nothing_of.begin(),
                                             options.wanted_values_dcp_stores_nothing_of.end());
  for (size_t w = 0; w < wanted_values.size(); ++w) {
    const std::string& want = wanted_values[w];
    if (blobs.count(want)) {
      taken.insert(want);
      refuse_if_collided(want);
      continue;
    }
    if (dcp && nothing_stored.count(want)) continue;
    // Stored leaf by leaf (a DCP folder, a .pt's nested dict): whole only if every leaf the
    // value's nesting has is there; the absent leaves are named.
    static const std::vector<std::string> kNone;
    const std::vector<std::string>& leaves = w < options.wanted_value_leaves.size() ? options.wanted_value_leaves[w] : kNone;
    std::vector<std::string> absent;
    bool any = false;
    for (const std::string& leaf : leaves) {
      if (blobs.count(leaf)) {
        taken.insert(leaf);
        refuse_if_collided(leaf);
        any = true;
      } else {
        absent.push_back(leaf);
      }
    }
    if (!any) {
      out.missing.push_back(want);
    } else {
      out.missing.insert(out.missing.end(), absent.begin(), absent.end());
    }
  }
  for (const std::string& b : blobs) {
    if (taken.count(b)) continue;
    out.unexpected.push_back(b);
    if (own.count(b)) out.own_unloaded.push_back(b);
  }
  if (!out.missing.empty()) {  // only then: a name per entry
    const std::set<std::string> missing(out.missing.begin(), out.missing.end());
    for (const EntryRecord& e : manifest.entries) {
      std::string name = options.rename ? options.rename(e.name) : e.name;
      if (!missing.count(name)) continue;
      out.tensors_named.push_back(std::move(name));
      out.tensors_named_saved.push_back(e.name);
    }
  }
  return out;
}

Status MatchVerdict(const Status& local, bool strict, const std::string& dir, const std::vector<std::string>& missing,
                    const std::vector<std::string>& unexpected, const ValueMatch& values,
                    const std::vector<std::string>& wanted_values) {
  if (local.ok() && !values.status.ok()) return values.status;
  if (!local.ok() || !strict) return local;
  // One name on both sides is one thing of two kinds: said so, and not also listed as missing
  // and as unloaded (which read as if the checkpoint lacked it).
  auto contains = [](const std::vector<std::string>& names, const std::string& name) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  std::vector<std::string> kinds;
  for (const std::string& name : missing) {
    if (contains(values.unexpected, name)) kinds.push_back("'" + name + "' is a value in the checkpoint but a tensor in the state passed");
  }
  auto a_tensor = [&](const std::string& name) {
    return contains(unexpected, name) || contains(values.tensors_named, name);
  };
  for (const std::string& name : values.missing) {
    if (a_tensor(name)) kinds.push_back("'" + name + "' is a tensor in the checkpoint but a value in the state passed");
  }
  // Tensors passed under a name the checkpoint holds as one value: a tuple DCP pickled whole,
  // tensors inside ('tup.0', 'tup.1' against 'tup'). Said as such, with how to get it back.
  std::map<std::string, std::vector<std::string>> inside_value;
  for (const std::string& name : missing) {
    if (contains(values.unexpected, name)) continue;
    for (size_t dot = name.rfind('.'); dot != std::string::npos && dot > 0; dot = name.rfind('.', dot - 1)) {
      if (contains(values.unexpected, name.substr(0, dot))) {
        inside_value[name.substr(0, dot)].push_back(name);
        break;
      }
    }
  }
  for (const auto& [value, tensors] : inside_value) {
    kinds.push_back("'" + value + "' is one value in the checkpoint (DCP stores a tuple whole, tensors inside), but the "
                    "state passed holds tensors under it (" + NameList(tensors) + "): pass a value there (None) to "
                    "get it back as saved");
  }
  auto inside = [&](const std::string& name) {
    for (const auto& [value, tensors] : inside_value) {
      if (name == value || contains(tensors, name)) return true;
    }
    return false;
  };
  std::vector<std::string> all_missing, all_unexpected;
  for (const std::string& name : missing) {
    if (!contains(values.unexpected, name) && !inside(name)) all_missing.push_back(name);
  }
  for (const std::string& name : values.missing) {
    if (!a_tensor(name)) all_missing.push_back(name);
  }
  for (const std::string& name : unexpected) {  // saved names: said above when passed as a value
    if (!contains(values.missing, name) && !contains(values.tensors_named_saved, name)) all_unexpected.push_back(name);
  }
  std::vector<std::string> own_unloaded;
  for (const std::string& name : values.unexpected) {
    if (contains(missing, name) || inside(name) || contains(values.loaded_elsewhere, name)) continue;
    (contains(values.own_unloaded, name) ? own_unloaded : all_unexpected).push_back(name);
  }
  if (all_missing.empty() && all_unexpected.empty() && own_unloaded.empty() && kinds.empty()) return Status::Ok();
  // A value passed where the checkpoint holds tensors under its name: an optimizer's state before
  // its first step. Said first, as the cause: "not in checkpoint: 'optim'" alone read as if the
  // checkpoint lacked the optimizer whose tensors it then listed.
  std::string holder;
  for (const std::string& want : wanted_values) {
    const std::string under = want + ".";
    for (const std::string& u : unexpected) {
      if (u.compare(0, under.size(), under) == 0) holder = want;
    }
    if (!holder.empty()) break;
  }
  std::string message;
  if (!holder.empty()) {
    message = "'" + holder + "' holds no tensors in the state passed, but checkpoint " + dir + " holds " + holder +
              ".* tensors, which have nowhere to go: an optimizer has no state before its first step; create it "
              "first, in the form it was saved in (torch.distributed.checkpoint.state_dict.get_state_dict(model, "
              "optim) creates it keyed by parameter name, as it saves it; for optim.state_dict(), keyed by index, one "
              "optim.step() with lr 0 after a backward pass does), load into that, then hand it to the optimizer";
  }
  if (!all_missing.empty()) {
    message += (message.empty() ? "" : "; ") + std::string("not in checkpoint ") + dir + ": " + NameList(all_missing);
  }
  if (!all_unexpected.empty()) {
    message += (message.empty() ? "" : "; ") + std::string("checkpoint ") + dir + " has entries no rank loads: " +
               NameList(all_unexpected);
  }
  if (!own_unloaded.empty()) {
    // Without the rank's number: the ranks' errors are merged where they read the same.
    message += (message.empty() ? "" : "; ") + std::string("checkpoint ") + dir +
               " holds per-rank values this rank saved that its state now leaves out: " + NameList(own_unloaded);
  }
  for (const std::string& kind : kinds) message += (message.empty() ? "" : "; ") + kind;
  if (holder.empty()) message += " (a non-strict load loads the rest and reports them)";
  return Status(all_missing.empty() ? Code::kInvalidArgument : Code::kNotFound, message);
}

std::vector<int> AssignReaders(const Demand& demand, bool broadcast_replicated, int world) {
  std::vector<int> reader_of(demand.wanted_any.size(), -1);
  if (!broadcast_replicated || world <= 1) return reader_of;
  int next = 0;
  for (size_t i = 0; i < reader_of.size(); ++i) {
    if (demand.wanted_any[i] && demand.wanted_whole_by_all[i]) reader_of[i] = next++ % world;
  }
  return reader_of;
}

Result<bool> ChooseBroadcast(bool broadcast_replicated, ReplicatedReads mode, const char* env, bool one_host,
                             bool memory_backed) {
  if (env != nullptr && *env != '\0') {
    Result<ReplicatedReads> forced = ParseReplicatedReads(env);
    if (!forced.ok()) return forced.status().WithContext("SHARDCKPT_REPLICATED_READS");
    mode = *forced;
  }
  if (!broadcast_replicated || mode == ReplicatedReads::kEveryRank) return false;
  return mode == ReplicatedReads::kBroadcast || !one_host || !memory_backed;
}

Result<ReplicatedReadChoice> AgreeOnBroadcast(Communicator& comm, const LoadOptions& options, const std::string& dir) {
  if (comm.size() <= 1) return ReplicatedReadChoice{};
  const char* env = std::getenv("SHARDCKPT_REPLICATED_READS");
  std::vector<std::string> all;
  // Each rank's own choice as if on one host from memory, on one host from storage and across
  // hosts; then whether it sees the checkpoint in memory, then its host.
  std::string mine;
  Status chosen;
  for (auto [one_host, memory] : {std::pair{true, true}, std::pair{true, false}, std::pair{false, false}}) {
    Result<bool> choice = ChooseBroadcast(options.broadcast_replicated, options.replicated_reads, env, one_host, memory);
    if (!choice.ok()) chosen = choice.status();
    mine += !choice.ok() ? '!' : *choice ? 'b' : 'r';
  }
  mine += IsMemoryBacked(JoinPath(dir, kManifestName)) ? 'm' : 'd';
  mine += options.verify_checksums ? 'v' : 'u';
  SC_RETURN_IF_ERROR(AgreeOnStatus(comm, chosen));
  SC_RETURN_IF_ERROR(comm.AllGather(mine + save_phases::HostName(), &all));
  constexpr size_t kChoices = 3, kVerify = 4, kHost = 5;
  std::string differ;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].compare(0, kChoices, all[0], 0, kChoices) != 0) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  }
  if (!differ.empty()) {
    return InvalidArgument("ranks " + differ + " chose otherwise than rank 0 between reading replicated entries once "
                           "and broadcasting them or every rank reading them (SHARDCKPT_REPLICATED_READS or "
                           "LoadOptions differ)");
  }
  bool one_host = true, memory = true, all_verify = true, any_verify = false;
  for (const std::string& rank : all) {
    one_host &= rank.compare(kHost, std::string::npos, all[0], kHost, std::string::npos) == 0;
    memory &= rank[kChoices] == 'm';
    all_verify &= rank[kVerify] == 'v';
    any_verify |= rank[kVerify] == 'v';
  }
  // Bytes one rank reads for others (a broadcast) or verifies for others (shared pages) would
  // go unchecked where that rank does not verify, while a rank that asked for verification
  // believed them checked: where ranks differ, each reads and verifies its own.
  const bool mixed = any_verify && !all_verify;
  const bool broadcast = (one_host ? mine[memory ? 0 : 1] : mine[2]) == 'b' && !mixed;
  return ReplicatedReadChoice{broadcast, one_host && memory && all_verify};
}

std::vector<BroadcastBatch> BatchBroadcasts(const std::vector<int>& reader_of, const std::vector<uint64_t>& entry_bytes,
                                            const std::vector<bool>& alone, int world, uint64_t batch_bytes) {
  std::vector<BroadcastBatch> batches;
  for (int reader = 0; reader < world; ++reader) {
    BroadcastBatch open{reader, {}, 0, true};
    auto close = [&] {
      if (!open.entries.empty()) batches.push_back(std::move(open));
      open = BroadcastBatch{reader, {}, 0, true};
    };
    for (size_t e = 0; e < reader_of.size(); ++e) {
      if (reader_of[e] != reader || entry_bytes[e] == 0) continue;
      if (alone[e] || entry_bytes[e] >= batch_bytes) {
        batches.push_back(BroadcastBatch{reader, {e}, entry_bytes[e], false});
        continue;
      }
      if (open.bytes + entry_bytes[e] > batch_bytes) close();
      open.entries.push_back(e);
      open.bytes += entry_bytes[e];
    }
    close();
  }
  return batches;
}

Status CheckDevices(const ShardedState& targets) {
  for (const TensorPiece& piece : targets.pieces()) {
    if (piece.space != MemorySpace::kCuda) continue;
    Status usable = CudaCopier(piece.device).status();
    if (!usable.ok()) return usable.WithContext("tensor '" + piece.name + "'");
  }
  return Status::Ok();
}

Result<Match> MatchEntries(Communicator& comm, const Manifest& manifest, const std::string& dir,
                           const ShardedState& targets, const LoadOptions& options, LoadReport* report,
                           const TiedTargets* tied) {
  Match match;
  match.local = MatchPieces(manifest, targets, options);
  if (tied != nullptr) {
    for (size_t p : tied->compared_pieces()) {
      if (const long e = match.local.entry_of_piece[p]; e >= 0) match.local.wants[static_cast<size_t>(e)].compared = true;
    }
  }
  report->missing = match.local.missing;
  const int same_world_rank = manifest.world_size == comm.size() ? comm.rank() : -1;
  ValueMatch values =
      options.wanted_values ? MatchValues(manifest, *options.wanted_values, options, same_world_rank) : ValueMatch{};
  // The wants, a byte per entry, then a byte per blob: whether this rank loads that global value.
  // A value is unexpected only when no rank loads it, as a tensor is (one rank restores a
  // scheduler's values, another does not pass them).
  std::string mine = EncodeEntryWants(match.local.wants);
  mine.resize(manifest.entries.size(), '\0');
  std::vector<std::string> blob_names;
  if (options.wanted_values) {
    const std::set<std::string> unloaded(values.unexpected.begin(), values.unexpected.end());
    blob_names.reserve(manifest.blobs.size());
    for (const BlobRecord& b : manifest.blobs) {
      blob_names.push_back(options.rename ? options.rename(b.name) : b.name);
      mine += b.scope == BlobScope::kGlobal && !unloaded.count(blob_names.back()) ? '\1' : '\0';
    }
  }
  std::vector<std::string> all_wants;
  SC_RETURN_IF_ERROR(comm.AllGather(mine, &all_wants));
  match.demand = CombineWants(all_wants, manifest.entries.size());
  report->unexpected = UnwantedEntries(manifest, match.demand);
  if (!values.unexpected.empty() && !blob_names.empty()) {
    std::set<std::string> loaded_somewhere;
    for (size_t k = 0; k < blob_names.size(); ++k) {
      const size_t at = manifest.entries.size() + k;
      for (const std::string& theirs : all_wants) {
        if (at < theirs.size() && theirs[at] == '\1') loaded_somewhere.insert(blob_names[k]);
      }
    }
    const std::set<std::string> own(values.own_unloaded.begin(), values.own_unloaded.end());
    for (const std::string& name : values.unexpected) {
      if (!own.count(name) && loaded_somewhere.count(name)) values.loaded_elsewhere.push_back(name);
    }
    report->values_loaded_elsewhere = values.loaded_elsewhere;
  }
  // A target the state refused is missing from it: that refusal is the cause, not what is missing.
  Status refused = targets.CheckNothingRefused();
  if (refused.ok() && tied != nullptr) refused = tied->refusal();
  Status verdict = !refused.ok() ? refused
                                  : MatchVerdict(match.local.status, options.strict, dir, report->missing,
                                                 report->unexpected, values,
                                                 options.wanted_values ? *options.wanted_values : std::vector<std::string>{});
  // Every rank, strict or not, with the same demand: the same collective on every rank. A
  // non-strict load reports them (LoadReport::loaded_in_part).
  SC_ASSIGN_OR_RETURN(const std::vector<PartlyLoaded> in_part,
                      EntriesLoadedInPart(comm, manifest, targets, match.local, match.demand));
  std::vector<std::string> undecided, undecided_notes, in_part_notes;  // in_part's names: the report's
  for (const PartlyLoaded& p : in_part) {
    const std::string counted = std::to_string(p.loaded), of = std::to_string(p.elements);
    if (p.kind == PartlyLoaded::kUndecided) {
      undecided.push_back(p.name);
      undecided_notes.push_back(counted + " elements for " + of);
      continue;
    }
    report->loaded_in_part.push_back(p.name);
    // The counts are sums over the ranks' pieces, not of distinct elements: pieces that overlap
    // and still fall short hold fewer distinct elements than counted ("N of M" said otherwise).
    in_part_notes.push_back(counted + " elements for " + of +
                            (p.kind == PartlyLoaded::kShort         ? ""
                             : p.kind == PartlyLoaded::kOverlapping ? ", but some loaded more than once and others by no rank"
                                                                    : ", but some loaded by no rank"));
  }
  if (!undecided.empty() && comm.rank() == 0) {
    SC_LOG(kWarn) << "checkpoint " << dir << ": the ranks' parts of these tensors hold more elements than the "
                  << "tensor, not each element equally often, and are cut too finely to check element by element: "
                  << NameList(undecided, undecided_notes) << ". Some element may be loaded by no rank (every replica "
                  << "group loading the same shard, say); the load goes on: check the ranks' layouts";
  }
  if (verdict.ok() && options.strict && !report->loaded_in_part.empty()) {
    verdict = InvalidArgument("checkpoint " + dir + " has entries no rank loads all of (the ranks' pieces together " +
                              "leave elements out: a rank left the name out, a layout stops short, or two ranks " +
                              "load the same part): " + NameList(report->loaded_in_part, in_part_notes) +
                              " (a non-strict load loads the rest and reports them)");
  }
  SC_RETURN_IF_ERROR(AgreeOnStatus(comm, verdict));
  SC_ASSIGN_OR_RETURN(ReplicatedReadChoice choice, AgreeOnBroadcast(comm, options, dir));
  match.reader_of = AssignReaders(match.demand, choice.broadcast, comm.size());
  match.same_pages = choice.same_pages;
  // Device pieces need a device this process can use; refuse on every rank before any reads.
  SC_RETURN_IF_ERROR(AgreeOnStatus(comm, CheckDevices(targets)));
  return match;
}

SharedBlocks BlocksEveryRankReads(const Manifest& manifest, const Match& match, int rank, int world) {
  SharedBlocks shared{rank, world, {}};
  if (!match.same_pages || world <= 1) return shared;
  auto mark = [&](uint32_t file, uint64_t offset, uint64_t bytes) {
    if (bytes == 0 || file >= manifest.files.size() || !manifest.files[file].checksums) return;
    std::vector<bool>& blocks = shared.by_file[file];
    if (blocks.empty()) blocks.resize(AlignUp(manifest.files[file].table_offset, kBlockSize) / kBlockSize, false);
    const uint64_t last = std::min<uint64_t>((offset + bytes - 1) / kBlockSize, blocks.size() - 1);
    for (uint64_t b = offset / kBlockSize; b <= last; ++b) blocks[b] = true;
  };
  shared.by_file.resize(manifest.files.size());
  for (size_t e = 0; e < manifest.entries.size(); ++e) {
    if (!match.demand.wanted_any[e] || !match.demand.wanted_whole_by_all[e] || match.reader_of[e] >= 0) continue;
    for (const ChunkRecord& c : manifest.entries[e].chunks) mark(c.file, c.offset, c.bytes);
  }
  for (const BlobRecord& b : manifest.blobs) {
    if (b.scope == BlobScope::kGlobal) mark(b.file, b.offset, b.bytes);
  }
  return shared;
}

// ---- 4.
ReadWork PlanReads(const Manifest& manifest, const ShardedState& targets, const Match& match, int rank, int world,
                   const ReadPlanOptions& plan_options, bool verified_from_memory, LoadReport* report) {
  ReadWork work;
  ReadTargets& read_targets = work.targets;
  // Sized up front: at thousands of pieces, growing these one push at a time was most of this
  // phase (each regrowth faults in fresh pages, slow on a VM).
  const size_t most = targets.pieces().size() + manifest.blobs.size();
  read_targets.base.reserve(most);
  read_targets.names.reserve(most);
  read_targets.copier.reserve(most);
  ChunkIndex index(&manifest);
  std::vector<CopyRequest> copies;
  copies.reserve(most);  // one each at the saved layout
  // As in MatchPieces: the entries of pieces in the caller's order are cold and scattered, so
  // the entry of the piece 8 ahead is fetched, and 4 ahead its shape and chunk list.
  const std::vector<long>& entry_of = match.local.entry_of_piece;
  constexpr size_t kEntryAhead = 8, kDataAhead = 4;
  for (size_t p = 0; p < targets.pieces().size(); ++p) {
    if (p + kEntryAhead < entry_of.size() && entry_of[p + kEntryAhead] >= 0) {
      __builtin_prefetch(&manifest.entries[static_cast<size_t>(entry_of[p + kEntryAhead])]);
    }
    if (p + kDataAhead < entry_of.size() && entry_of[p + kDataAhead] >= 0) {
      const EntryRecord& ahead = manifest.entries[static_cast<size_t>(entry_of[p + kDataAhead])];
      __builtin_prefetch(ahead.shape.data());
      __builtin_prefetch(ahead.chunks.data());
    }
    if (entry_of[p] < 0) continue;
    size_t entry = static_cast<size_t>(entry_of[p]);
    if (match.reader_of[entry] >= 0 && match.reader_of[entry] != rank) continue;
    const TensorPiece& piece = targets.pieces()[p];
    DeviceCopier* copier = nullptr;
    if (piece.space == MemorySpace::kCuda) {
      copier = CudaCopier(piece.device).value();  // checked by CheckDevices
      work.any_device_target = true;
    }
    PlanPieceCopy(manifest, index, entry, piece.layout, static_cast<uint32_t>(read_targets.base.size()), &copies);
    read_targets.base.push_back(static_cast<unsigned char*>(piece.data));
    read_targets.names.push_back(manifest.entries[entry].name);
    read_targets.copier.push_back(copier);
  }
  std::vector<std::pair<std::string, const BlobRecord*>> blob_reads;
  for (const BlobRecord& b : manifest.blobs) {
    if (b.scope == BlobScope::kGlobal) {
      blob_reads.emplace_back(b.name, &b);
    } else if (manifest.world_size == world) {
      if (b.rank == rank) blob_reads.emplace_back(b.name, &b);
    } else {
      BlobResult& result = report->blobs[b.name];
      result.available = false;
      result.reason = "per-rank blob saved by " + std::to_string(manifest.world_size) +
                      " ranks; this job has " + std::to_string(world) + ", so it is not restored";
    }
  }
  for (const auto& [name, saved_by] : PerRankValuesLeft(manifest)) {
    auto [result, fresh] = report->blobs.try_emplace(name);
    if (!fresh) continue;  // a value of that name the checkpoint holds
    result->second.available = false;
    result->second.reason = PerRankValueLeftReason(saved_by);
  }
  for (auto& [name, record] : blob_reads) {
    BlobResult& result = report->blobs[name];
    result.available = true;
    result.reason.clear();
    result.bytes.assign(record->bytes, '\0');
    copies.push_back(CopyRequest{record->file, record->offset, record->bytes,
                                 static_cast<uint32_t>(read_targets.base.size()), 0});
    read_targets.base.push_back(reinterpret_cast<unsigned char*>(result.bytes.data()));
    read_targets.names.push_back(work.labels.emplace_back("blob " + name));
    read_targets.copier.push_back(nullptr);
  }
  // Into device memory each extent's copies are waited for before its buffer is reused: small
  // extents would cost a wait each.
  const ReadPlanOptions planned = PlanOptionsFor(plan_options, verified_from_memory && !work.any_device_target);
  work.plan = CoalesceReads(std::move(copies), planned);
  work.max_extent = planned.max_extent;
  work.shared = BlocksEveryRankReads(manifest, match, rank, world);
  return work;
}

StagingSize SizeStaging(const ReadPlan& plan, size_t staging_buffers, uint64_t max_extent) {
  uint64_t largest = kBlockSize;
  for (const ReadExtent& e : plan.extents) largest = std::max(largest, e.length);
  const uint64_t budget = staging_buffers * max_extent;
  // At most 128 buffers in flight, however many were asked for (clamp needs low <= high).
  const uint64_t at_least = std::min<uint64_t>(std::max<size_t>(staging_buffers, 1), 128);
  return StagingSize{static_cast<size_t>(std::clamp<uint64_t>(budget / largest, at_least, 128)), largest};
}

// ---- 5.
Status ReadExtents(const std::string& dir, const Manifest& manifest, const ReadWork& work,
                   const LoadOptions& options, ReadStats* stats, FileReadAhead* ahead) {
  FileInMemory in_memory;
  if (ahead != nullptr) {
    const std::string name = BaseName(ahead->path());
    for (uint32_t f = 0; f < manifest.files.size(); ++f) {
      // The file at the size the manifest records: the bytes read are the file it describes (a
      // file of another size is read the normal way, whose check names it).
      if (manifest.files[f].name == name && manifest.files[f].size == ahead->bytes()) {
        in_memory = {f, ahead->data(), ahead->bytes(),
                     [ahead](uint64_t offset, uint64_t length) { return ahead->WaitFor(offset, length); }};
      }
    }
  }
  const StagingSize staging = SizeStaging(work.plan, options.staging_buffers, work.max_extent);
  SC_ASSIGN_OR_RETURN(StagingLease lease, StagingLease::Acquire(staging.buffers, staging.buffer_bytes,
                                                               StagingHostAllocator(work.any_device_target),
                                                               options.keep_staging, options.staging_buffers));
  IoOptions io_options = options.io;
  io_options.queue_depth = std::max<size_t>(io_options.queue_depth, lease.pool()->count() + 1);
  std::unique_ptr<IoEngine> io = CreateIoEngine(io_options);
  const Status read = ExecuteReadPlan(io.get(), lease.pool(), dir, manifest, work.plan, work.targets,
                                      options.verify_checksums, stats, in_memory, work.shared);
  if (ahead != nullptr) {  // read, whether the plan took any of it or not
    ahead->WaitFor(0, ahead->bytes());
    stats->data_bytes_read += ahead->bytes_completed();
    stats->bytes_read_ahead += ahead->bytes_completed();
  }
  return read;
}

// ---- 6.
Status ShareReplicated(Communicator& comm, const Manifest& manifest, const ShardedState& targets,
                       const Match& match, const LoadOptions& options, LoadReport* report) {
  const std::vector<long>& entry_of_piece = match.local.entry_of_piece;
  const size_t entries = manifest.entries.size();
  // Each replicated entry's first whole piece here: it receives the broadcast (or is read), and
  // the entry's other pieces on this rank are copied from it. Every rank wants each such entry
  // whole, so every rank finds one, of the same size.
  std::vector<const TensorPiece*> first(entries, nullptr);
  for (size_t p = 0; p < targets.pieces().size(); ++p) {
    const long entry = entry_of_piece[p];
    if (entry >= 0 && match.reader_of[entry] >= 0 && first[entry] == nullptr && IsWhole(targets.pieces()[p])) {
      first[entry] = &targets.pieces()[p];
    }
  }
  // The entry's other pieces on this rank, copied from the first: (entry, piece), by entry.
  std::vector<std::pair<size_t, const TensorPiece*>> others;
  for (size_t p = 0; p < targets.pieces().size(); ++p) {
    const long entry = entry_of_piece[p];
    if (entry >= 0 && first[entry] != nullptr && first[entry] != &targets.pieces()[p]) {
      others.emplace_back(static_cast<size_t>(entry), &targets.pieces()[p]);
    }
  }
  std::stable_sort(others.begin(), others.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<uint64_t> bytes(entries, 0);
  std::vector<bool> alone(entries, false);
  for (size_t e = 0; e < entries; ++e) {
    if (first[e] != nullptr) bytes[e] = static_cast<uint64_t>(first[e]->bytes);
    alone[e] = match.demand.whole_on_device_everywhere[e] && options.device_comm != nullptr;
  }
  // A local copy's failure stops this rank's copies but not its broadcasts.
  Status copied;
  std::vector<unsigned char> packed;
  for (const BroadcastBatch& batch : BatchBroadcasts(match.reader_of, bytes, alone, comm.size(), std::max<uint64_t>(options.broadcast_batch_bytes, 1))) {
    const bool reading = comm.rank() == batch.reader;
    for (size_t e : batch.entries) {
      if (copied.ok()) copied = Failpoint("load.replicate", "copy of tensor '" + first[e]->name + "'");
    }
    if (!batch.packed) {
      const size_t e = batch.entries[0];
      SC_RETURN_IF_ERROR(BroadcastPiece(comm, options.device_comm, match.demand.whole_on_device_everywhere[e], *first[e],
                                        batch.reader, &copied));
    } else {
      // Many small entries, one collective: the reader packs them, the others unpack.
      packed.resize(batch.bytes);
      auto each = [&](bool into_buffer) {
        uint64_t at = 0;
        for (size_t e : batch.entries) {
          unsigned char* slot = packed.data() + at;
          at += bytes[e];
          if (!copied.ok()) continue;
          if (first[e]->space == MemorySpace::kHost) {  // no piece copied per entry for the common case
            if (into_buffer) std::memcpy(slot, first[e]->data, bytes[e]);
            else std::memcpy(first[e]->data, slot, bytes[e]);
            continue;
          }
          TensorPiece view = *first[e];
          view.data = slot;
          view.space = MemorySpace::kHost;
          Status status = into_buffer ? CopyPiece(view, *first[e]) : CopyPiece(*first[e], view);
          if (!status.ok()) copied = status.WithContext("tensor '" + first[e]->name + "'");
        }
      };
      if (reading) each(true);
      SC_RETURN_IF_ERROR(comm.Broadcast(packed.data(), packed.size(), batch.reader));
      if (!reading) each(false);
    }
    if (!reading) report->bytes_received += batch.bytes;
    for (size_t e : batch.entries) {
      auto it = std::lower_bound(others.begin(), others.end(), e, [](const auto& o, size_t v) { return o.first < v; });
      for (; it != others.end() && it->first == e && copied.ok(); ++it) {
        Status status = CopyPiece(*it->second, *first[e]);
        if (!status.ok()) copied = status.WithContext("tensor '" + it->second->name + "'");
      }
    }
  }
  return AgreeOnStatus(comm, copied);
}

}  // namespace shardckpt::load_phases
