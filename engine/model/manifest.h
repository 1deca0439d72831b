// manifest.json: the schema of a committed checkpoint (docs/format.md), its encoding, and
// the validation every reader runs before trusting a single offset in it. Pure: no I/O here.
//
// Data file layout, for one writer rank:
//   [chunk][chunk][pad to 4096][large chunk][pad]...[blob][pad] | checksum table | pad to 4096
// (small chunks packed at their element size since 1.1, large ones on blocks: chunk_packing.h).
// The checksum table holds one little-endian u64 XXH3 per 4096-byte block of the data area
// [0, table_offset); the manifest holds one XXH3 per 4096-byte page of that table. A reader that
// needs data block k reads table page k / 512, checks it against the manifest, then checks the
// block: two levels, so a resharded load verifies exactly what it read and reads only the table
// pages it needs (one 4 KiB page per 2 MiB of data).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardckpt/engine/model/dtype.h"
#include "shardckpt/engine/model/layout.h"
#include "shardckpt/engine/model/record_arena.h"

namespace shardckpt {

inline constexpr const char* kFormatName = "shardckpt";
inline constexpr int kFormatMajor = 1;
// 1.1: chunks and blobs may start anywhere in the data area (engine/model/chunk_packing.h); a
// manifest says 1.1 only when one does, so checkpoints without packed chunks stay 1.0.
inline constexpr int kFormatMinor = 1;
inline constexpr int kFormatMinorPacked = 1;
inline constexpr const char* kManifestName = "manifest.json";
inline constexpr uint64_t kSumsPerTablePage = 4096 / 8;
// Ranks a checkpoint can be written by: a decode refuses more, so a hostile world size cannot
// size allocations (a tool asked for more refuses before writing anything).
inline constexpr int kMaxWorldSize = 1 << 24;

struct FileRecord {
  std::string name;
  uint64_t size = 0;
  uint64_t table_offset = 0;  // end of the data area, start of the checksum table
  std::vector<uint64_t> table_page_sums;
  // False only for a file of another format read in place (a DCP folder's .distcp, see
  // engine/formats/dcp_read.h): no checksum table (table_offset == size), chunks at any offset.
  // Never true of a manifest.json on disk: decoding one that says so is refused.
  bool checksums = true;
};

struct ChunkRecord {
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  Layout layout;
};

// An entry's chunks: on the heap, or in the arena of the decode that read them (record_arena.h).
using ChunkRecords = std::vector<ChunkRecord, ArenaAllocator<ChunkRecord>>;

struct EntryRecord {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape shape;
  ChunkRecords chunks;
};

enum class BlobScope : uint8_t { kGlobal, kPerRank };

struct BlobRecord {
  std::string name;
  BlobScope scope = BlobScope::kGlobal;
  int rank = 0;  // the saving rank, for kPerRank
  uint32_t file = 0;
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

struct CreationInfo {
  std::string time;  // ISO 8601, UTC
  std::string shardckpt_version;
  std::string torch_version;
  int hosts = 1;
  std::string git_commit;
  std::map<std::string, std::string> user;
};

struct Manifest {
  int format_major = kFormatMajor;
  int format_minor = kFormatMinor;
  int64_t step = 0;
  int world_size = 1;
  CreationInfo created;
  // Named numbers the caller recorded with the save (a validation loss, an accuracy): finite,
  // typed as JSON numbers, so retention can rank checkpoints by one of them.
  std::map<std::string, double> metrics;
  std::vector<FileRecord> files;
  std::vector<EntryRecord> entries;
  std::vector<BlobRecord> blobs;
};

uint64_t TablePages(uint64_t table_offset);
uint64_t DataFileSize(uint64_t table_offset);

// The manifest's text (docs/format.md): the same manifest always gives the same bytes.
Result<std::string> EncodeManifest(const Manifest& manifest);
// The part of EncodeManifest's text that says what the files hold ("chunk_fields", "entries",
// "blobs"), and the whole text given that part. A repeat save that placed every piece where the
// previous one did has the same entries and blobs: it encodes only the step, creation, metrics
// and files (save_phases.h, KeptManifest), and keeps this text rather than the entries (at a
// million chunks the text is 28 MB, the entries in memory 130 MB).
struct ManifestBody {
  std::string text;
  bool packed_offsets = false;  // UsesPackedOffsets of the entries and blobs it says (format 1.1)
};
Result<ManifestBody> EncodeManifestBody(const Manifest& m);
// EncodeManifest of `head` with the entries and blobs `body` says (head's own are not read), as
// the three pieces that text is: a repeat save writes them out as they are, not joined into a
// new string of megabytes first.
struct ManifestTextPieces {
  std::string head;       // up to the entries and blobs
  std::string_view body;  // the ManifestBody's text, which must outlive this
  std::string seal;       // the checksum field and the closing brace
  std::string Joined() const;
};
// A head shorter than `head_room` bytes is padded with spaces to that size (after the files list,
// where JSON allows them), so the body starts at that offset of the file (manifest_ahead.h); a
// longer one is left as it is. With a head room the seal starts with spaces too, so that the
// whole text is a multiple of 4096 bytes.
Result<ManifestTextPieces> EncodeManifestWithBody(const Manifest& head, const ManifestBody& body,
                                                  size_t head_room = 0);
// EncodeManifestBody's text built entry by entry, each entry checked as ValidateManifest checks
// it before its text is written. Why: a writer of millions of chunks (a reshard to 64 ranks of
// 20,000 tensors adds 630,000) can keep them compact and hand them over one entry at a time;
// a whole Manifest of them was 128 bytes of fresh memory per chunk, built, encoded, checked and
// freed in turn. `head` holds the files the chunks name (its entries and blobs are not read)
// and must outlive the builder; `expected_entries` and `expected_chunks` size its memory once.
// Two builders can share a list: the second, made `continuing_at` the place of its first entry
// in the whole list, is filled on another thread and given to the first one's Finish.
class ManifestBodyBuilder {
 public:
  ManifestBodyBuilder(const Manifest& head, size_t expected_entries, size_t expected_chunks,
                      std::optional<size_t> continuing_at = std::nullopt);
  ~ManifestBodyBuilder();
  ManifestBodyBuilder(const ManifestBodyBuilder&) = delete;
  ManifestBodyBuilder& operator=(const ManifestBodyBuilder&) = delete;
  // ValidateManifest's error for `entry` at this place in the list (DataLoss "invalid manifest:
  // ..."); after one the builder is done. A name that is not UTF-8 is not an error here: as
  // EncodeManifest refuses one only once the whole manifest is valid, Finish does.
  Status Add(const EntryRecord& entry);
  // The body: this builder's entries, then those of `rest` (a builder continuing where this
  // one's end; a name listed in both is refused as Add refuses it, after both parts' other
  // errors), then `blobs`. The caller validates the blobs (ValidateManifest of a head that holds
  // them and no entries). EncodeManifest's refusal of the first name that is not UTF-8 (an
  // entry's, then a blob's) comes from here.
  Result<ManifestBody> Finish(const std::vector<BlobRecord>& blobs, ManifestBodyBuilder* rest = nullptr);

