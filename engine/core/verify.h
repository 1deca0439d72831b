// `shardckpt verify`: reads every byte of every data file of a checkpoint and checks each block
// against its checksum, each checksum-table page against the manifest, and each file's size.
// Unlike a load it does not stop at the first problem: it lists all of them, each naming the
// file, the offset and the entries whose bytes are there.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "shardckpt/io/status.h"

namespace shardckpt {

struct VerifyProblem {
  std::string file;
  uint64_t offset = 0;
  std::vector<std::string> entries;  // the tensors whose bytes are there
  std::vector<std::string> blobs;    // the values (blobs) whose bytes are there
  std::string what;
  // The bytes could not be read (a permission, an I/O error): not known to be damaged, and not
  // verified either. A missing or cut file, or a checksum that does not match, is damage.
  bool unreadable = false;
};

// For people: 'a', 'b', blob 'c' (eight at most, then a count; "the manifest" for a damaged manifest.json, "padding" when
// nothing is stored there, "past the end" for bytes after a data file's checksum table).
std::string HoldersText(const VerifyProblem& problem);

struct VerifyReport {
  std::string checkpoint;
  uint64_t files = 0;
  uint64_t bytes_checked = 0;
  uint64_t blocks_checked = 0;
  std::vector<VerifyProblem> problems;
  // False for a PyTorch DCP folder, which stores no checksums: only its structure was checked
  // (every file present, every chunk's record inside its file, parsed and sized to shape times
  // dtype, coverage exact, no overlaps); `note` says so, and how to gain checksums. True again
  // when every file had a .sha256 beside it (shardckpt export writes them) that was checked.
  bool checksums = true;
  // A PyTorch DCP folder: no block checksums, so blocks_checked stays 0 (its bytes, when checked,
  // are checked whole against .sha256 files).
  bool dcp = false;
  std::string note;
  // Whether a problem is damage, not only a file that could not be read.
  bool Damaged() const {
    for (const VerifyProblem& p : problems) {
      if (!p.unreadable) return true;
    }
    return false;
  }
};

// An error Status only when the checkpoint cannot be examined at all (no manifest, or one that
// cannot be read); damaged data files, and a damaged manifest (file "manifest.json", offset 0),
// come back as problems.
Result<VerifyReport> VerifyCheckpoint(const std::string& path,
                                      const std::function<void(uint64_t, uint64_t)>& progress = nullptr);

}  // namespace shardckpt
