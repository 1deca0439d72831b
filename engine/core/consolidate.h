// Streams a sharded checkpoint into one state-dict file (docs/architecture.md): PyTorch's zip
// format (torch.load(weights_only=True), mmap=True), safetensors (sharded with the Hugging
// Face index when a size limit is given) or GGUF (float tensors as they are). Headers first, then each tensor's bytes window by
// window, so memory stays bounded by the window and the I/O buffers whatever the model size
// (DCP's dcp_to_torch_save and DeepSpeed's zero_to_fp32 hold the whole model).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shardckpt/engine/formats/gguf_writer.h"
#include "shardckpt/engine/model/dtype.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

enum class ExportFormat { kTorch, kSafetensors, kGguf };

struct ConsolidateOptions {
  ExportFormat format = ExportFormat::kTorch;
  std::vector<std::string> include;  // globs; empty: everything
  std::vector<std::string> exclude;
  std::string strip_prefix;
  std::optional<DType> cast;         // floating entries only
  uint64_t max_shard_bytes = 0;      // safetensors: split into model-0000k-of-0000n files
  uint64_t window_bytes = 32u << 20;
  // gguf: general.architecture (required), general.name and any other keys, in this order.
  std::vector<GgufKeyValue> gguf_metadata;
  // Called as the work goes on, and once more before anything is written and before the output
  // is committed (so `done` may repeat, and `total` may be 0); a failed Status (a tool's
  // Ctrl-C) stops the work there, with its partial output removed, and is what the call returns.
  std::function<Status(uint64_t done, uint64_t total)> progress;
};

struct ConsolidateReport {
  std::string checkpoint;
  std::vector<std::string> files;    // written, in order (index file last)
  std::vector<std::string> sha256;   // of each of `files`, in the same order (an index's too)
  uint64_t entries = 0;
  uint64_t tensor_bytes = 0;         // written
  uint64_t bytes_read = 0;           // from the checkpoint
  uint64_t aliases = 0;              // .pt: entries written as a second name of one storage (tied)
  std::vector<std::string> values;   // .pt: non-tensor values (blobs) written into the state dict
  std::vector<std::string> skipped;  // blobs not written (safetensors holds tensors only; per-rank)
};

// The dtype a consolidation casts floating entries to, in either spelling: bf16 or bfloat16,
// fp16 or float16, fp32 or float32.
Result<DType> ParseCastDType(const std::string& name);

// Format from the extension: .pt/.pth/.bin -> torch, .safetensors -> safetensors, .gguf -> gguf.
Result<ExportFormat> FormatFromPath(const std::string& path);
Result<ConsolidateReport> Consolidate(const std::string& checkpoint, const std::string& out,
                                      const ConsolidateOptions& options);

}  // namespace shardckpt
