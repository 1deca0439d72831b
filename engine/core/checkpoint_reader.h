// Single-process, bounded-memory reads of a committed checkpoint: any part of any entry in any
// layout, through the planner and the verifying extent reader. The tools (consolidate, verify,
// reshard) stream through it one window at a time.
#pragma once

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/extent_reader.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/engine/model/read_plan.h"
#include "shardckpt/io/aligned_buffer.h"

namespace shardckpt {

// Every blob index of `m` (for CheckWantedFiles, by a caller that reads all values).
std::vector<size_t> AllBlobs(const Manifest& m);

class CheckpointReader {
 public:
  // `path` is a checkpoint folder or a root (then `latest`).
  static Result<std::unique_ptr<CheckpointReader>> Open(const std::string& path, IoOptions io = {});
  const Manifest& manifest() const { return manifest_; }
  const std::string& dir() const { return dir_; }
  bool is_dcp() const { return dcp_; }
  // Reads `layout` of entry `entry` into `out` (LocalShape(layout) bytes), verifying checksums.
  // Each part of a piece that lies within one window's size is served from a verified read-ahead
  // window of its file, one per file: tools walking many small entries in file order (reshard,
  // consolidate) read each block once instead of once per piece, which dominated with thousands of
  // packed chunks. Windows are kWindowBudget / files bytes (4 MiB to 64 KiB), so a piece cut
  // across every file of a wide checkpoint never evicts the window the next piece needs.
  // Once a file is walked forward (a window follows the one before it), its next window is read
  // in the background while the current one is served, so the device is never idle while the
  // caller copies (memory: at most twice the budget). A piece straddling the two is served from
  // both; a background read that failed is done again in the foreground, which reports as before.
  Status ReadPiece(size_t entry, const Layout& layout, void* out);
  static constexpr uint64_t kWindowBudget = 64u << 20;
  static constexpr uint64_t kMaxWindow = 4u << 20, kMinWindow = 64u << 10;
  // Checks the data files the caller will read (those holding the entries ReadOnly named, else
  // all, and those holding `blobs`, indexes of the manifest's blobs it will read) are there at
  // their recorded sizes; a failure names the file and the entries and values it holds. Reads
  // check each file when they first need it anyway: this fails before anything is written.
  Status CheckWantedFiles(const std::vector<size_t>& blobs = {});
  // Tells the reader which entries the caller will read (a consolidation with --include): each
  // file's windows then end where those entries' bytes do, and no window is read ahead into
  // bytes none of them holds. A model's entries taken out of a checkpoint that also holds its
  // optimizer state read a third of the files, not all of them. Gaps under kWindowGap between
  // wanted bytes are read through: two reads would cost more than the bytes.
  void ReadOnly(const std::vector<size_t>& entries);
  static constexpr uint64_t kWindowGap = 64u << 10;

  // Starts reading each file's first window in the background: from the block of the file's
  // first chunk that windows serve (one within a window's size; after ReadOnly, of a wanted
  // entry), every file in one plan with kFirstWindowsInFlight reads in flight, up to
  // kWindowBudget in all. Files holding only wider chunks get none (their pieces are read on
  // their own). Why: a tool walking entries in order needs every file's first window for its
  // first pieces, and read one file at a time those took a quarter of a consolidation from 64
  // files (65 of 240 ms), four reads in flight and the caller idle; started before the caller's
  // own planning (a .pt's pickle), they overlap it too. A window that could not be read (a
  // damaged block) is read again when a piece needs it, which reports as before; the other
  // files' windows are kept. Call after ReadOnly and CheckWantedFiles (it reads what they chose,
  // and a file it reads unchecked can only fail its window, never serve one short).
  void ReadFirstWindowsAhead();
  static constexpr size_t kFirstWindowsInFlight = 16;
  // Files whose first window ReadFirstWindowsAhead read, verified, and kept (it waits for it).
  size_t first_windows_kept() {
    JoinFirstWindows();
    return first_windows_kept_;
  }
  // A blob's bytes; in a DCP folder a byte item of plain values comes back as a value blob
  // (DcpByteItemValue), others as their torch.save bytes.
  Result<std::string> ReadBlob(const BlobRecord& blob);
  // Bytes read so far, a background read in flight included (it is waited for).
  const ReadStats& stats() {
    JoinFirstWindows();
    JoinAhead();
    return stats_;
  }