 private:
  struct Names;
  const Manifest& head_;
  std::unique_ptr<Names> names_;
  std::vector<std::pair<int64_t, int64_t>> spans_;
  ManifestBody body_;
  size_t first_index_ = 0;  // the place of this builder's first entry in the whole list
  size_t entries_ = 0;
  Status not_encoded_;  // the first entry whose name could not be written (not UTF-8)
};

// Parses and validates. `origin` (the file path) prefixes every message. Reads the layout of
// every writer so far (the older one-number-per-line text included) and fields in any order.
// `threads` > 1 reads a large entries list on up to that many threads (ReadCompactEntryList): as
// many as the CPUs the caller has to itself (a tool's, a rank's share of its host's).
Result<Manifest> DecodeManifest(const std::string& json, const std::string& origin, size_t threads = 1);
// The error DecodeManifest and DecodeManifestMessage return when memory runs out mid-decode.
Status OutOfMemoryDecoding(const std::string& origin, size_t text_bytes);
// Whether any chunk or blob starts off a 4096-byte block (format 1.1).
bool UsesPackedOffsets(const Manifest& manifest);
// Everything that can be checked without touching the data files: names, bounds, overflow,
// coverage of every entry, per-file checksum table sizes. `threads` > 1 checks the chunks of a
// large manifest on two threads; the error returned is the same either way.
Status ValidateManifest(const Manifest& manifest, size_t threads = 1);
// Metric names of 1 to 255 characters, finite values.
Status ValidateMetrics(const std::map<std::string, double>& metrics);
// A name with its NUL bytes written as "\0", for a message that names it whole (a NUL would
// cut it short wherever it is printed).
std::string WithNulsShown(const std::string& name);
// A save's user metadata is text: no NUL byte in a key or value (it cut them short in inspect).
Status ValidateUserMetadata(const std::map<std::string, std::string>& user);
// Compares each data file's recorded size with `size_of(name)` (missing or truncated files).
Status CheckDataFiles(const std::vector<FileRecord>& files,
                      const std::function<Result<uint64_t>(const std::string&)>& size_of);
// The same for one file whose size was asked (`size`: the answer, or why there is none).
Status CheckDataFile(const FileRecord& file, const Result<uint64_t>& size);
// The manifest checks itself: its last field, "checksum": "xxh3:<hex>", is the XXH3 of the
// text without it. Seal adds it to the text of an object that ends with "\n}" (EncodeManifest's,
// or an older writer's one-space-indented dump); CheckSeal returns the text without it, or
// DataLoss when it is missing or does not match (a flipped bit anywhere, metadata included).
std::string SealManifestText(std::string text);
Result<std::string> CheckSeal(const std::string& text, const std::string& origin);

// A file name as a manifest may hold it: a plain base name.
bool IsPlainFileName(const std::string& name);

}  // namespace shardckpt
