// bench_plan_scale: the planner and manifest at scale, no I/O. Builds a manifest of
// --entries x --save-ranks chunks (FSDP flat shards: every entry cut into one flat range per
// saving rank), then times encode, decode (parse + full validation, coverage included) and
// planning a load onto --load-ranks ranks that want dim-0 blocks (every rank's plan, as the job
// would compute it). Last line JSON.
//
// Then the metadata phase of a save (save step 1, save_phases::DecidePlan) of the same layout,
// first and repeated with a SavePlanCache (issue 14 part 6): one process holds every piece of
// the --entries x --save-ranks layout (a million pieces by default), so the gather, planning and
// broadcast run on one rank over the single-process communicator; the repeat only hashes the
// rank's description and votes. Rank 0's lock, cleanup and temp folder are in both (a folder in
// --dir, removed after).
//
//   build/bin/bench_plan_scale --entries 1000 --save-ranks 1000 --load-ranks 768
//
// Manifest encode and decode (issue 14 part 5), each timed alone, best of --manifest-repeats:
// --layout flat is the layout above; --layout small is --entries tensors of 1 to 4096 elements
// (log-uniform, fixed seed; 1-d, some 16-column matrices, every 97th a 0-d step counter) in the
// mix of dtypes of tests/packing/small_tensors.py, cut on dim 0 into one piece per saving rank as
// `import`/`reshard --layout dim0` cut them (torch.chunk: a tensor of fewer rows than ranks leaves
// the last ranks empty pieces, which are not stored; a 0-d tensor is rank 0's), packed as a save
// packs them (format 1.1). --manifest-only stops after the manifest figures.
//   build/bin/bench_plan_scale --layout small --entries 100000 --save-ranks 64 --manifest-only
#include <boost/program_options.hpp>

#include <cstdio>
#include <ctime>
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <random>

#include "benchmarks/bench_util.h"
#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/save_phases.h"
#include "shardckpt/engine/core/save_plan_cache.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/engine/model/chunk_packing.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/model/manifest_wire.h"
#include "shardckpt/engine/model/read_plan.h"
#include "shardckpt/io/checksum.h"

using namespace shardckpt;
using namespace shardckpt::bench;
namespace po = boost::program_options;

