// A repeat save's manifest file, written in two parts: the entry list while the ranks write their
// data files, the rest at the commit.
//
// Why: a save that reuses its kept plan commits the entries and blobs the save before it did
// (KeptManifest, save_phases.h): 2.6 MB of text at 20,000 tensors on 2 ranks, 28 MB at a million
// chunks. Only the head (step, time, metrics, the files' checksum tables) and the seal are new.
// Rank 0 copied and wrote the whole text after every rank had reported, a serial tail of every
// save on the one rank that commits (at 20,000 tensors, rank 0's commit took 5-6 ms at 2 ranks
// and 7 ms at 16; with this, 4 and 3 ms). Now the body goes to the temp folder's manifest.json
// on a thread of its own while the ranks write their data files (with O_DIRECT its whole blocks;
// on tmpfs all of it), and the commit writes the head's blocks and the rest: the body's last
// partial block and the seal.
//
// The layout that allows it: the head is padded with spaces to `head_room` bytes, a multiple of
// 4096 (JSON allows whitespace between fields; EncodeManifestWithBody pads it), so the body
// starts on a block boundary whatever this save's head says. A head that outgrew its room (many
// more metrics than before) is not this layout, and neither is a manifest built afresh: those the
// commit writes whole, as does every commit whose early write failed (the whole write then
// reports a failure that was not passing, with the file's name).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/status.h"

namespace shardckpt {

// The head room for a head of `head_bytes`: its blocks, with room for a few more metrics.
uint64_t ManifestHeadRoom(size_t head_bytes);
// The staging memory a text of that head room and body is written from: a caller that keeps its
// staging between saves sizes it with the first (the later saves then allocate none).
size_t ManifestAheadStagingBytes(uint64_t head_room, size_t body_bytes);

class ManifestAhead {
 public:
  // Starts writing `body`'s whole blocks at offset `head_room` (a multiple of 4096) of `path`
  // (created, or emptied: a file of the save's own temp folder) on a thread of its own. `body` and `staging` (the aligned memory the
  // file is written from, grown when too small) must outlive this object, and nothing else may
  // use `staging` before Wait returns.
  ManifestAhead(std::string path, uint64_t head_room, std::string_view body, AlignedBuffer* staging);
  ~ManifestAhead();  // Close()
  ManifestAhead(const ManifestAhead&) = delete;
  ManifestAhead& operator=(const ManifestAhead&) = delete;

  // Waits for the early write; its outcome (the same on every call).
  Status Wait();
  // Whether a manifest text of these pieces is the one the early write began: a head of exactly
  // head_room bytes, then this body.
  bool Fits(std::string_view head, std::string_view body) const;
  // After Wait returned OK and for a text that Fits: writes the head and the rest of the text
  // after what the early write wrote, gives the file the text's size, syncs it and closes it. On
  // success the file holds head + body + seal, durably.
  Status Complete(std::string_view head, std::string_view body, std::string_view seal);
  // Waits for the thread and closes the file: before a commit that writes the manifest whole, or
  // removes the temp folder, begins.
  void Close();

  const std::string& path() const { return path_; }
  // Whether the file was opened with O_DIRECT (after Wait): a buffered one (tmpfs) takes the
  // whole body early, straight from its text, and no staging.
  bool direct() const { return direct_; }

 private:
  void WriteBody();
  Status CompleteDirect(std::string_view head, std::string_view seal);
  Status CompleteBuffered(std::string_view head, std::string_view seal);

  std::string path_;
  uint64_t head_room_;
  std::string_view body_;
  AlignedBuffer* staging_;
  int fd_ = -1;
  bool direct_ = false;
  Status status_;
  std::thread thread_;
};

}  // namespace shardckpt
