// Writes the fuzz targets' seed corpora from the project's own encoders, so every run starts from
// inputs the real readers accept, and from the hostile files the import tests refuse:
// make_seeds DIR -> DIR/{manifest,unpickle,import,safetensors,planner}/.
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shardckpt/engine/model/layout.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/formats/dcp_writer.h"
#include "shardckpt/engine/formats/safetensors.h"
#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"
#include "tests/torch_files.h"

using namespace shardckpt;

namespace {

void Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::ofstream(JoinPath(dir, name), std::ios::binary) << bytes;
}

Manifest SampleManifest(int world, bool with_blobs) {
  Manifest m;
  m.step = 1200;
  m.world_size = world;
  m.created.time = "2026-11-30T00:00:00Z";
  m.created.shardckpt_version = "0.1.0";
  m.created.user["run"] = "seed";
  const Shape shape{64, 48};
  EntryRecord w{"model.layers.0.weight", DType::kBFloat16, shape, {}};
  EntryRecord b{"model.layers.0.bias", DType::kFloat32, {48}, {}};
  for (int r = 0; r < world; ++r) {
    Layout rows = ChunkLayout(shape, 0, world, r);
    uint64_t bytes = static_cast<uint64_t>(rows.sizes[0] * rows.sizes[1] * 2);
    w.chunks.push_back(ChunkRecord{static_cast<uint32_t>(r), 0, bytes, rows});
    uint64_t end = AlignUp(bytes, kBlockSize);
    if (r == 0) {
      b.chunks.push_back(ChunkRecord{0, end, 48 * 4, Layout::Whole()});
      end = AlignUp(end + 48 * 4, kBlockSize);
    }
    if (with_blobs) {
      m.blobs.push_back(BlobRecord{"rng", BlobScope::kPerRank, r, static_cast<uint32_t>(r), end, 16});
      end = AlignUp(end + 16, kBlockSize);
    }
    m.files.push_back(FileRecord{"rank-0000" + std::to_string(r) + ".bin", DataFileSize(end), end,
                                 std::vector<uint64_t>(TablePages(end), 0x1234)});
  }
  m.entries = {w, b};
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::string root = argv[1];
  for (const char* target : {"manifest", "unpickle", "import", "safetensors", "planner", "dcp_metadata"}) {
    if (!MakeDirs(JoinPath(root, target)).ok()) return 1;
  }
  // Manifests: the unsealed text (the fuzz target seals it), as EncodeManifest writes it, and in
  // the older writers' layout (nlohmann's dump(1): keys sorted, one number per line).
  for (int world : {1, 2, 3}) {
    std::string sealed = EncodeManifest(SampleManifest(world, world != 2)).value();
    const std::string text = CheckSeal(sealed, "seed").value();
    Write(JoinPath(root, "manifest"), "world" + std::to_string(world), text);
    Write(JoinPath(root, "manifest"), "world" + std::to_string(world) + "-older", nlohmann::json::parse(text).dump(1));
  }
  // Pickles: a torch state_dict as consolidate writes it.
  std::vector<PickleTensor> tensors = {
      PickleTensor{"w", DType::kFloat32, {4, 3}, {3, 1}, 0, "0", 12},
      PickleTensor{"b", DType::kBFloat16, {3}, {1}, 0, "1", 3},
      PickleTensor{"step", DType::kInt64, {}, {}, 0, "2", 1},
  };
  Write(JoinPath(root, "unpickle"), "state_dict", PickleStateDict(tensors).value());
  Write(JoinPath(root, "unpickle"), "one", PickleStateDict({tensors[0]}).value());
  // ... and what torch's weights_only rules accept and refuse, bombs and cycles included.
  for (const testing::PickleCase& c : testing::WeightsOnlyCases()) Write(JoinPath(root, "unpickle"), c.name, c.pickle);
  Write(JoinPath(root, "unpickle"), "shared_reference_bomb", testing::SharedReferenceBomb(60));
  Write(JoinPath(root, "unpickle"), "object_flood", testing::ObjectFlood(4096));
  // Whole .pt files for the import target: honest views and every lying tensor record.
  std::vector<testing::TorchFileCase> files = testing::ValidTorchFiles();
  for (const testing::TorchFileCase& c : testing::HostileTensorRecords()) files.push_back(c);
  files.push_back(testing::TorchFileCase{"bomb", testing::SharedReferenceBomb(60), {}, ""});
  for (const testing::PickleCase& c : testing::WeightsOnlyCases()) {
    files.push_back(testing::TorchFileCase{"weights_only_" + c.name, c.pickle, {{"0", 8}}, c.refusal});
  }
  for (const testing::TorchFileCase& c : files) {
    if (!testing::WriteTorchFile(JoinPath(JoinPath(root, "import"), c.name), c).ok()) return 1;
  }
  // Safetensors: 8 bytes of data-area size, then the header JSON.
  std::vector<SafetensorsEntry> entries = {{"w", DType::kFloat32, {4, 3}, 0, 0},
                                           {"b", DType::kBFloat16, {3}, 0, 0}};
  std::string header = EncodeSafetensorsHeader(entries, {{"format", "pt"}}).value();
  uint64_t data_bytes = entries.back().end;
  std::string input(reinterpret_cast<const char*>(&data_bytes), 8);
  Write(JoinPath(root, "safetensors"), "two", input + header.substr(8));
  // Planner: its input is a byte stream of choices; random streams reach every branch.
  std::mt19937 rng(7);
  for (int i = 0; i < 16; ++i) {
    std::string bytes(64 + rng() % 192, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    Write(JoinPath(root, "planner"), "random" + std::to_string(i), bytes);
  }
  // DCP .metadata as `shardckpt export --format dcp` writes it (corpus/dcp_metadata/ holds what
  // torch 2.x's dcp.save wrote): a sharded tensor, a scalar, an empty one, a byte item.
  DcpMetadata md;
  md.checkpoint_id = "seed";
  md.tensors.push_back(DcpTensor{"w", DType::kBFloat16, {4, 3},
                                 {DcpChunk{{0, 0}, {2, 3}, DcpStorage{"__0_0.distcp", 0, 900}},
                                  DcpChunk{{2, 0}, {2, 3}, DcpStorage{"__1_0.distcp", 0, 900}}}});
  md.tensors.push_back(DcpTensor{"step", DType::kInt64, {}, {DcpChunk{{}, {}, DcpStorage{"__0_0.distcp", 900, 800}}}});
  md.tensors.push_back(DcpTensor{"empty", DType::kFloat32, {0, 5}, {}});
  md.bytes.push_back(DcpBytes{"epoch", DcpStorage{"__0_0.distcp", 1700, 700}});
  Write(JoinPath(root, "dcp_metadata"), "export", EncodeDcpMetadata(md));
  std::printf("seeds written under %s\n", root.c_str());
  return 0;
}
