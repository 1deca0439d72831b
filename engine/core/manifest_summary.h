// What listing a root and choosing which checkpoints to keep need from a committed checkpoint's
// manifest: its creation time, world size, metrics and data files, without decoding all its
// entries again at every save.
//
// Why: a job that keeps the best K checkpoints by a metric ranks every committed checkpoint of
// its root after each save, on rank 0, before the save returns. Decoding each retained manifest in
// full (about 8 ms for 20,000 tensors, 0.2 s for 3 million chunks) made every save's commit grow
// with the number of checkpoints kept. A summary is remembered per process, keyed by the manifest
// file's path and identity (device, inode, size, modification and change times), so a manifest
// replaced under the same path is decoded again; the commit that writes a manifest records its
// summary as it publishes it, so a training job decodes none of its own.
//
// What that assumes: a manifest is never changed in place (the commit writes each one once, as
// a new file), and a file replaced under the same path has another inode or times. A manifest
// damaged in place later, with its times unchanged (bit rot), keeps its remembered metrics in
// this process; a load, `verify` and any other process read it whole and refuse it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

struct ManifestSummary {
  std::string time;  // created.time
  int world_size = 0;
  std::map<std::string, double> metrics;
  // Names and sizes only (no checksum tables): what CheckDataFiles compares with the folder.
  std::vector<FileRecord> files;
};

ManifestSummary SummaryOf(const Manifest& manifest);

// The summary of `checkpoint_dir`'s manifest.json: remembered, or read, checked (seal and
// validation, as a load would) and decoded. Data files are not looked at (CheckDataFiles of
// `files` does, against sizes the caller has).
Result<ManifestSummary> ReadManifestSummary(const std::string& checkpoint_dir);

// Records the summary of the manifest just published in `checkpoint_dir` (the commit, which
// built it), under the identity the file has now.
void RememberManifestSummary(const std::string& checkpoint_dir, ManifestSummary summary);
// Drops what is remembered of `checkpoint_dir` (retention removed it).
void ForgetManifestSummary(const std::string& checkpoint_dir);

// Manifests ReadManifestSummary has decoded in this process, and summaries remembered now
// (tests count them).
uint64_t ManifestSummaryDecodes();
size_t ManifestSummariesRemembered();

}  // namespace shardckpt
