// `shardckpt export --format dcp`: a committed checkpoint as a PyTorch Distributed Checkpoint
// folder (engine/formats/dcp_writer.h) that torch 2.x's dcp.load reads at any world size, into
// DTensors or plain tensors, and dcp_to_torch_save converts. The chunking is kept: each chunk of
// the checkpoint becomes one DCP chunk (a flat-range chunk, which DCP cannot describe, the up to
// 2N-1 boxes it covers), written into `__<f>_0.distcp` for the data file `f` it came from, byte
// items first. Streaming: each chunk is read window by window through the verifying
// CheckpointReader, so memory is bounded by the window whatever the model size. `.metadata` is
// written last, so a folder without it is an export that did not finish.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "shardckpt/io/status.h"

namespace shardckpt {

struct DcpExportOptions {
  uint64_t window_bytes = 32u << 20;
  // Called as the work goes on, and once more before anything is written and before the output
  // is committed (so `done` may repeat, and `total` may be 0); a failed Status (a tool's
  // Ctrl-C) stops the work there, with its partial output removed, and is what the call returns.
  std::function<Status(uint64_t done, uint64_t total)> progress;
};

struct DcpExportReport {
  std::string checkpoint;
  std::string out;
  std::vector<std::string> files;    // written, .metadata last
  uint64_t tensors = 0;
  uint64_t chunks = 0;
  uint64_t byte_items = 0;
  uint64_t tensor_bytes = 0;
  uint64_t bytes_read = 0;           // from the checkpoint
  std::vector<std::string> skipped;  // "name: why", values DCP has no place for
};

// `out` must not exist or be an empty folder.
Result<DcpExportReport> ExportDcp(const std::string& checkpoint, const std::string& out, const DcpExportOptions& options);

}  // namespace shardckpt
