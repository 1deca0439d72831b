// Offline conversions into sharded checkpoints (docs/architecture.md):
//   import:  a .pt (torch.save), a .safetensors file or a Hugging Face sharded set (its
//            *.safetensors.index.json or the folder holding it) -> a checkpoint for N ranks
//   reshard: a checkpoint saved by any N -> a checkpoint for M ranks, without a job
// Layout policies: flat (FSDP/ZeRO flat shards), dim0 (torch.chunk along dim 0; 0-d tensors
// replicated) and replicated (each tensor written once, spread over the ranks' files).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "shardckpt/engine/model/layout.h"

namespace shardckpt {

Result<Layout> PolicyLayout(const std::string& policy, const Shape& shape, int world, int rank);

struct ConvertOptions {
  int world_size = 1;
  std::string layout = "flat";
  // Called as the work goes on, and once more before anything is written and before the output
  // is committed (so `done` may repeat, and `total` may be 0); a failed Status (a tool's
  // Ctrl-C) stops the work there, with its partial output removed, and is what the call returns.
  std::function<Status(uint64_t done, uint64_t total)> progress;
};

struct ConvertReport {
  std::string path;  // the committed checkpoint
  uint64_t tensors = 0;
  uint64_t bytes = 0;
  std::vector<std::string> skipped;  // values import cannot keep, or per-rank blobs (reshard): "name (why)"
  std::vector<std::string> values;   // non-tensor values kept as blobs (import: of a .pt)
};


Result<ConvertReport> ImportFile(const std::string& file, const std::string& root, const ConvertOptions& options);
Result<ConvertReport> Reshard(const std::string& checkpoint, const std::string& root, const ConvertOptions& options);

}  // namespace shardckpt