int main(int argc, char** argv) {
  po::options_description flags("bench_plan_scale");
  flags.add_options()("help", "this text")
      ("entries", po::value<int>()->default_value(1000), "tensors")
      ("save-ranks", po::value<int>()->default_value(1000), "ranks (files) the checkpoint was saved by")
      ("load-ranks", po::value<int>()->default_value(768), "ranks of the loading job")
      ("dir", po::value<std::string>()->default_value("/tmp"), "where the save phase makes its temp folders")
      ("repeats", po::value<int>()->default_value(3), "repeat saves timed (the best is reported)")
      ("layout", po::value<std::string>()->default_value("flat"), "flat (16 MiB tensors, flat shards) or small (many small tensors, dim 0)")
      ("manifest-repeats", po::value<int>()->default_value(3), "manifest encodes and decodes timed (the best is reported)")
      ("manifest-only", "stop after the manifest encode and decode figures")
      ("decode-threads", po::value<int>()->default_value(1),
       "threads the timed manifest decode reads the entries list on (a load's ranks use 1 each; the tools up to 4)")
      ("write-manifest", po::value<std::string>(), "also write the encoded manifest there (to look at it, or to time other parsers on it)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, flags), vm);
  if (vm.count("help")) {
    std::cout << flags << "\n";
    return 0;
  }
  const int entries = vm["entries"].as<int>(), n = vm["save-ranks"].as<int>(), m = vm["load-ranks"].as<int>();
  const std::string layout = vm["layout"].as<std::string>();
  if (layout != "flat" && layout != "small") {
    std::fprintf(stderr, "--layout is flat or small\n");
    return 2;
  }
  // Tensors of 4096 x 1024 float32 (16 MiB), so a flat shard cuts through rows.
  const Shape shape = {4096, 1024};
  Manifest manifest;
  manifest.world_size = n;
  std::vector<uint64_t> file_end(n, 0);
  if (layout == "flat") {
    for (int e = 0; e < entries; ++e) {
      EntryRecord entry{"model.layers." + std::to_string(e) + ".weight", DType::kFloat32, shape, {}};
      for (int r = 0; r < n; ++r) {
        Layout l = FlatShardLayout(shape, n, r);
        uint64_t bytes = static_cast<uint64_t>(l.end - l.begin) * 4;
        if (bytes == 0) continue;
        entry.chunks.push_back(ChunkRecord{static_cast<uint32_t>(r), file_end[r], bytes, l});
        file_end[r] = AlignUp(file_end[r] + bytes, kBlockSize);
      }
      manifest.entries.push_back(std::move(entry));
    }
  } else {
    std::mt19937_64 rng(14);
    std::uniform_real_distribution<double> log_numel(0, std::log(4096.0));
    const DType dtypes[] = {DType::kFloat32, DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kInt64};
    const char* kinds[] = {"bias", "norm.weight", "norm.bias", "scale", "exp_avg", "exp_avg_sq", "step", "w"};
    for (int e = 0; e < entries; ++e) {
      const DType dtype = dtypes[e % 5];
      const int64_t numel = std::max<int64_t>(1, static_cast<int64_t>(std::exp(log_numel(rng))));
      Shape s = e % 97 == 0 ? Shape{} : e % 3 == 0 && numel >= 32 ? Shape{numel / 16, 16} : Shape{numel};
      EntryRecord entry{"layers." + std::to_string(e / 8) + "." + kinds[e % 8] + "." + std::to_string(e), dtype, s, {}};
      for (int r = 0; r < n; ++r) {
        Layout l = s.empty() ? Layout::Whole() : ChunkLayout(s, 0, n, r);
        if (s.empty() && r > 0) continue;  // a 0-d tensor is rank 0's alone
        const uint64_t count = static_cast<uint64_t>(NumElements(LocalShape(l, s)).value());
        if (count == 0) continue;  // an empty piece (fewer rows than ranks) is not stored
        const uint64_t bytes = count * DTypeSize(dtype);
        const uint64_t offset = ChunkOffset(file_end[r], bytes, DTypeSize(dtype));
        entry.chunks.push_back(ChunkRecord{static_cast<uint32_t>(r), offset, bytes, l});
        file_end[r] = offset + bytes;
      }
      manifest.entries.push_back(std::move(entry));
    }
    for (uint64_t& end : file_end) end = AlignUp(end, kBlockSize);
  }
  size_t chunks = 0;
  for (const auto& e : manifest.entries) chunks += e.chunks.size();
  for (int r = 0; r < n; ++r) {
    char name[32];
    std::snprintf(name, sizeof(name), "rank-%05d.bin", r);
    manifest.files.push_back(FileRecord{name, DataFileSize(file_end[r]), file_end[r],
                                        std::vector<uint64_t>(TablePages(file_end[r]), 0x1234)});
  }
  // Encode and decode, each timed alone (best of --manifest-repeats): rank 0's encode at commit,
  // rank 0's decode with the seal and full validation (coverage included), and the other ranks'
  // parse of the same text (run at the same time as rank 0's).
  const int manifest_repeats = std::max(1, vm["manifest-repeats"].as<int>());
  // Wall time and this process's CPU time (the machine may be shared: CPU time is what the work
  // itself costs, wall time what it took while others ran).
  auto cpu_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
  };
  struct Best {
    double wall = 1e9, cpu = 1e9;
  };
  auto timed = [&](Best* best, const auto& work) {
    const double wall = NowSeconds(), cpu = cpu_seconds();
    work();
    best->wall = std::min(best->wall, NowSeconds() - wall);
    best->cpu = std::min(best->cpu, cpu_seconds() - cpu);
  };
  Best encode_best, decode_best, message_encode_best, message_decode_best;
  const size_t decode_threads = static_cast<size_t>(std::max(1, vm["decode-threads"].as<int>()));
  std::string text;
  for (int i = 0; i < manifest_repeats; ++i) {
    std::string encoded;
    timed(&encode_best, [&] { encoded = EncodeManifest(manifest).value(); });
    if (i > 0 && encoded != text) {
      std::fprintf(stderr, "the same manifest encoded to different text\n");
      return 1;
    }
    text = std::move(encoded);
  }
  for (int i = 0; i < manifest_repeats; ++i) {
    Result<Manifest> back = Manifest{};
    timed(&decode_best, [&] { back = DecodeManifest(text, "bench", decode_threads); });
    if (!back.ok()) {
      std::fprintf(stderr, "%s\n", back.status().ToString().c_str());
      return 1;
    }
    if (back->entries.size() != manifest.entries.size()) return 1;
  }
  // A load's rank 0 sends the checked manifest to the other ranks as a binary message
  // (manifest_wire.h): its encode on rank 0, its decode on every other rank.
  std::string message;
  for (int i = 0; i < manifest_repeats; ++i) {
    timed(&message_encode_best, [&] { message = EncodeManifestMessage(manifest); });
  }
  for (int i = 0; i < manifest_repeats; ++i) {
    Result<Manifest> back = Manifest{};
    timed(&message_decode_best, [&] { back = DecodeManifestMessage(message, "bench"); });
    if (!back.ok() || back->entries.size() != manifest.entries.size()) return 1;
  }
  std::printf("bench_plan_scale manifest: layout %s, %d entries x %d saving ranks = %zu chunks, manifest %llu bytes "
              "(%.1f MiB), best of %d, wall (cpu): encode %.3fs (%.3fs), decode+validate on %zu thread(s) %.3fs (%.3fs); message to "
              "the other ranks %.1f MiB: encode %.3fs (%.3fs), decode %.3fs (%.3fs)\n",
              layout.c_str(), entries, n, chunks, static_cast<unsigned long long>(text.size()), text.size() / 1048576.0,
              manifest_repeats, encode_best.wall, encode_best.cpu, decode_threads, decode_best.wall, decode_best.cpu,
              message.size() / 1048576.0, message_encode_best.wall, message_encode_best.cpu, message_decode_best.wall,
              message_decode_best.cpu);
  if (vm.count("write-manifest") && !WriteFileAtomic(vm["write-manifest"].as<std::string>(), text, "bench").ok()) return 1;
  if (vm.count("manifest-only")) {
    PrintJson({{"layout", "\"" + layout + "\""}, {"entries", Num(entries)}, {"save_ranks", Num(n)},
               {"chunks", Num(double(chunks))}, {"manifest_bytes", Num(double(text.size()))},
               {"encode_s", Num(encode_best.wall)}, {"decode_s", Num(decode_best.wall)},
               {"encode_cpu_s", Num(encode_best.cpu)}, {"decode_cpu_s", Num(decode_best.cpu)},
               {"decode_threads", Num(double(decode_threads))}, {"message_bytes", Num(double(message.size()))}, {"message_encode_s", Num(message_encode_best.wall)},
               {"message_decode_s", Num(message_decode_best.wall)}, {"message_encode_cpu_s", Num(message_encode_best.cpu)},
               {"message_decode_cpu_s", Num(message_decode_best.cpu)}});
    return 0;
  }
  if (layout != "flat") {
    std::fprintf(stderr, "planning and the save phase are timed for --layout flat only (add --manifest-only)\n");
    return 2;
  }
  const std::string& json = text;
  const double encode = encode_best.wall, decode = decode_best.wall, message_decode = message_decode_best.wall;
  Result<Manifest> decoded = DecodeManifest(json, "bench");
  if (!decoded.ok()) return 1;
  double t0 = NowSeconds();
  ChunkIndex index(&*decoded);
  uint64_t extents = 0, copies_total = 0, wanted = 0, read = 0;
  for (int r = 0; r < m; ++r) {
    std::vector<WantedPiece> want;
    for (int e = 0; e < entries; ++e) want.push_back(WantedPiece{static_cast<size_t>(e), ChunkLayout(shape, 0, m, r), static_cast<uint32_t>(e)});
    std::vector<CopyRequest> copies;
    PlanPieceCopies(*decoded, index, want, &copies);
    copies_total += copies.size();
    ReadPlan plan = CoalesceReads(std::move(copies), ReadPlanOptions{});
    extents += plan.extents.size();
    wanted += plan.bytes_wanted;
    read += plan.bytes_read;
  }
  double plan_all = NowSeconds() - t0;
  std::printf("bench_plan_scale: %d entries x %d saving ranks = %zu chunks, manifest %.1f MiB; plan for %d ranks\n", entries,
              n, chunks, json.size() / 1048576.0, m);
  std::printf("  encode %.3fs, decode+validate %.3fs (rank 0), message decode %.3fs (other ranks), plan all %d ranks %.3fs (%.2f ms per rank): %llu copies, %llu extents, "
              "read amplification %.4f\n",
              encode, decode, message_decode, m, plan_all, plan_all * 1000 / m, static_cast<unsigned long long>(copies_total),
              static_cast<unsigned long long>(extents), double(read) / double(wanted));
  // The save's metadata phase, first and repeated.
  ShardedState state;
  static char dummy[1];  // never read: the metadata phase looks at the descriptions only
  for (const EntryRecord& e : manifest.entries) {
    for (const ChunkRecord& c : e.chunks) {
      if (!state.AddTensor(e.name, e.dtype, e.shape, c.layout, dummy).ok()) return 1;
    }
  }
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  const std::string root = JoinPath(vm["dir"].as<std::string>(), "bench_plan_scale." + RandomId());
  SavePlanCache cache;
  SaveOptions save_options;
  save_options.plan_cache = &cache;
  auto decide = [&](int64_t step) -> double {
    double start = NowSeconds();
    Result<save_phases::PlannedSave> planned = save_phases::DecidePlan(*comm, root, step, state, save_options);
    double seconds = NowSeconds() - start;
    if (!planned.ok() || !planned->decoded.ok()) {
      std::fprintf(stderr, "save plan: %s\n", planned.ok() ? planned->decoded.ToString().c_str() : planned.status().ToString().c_str());
      std::exit(1);
    }
    RemoveTree(JoinPath(root, planned->temp_name)).IgnoreError();
    return seconds;
  };
  const double first_save = decide(1);
  double repeat_save = 1e9;
  for (int i = 0; i < vm["repeats"].as<int>(); ++i) repeat_save = std::min(repeat_save, decide(2 + i));
  RemoveTree(root).IgnoreError();
  if (cache.plans_made != 1 || cache.plans_reused != static_cast<uint64_t>(vm["repeats"].as<int>())) {
    std::fprintf(stderr, "the repeat saves did not reuse the plan\n");
    return 1;
  }
  std::printf("  save metadata phase (one rank holding all %zu pieces): first %.3fs, repeat %.4fs (%.1f%% of the first)\n",
              state.pieces().size(), first_save, repeat_save, 100 * repeat_save / first_save);
  PrintJson({{"chunks", Num(double(chunks))}, {"manifest_mib", Num(json.size() / 1048576.0)}, {"encode_s", Num(encode)},
             {"decode_s", Num(decode)}, {"message_decode_s", Num(message_decode)}, {"plan_s", Num(plan_all)}, {"load_ranks", Num(m)},
             {"read_amplification", Num(double(read) / double(wanted))}, {"save_plan_first_s", Num(first_save)},
             {"save_plan_repeat_s", Num(repeat_save)}, {"save_plan_repeat_ratio", Num(repeat_save / first_save)}});
  return 0;
}