 private:
  CheckpointReader() = default;
  Status Run(std::vector<CopyRequest> copies, const ReadTargets& targets);
  // Checks `file` is there at its recorded size, once it passed.
  Status CheckFile(uint32_t file);
  // Verified bytes [offset, offset + size) of one data file, in aligned memory allocated once
  // (window_bytes_), so each window is read straight into it.
  struct Window {
    uint64_t offset = 0;
    uint64_t size = 0;
    AlignedBuffer bytes;
  };
  // The window after a file's current one, read on a helper thread with its own ring and staging.
  struct Ahead {
    uint64_t from = 0;  // set before the read starts; `window` is the helper's until joined
    Window window;
    std::future<Status> done;  // valid from the start of the read until its result is taken
  };
  static constexpr uint64_t kWindowPart = 1u << 20;  // windows are read in parts of this, 4 at once
  static constexpr size_t kPartsInFlight = 4;
  // Copies `c` (a part of a piece, within one file) into `target` from the file's windows,
  // reading (and verifying) them as needed; false when it is wider than a window or its blocks
  // fail verification (the caller reads it alone).
  Result<bool> CopyFromWindows(const CopyRequest& c, unsigned char* target);
  // Reads [from, from + window) of `file`, cut short at its checksum table and, after ReadOnly,
  // at the end of the wanted bytes `from` lies in, into `into`.
  Status ReadWindow(uint32_t file, uint64_t from, Window* into, IoEngine* io, BufferPool* pool, ReadStats* stats);
  // Whether file bytes [begin, end) span more blocks than a window holds: such a piece (or chunk)
  // is read on its own, never from a window.
  bool WiderThanWindow(uint64_t begin, uint64_t end) const;
  // Where a window of `file` from `from` ends: a window's size on, cut at the file's data end,
  // at the end of the wanted span `from` lies in (ReadOnly), and at the block holding the start
  // of the next chunk wider than a window (read on its own, never from a window).
  uint64_t WindowEnd(uint32_t file, uint64_t from) const;
  // Whether a window of `file` [from, to) ends where WindowEnd cut it before the next chunk wider
  // than a window: nothing after it is for a window (a walk slicing through a wide chunk reads
  // windows inside it, which are not cut so, and read ahead as any).
  bool CutAtWideChunk(uint32_t file, uint64_t from, uint64_t to) const;
  // A window of `file` from `from` failed verification (or could not be read ahead): pieces that
  // touch it are read on their own from now on.
  void MarkDamaged(uint32_t file, uint64_t from);
  bool InDamagedWindow(uint32_t file, uint64_t begin, uint64_t end) const;
  // Starts reading the window after windows_[file] in the background, when the file has one
  // (and a thread and staging can be had: else it is read when needed, logged once).
  void StartAhead(uint32_t file);
  // After ReadOnly: the end of the wanted span of `file` holding `offset`, 0 when none holds it;
  // without ReadOnly, UINT64_MAX (all of every file is wanted).
  uint64_t WantedEnd(uint32_t file, uint64_t offset) const;
  // Waits for the background read in flight, if any, and counts its bytes.
  void JoinAhead();
  // ReadFirstWindowsAhead's work, on its thread: picks the windows, reads them, marks each read.
  Status ReadFirstWindows();
  // Waits for ReadFirstWindowsAhead's read, if any; its windows serve pieces from then on.
  void JoinFirstWindows();
  // Adds a joined background read's counts to stats_ (as read ahead) and clears them.
  void CountReadAhead(ReadStats* read);
  // Takes the result of `file`'s background read: true when it succeeded.
  bool TakeAhead(uint32_t file);

  CheckpointHold hold_;  // retention leaves the folder while this reader is open
  std::string dir_;
  bool dcp_ = false;  // a PyTorch DCP folder read in place
  Manifest manifest_;
  std::unique_ptr<ChunkIndex> index_;
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<BufferPool> pool_;
  ReadStats stats_;
  std::vector<Window> windows_;  // by file
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> wanted_;  // by file, [begin, end) sorted; empty: all
  std::vector<bool> wanted_entries_;  // by entry, after ReadOnly; empty: all
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> wide_;  // by file: [begin, end) of chunks wider than a window, sorted
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> damaged_;  // by file: windows [from, to) that failed (MarkDamaged)
  std::vector<CopyRequest> piece_copies_, piece_direct_;
  std::vector<uint8_t> file_checked_;  // by file: present at its recorded size (CheckFile)
  uint64_t window_bytes_ = kMaxWindow;
  // Memory for a window of `file`: huge pages only when the file will refill it often enough
  // (AllocatorForReuse).
  HostAllocator WindowMemory(uint32_t file) const;
  // Background reads: one in flight at a time (its ring and staging are not shared), results
  // kept by file until taken. Last members: destroyed first, each waiting for its read.
  std::unique_ptr<IoEngine> ahead_io_;
  std::unique_ptr<BufferPool> ahead_pool_;
  ReadStats ahead_stats_;  // written by the helper, merged into stats_ once it is joined
  int64_t reading_ahead_ = -1;  // the file whose background read may still be running
  std::vector<Ahead> ahead_;  // by file
  // ReadFirstWindowsAhead's read: the windows it reads into windows_ (its thread's, and
  // windows_ with them, until it is joined), and its end. Last: destroyed first, waiting for it.
  struct FirstWindow {
    uint32_t file = 0;
    uint64_t from = 0;
    uint64_t size = 0;
    bool read = false;     // read and verified
    bool damaged = false;  // read alone, it failed verification (MarkDamaged)
  };
  std::vector<FirstWindow> first_windows_;
  ReadStats first_stats_;
  size_t first_windows_kept_ = 0;
  std::future<Status> first_done_;
};

}  // namespace shardckpt
