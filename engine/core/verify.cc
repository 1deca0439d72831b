#include "shardckpt/engine/core/verify.h"

#include <algorithm>
#include <cstring>
#include <map>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/io/aligned_buffer.h"
#include "shardckpt/io/checksum.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/io_engine.h"
#include "shardckpt/io/read_ring.h"

namespace shardckpt {
namespace {

struct Span {
  uint64_t begin, end;
  std::string name;
  bool blob = false;
};

struct Holders {
  std::vector<std::string> entries, blobs;
};

Holders HoldersOf(const std::vector<Span>& spans, uint64_t begin, uint64_t end) {
  Holders out;
  // spans are sorted by begin; the few that overlap [begin, end) are near the lower bound.
  auto it = std::lower_bound(spans.begin(), spans.end(), begin, [](const Span& s, uint64_t v) { return s.end <= v; });
  for (; it != spans.end() && it->begin < end; ++it) {
    if (it->end > begin) (it->blob ? out.blobs : out.entries).push_back(it->name);
  }
  return out;
}

// A failed stat, open or read that says nothing of the bytes (a permission, EIO): the file is
// unreadable, not known to be damaged. A missing file or a short one (DataLoss) is damage.
bool FailedWithoutDamage(const Status& status) {
  return !status.ok() && status.code() != Code::kNotFound && status.code() != Code::kDataLoss;
}

VerifyProblem FromDcp(DcpProblem p) {
  return VerifyProblem{std::move(p.file), p.offset, std::move(p.entries), std::move(p.blobs), std::move(p.what), p.unreadable};
}

// A problem of a whole DCP data file (missing, unreadable, its .sha256 not matching) named no
// holder, and read as "padding": it names everything stored in the file.
void NameFileHolders(const Manifest& m, VerifyProblem* problem) {
  if (!problem->entries.empty() || !problem->blobs.empty()) return;
  uint32_t file = 0;
  while (file < m.files.size() && m.files[file].name != problem->file) ++file;
  if (file == m.files.size()) return;
  for (const EntryRecord& e : m.entries) {
    if (std::any_of(e.chunks.begin(), e.chunks.end(), [&](const ChunkRecord& c) { return c.file == file && c.bytes > 0; })) {
      problem->entries.push_back(e.name);
    }
  }
  for (const BlobRecord& b : m.blobs) {
    if (b.file == file) problem->blobs.push_back(b.name);
  }
}

Result<VerifyReport> VerifyDcpStructure(VerifyReport report) {
  std::vector<DcpProblem> problems;
  SC_ASSIGN_OR_RETURN(Manifest m, ReadDcpFolder(report.checkpoint, &problems));
  auto add = [&](DcpProblem p) {
    report.problems.push_back(FromDcp(std::move(p)));
    NameFileHolders(m, &report.problems.back());
  };
  for (DcpProblem& p : problems) add(std::move(p));
  report.files = m.files.size();
  report.checksums = false;
  // `shardckpt export --format dcp` leaves a .sha256 beside each file: where all are there, the
  // bytes are checked after all, whole files at a time.
  uint64_t summed = 0;
  for (DcpProblem& p : CheckDcpSha256Files(report.checkpoint, m, &summed, &report.bytes_checked)) add(std::move(p));
  if (summed > 0 && summed == m.files.size()) {
    report.checksums = true;
    report.note = "a DCP folder stores no checksums; every file was checked against the .sha256 beside it "
                  "(as shardckpt export writes them) and its structure checked";
  } else {
    report.note = "structure only: a DCP folder stores no checksums, so its bytes cannot be verified" +
                  std::string(summed ? " (only some files have a .sha256; those were checked)" : "") +
                  "; `shardckpt import` of the folder writes a checkpoint with checksums";
  }
  return report;
}

constexpr const char* kExtraBytes = "(extra bytes after its checksum table)";

}  // namespace

std::string HoldersText(const VerifyProblem& problem) {
  // A whole file's problem names everything in it: the first few, then a count.
  constexpr size_t kShown = 8;
  std::string out;
  size_t shown = 0;
  for (const std::string& name : problem.entries) {
    if (shown++ < kShown) out += (out.empty() ? "'" : ", '") + name + "'";
  }
  for (const std::string& name : problem.blobs) {
    if (shown++ < kShown) out += (out.empty() ? "blob '" : ", blob '") + name + "'";
  }
  if (shown > kShown) out += " and " + std::to_string(shown - kShown) + " more";
  if (!out.empty()) return out;
  if (problem.file == kManifestName) return "the manifest";
  return problem.what.find(kExtraBytes) != std::string::npos ? "past the end" : "padding";
}

Result<VerifyReport> VerifyCheckpoint(const std::string& path, const std::function<void(uint64_t, uint64_t)>& progress) {
  VerifyReport report;
  SC_ASSIGN_OR_RETURN(CheckpointHold hold, HoldCheckpoint(path));  // retention leaves it while held
  report.checkpoint = hold.dir();
  if (IsDcpFolder(report.checkpoint)) {
    report.dcp = true;
    return VerifyDcpStructure(std::move(report));
  }
  const std::string manifest_path = JoinPath(report.checkpoint, kManifestName);
  Result<Manifest> read = ReadManifestFile(manifest_path);
  if (!read.ok()) {
    // A manifest that is there but damaged is this checkpoint's damage, reported as a data
    // block's is (a script reads `problems`); one missing or unreadable is an error.
    if (read.status().code() != Code::kDataLoss) return read.status();
    std::string what = read.status().message();
    if (what.rfind(manifest_path + ": ", 0) == 0) what.erase(0, manifest_path.size() + 2);
    report.problems.push_back(VerifyProblem{kManifestName, 0, {}, {}, what});
    return report;
  }
  const Manifest& m = *read;
  int64_t named_step = 0;
  const std::string folder = BaseName(WithoutTrailingSlashes(report.checkpoint));  // "step-000000009/"
  if (ParseStepDirName(folder, &named_step) && named_step != m.step) {
    // Sound bytes, but a root orders its checkpoints by folder name: a renamed folder passes
    // for a later (or earlier) step than it holds, for `latest`, --resume and retention.
    report.note = "the folder is named " + folder + " but its manifest is of step " +
                  std::to_string(m.step) + " (renamed?): a root takes it for step " + std::to_string(named_step);
  }
  std::vector<std::vector<Span>> spans(m.files.size());
  for (const EntryRecord& e : m.entries) {
    for (const ChunkRecord& c : e.chunks) spans[c.file].push_back(Span{c.offset, c.offset + c.bytes, e.name});
  }
  for (const BlobRecord& b : m.blobs) spans[b.file].push_back(Span{b.offset, b.offset + b.bytes, b.name, true});
  uint64_t total = 0;
  for (const FileRecord& f : m.files) total += f.size;
  for (auto& s : spans) std::sort(s.begin(), s.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });

  IoOptions io_options;
  io_options.queue_depth = 4;
  std::unique_ptr<IoEngine> io = CreateIoEngine(io_options);
  constexpr uint64_t kExtent = 8u << 20;
  // The load's reader, one read at a time: a failed read comes back without its tag, and each
  // problem must name where it is.
  SC_ASSIGN_OR_RETURN(std::unique_ptr<BufferPool> pool, BufferPool::Create(1, kExtent));
  const unsigned char* data = nullptr;
  ReadRing ring(io.get(), pool.get(), [&](size_t, const unsigned char* read) {
    data = read;
    return Status::Ok();
  });
  auto read_now = [&](File* file, uint64_t offset, uint64_t length) {
    Status read = ring.Read(file, offset, length, 0);
    Status finished = ring.Finish();
    return read.ok() ? finished : read;
  };
  uint64_t done = 0;
  for (size_t fi = 0; fi < m.files.size(); ++fi) {
    const FileRecord& f = m.files[fi];
    const std::string file_path = JoinPath(report.checkpoint, f.name);
    report.files++;
    auto problem = [&](uint64_t offset, Holders holders, const std::string& what, bool unreadable = false) {
      report.problems.push_back(
          VerifyProblem{f.name, offset, std::move(holders.entries), std::move(holders.blobs), what, unreadable});
    };
    Result<uint64_t> size = FileSize(file_path);
    if (!size.ok()) {
      const bool missing = size.status().code() == Code::kNotFound;
      problem(0, HoldersOf(spans[fi], 0, f.table_offset), (missing ? "missing: " : "") + size.status().message(),
              FailedWithoutDamage(size.status()));
      done += f.size;
      continue;
    }
    // Table pages the file still holds whole: all but those a truncation cut off. The blocks the
    // lost pages summed are named as the damage, and the rest of the file is still checked.
    uint64_t pages_held = TablePages(f.table_offset);
    if (*size != f.size) {
      const std::string sizes =
          "file is " + std::to_string(*size) + " bytes, the manifest records " + std::to_string(f.size);
      if (*size < f.table_offset) {
        problem(*size, HoldersOf(spans[fi], *size, f.table_offset), sizes + " (truncated)");
        done += f.size;
        continue;
      }
      if (*size < f.size) {
        // The table runs to the file's end: a cut past table_offset cuts a page off.
        pages_held = std::min(pages_held, (*size - f.table_offset) / kBlockSize);
        const uint64_t unsummed = std::min(f.table_offset, pages_held * kSumsPerTablePage * kBlockSize);
        problem(*size, HoldersOf(spans[fi], unsummed, f.table_offset),
                sizes + " (truncated in its checksum table: the bytes from offset " + std::to_string(unsummed) +
                    " on cannot be verified)");
      } else {
        problem(f.size, Holders{}, sizes + " " + kExtraBytes);
      }
    }
    Result<std::unique_ptr<File>> file = io->Open(file_path, OpenMode::kRead);
    if (!file.ok()) {  // unreadable (a permission, EIO): everything in it goes unchecked
      problem(0, HoldersOf(spans[fi], 0, f.table_offset), file.status().message(), FailedWithoutDamage(file.status()));
      done += f.size;
      continue;
    }
    // The table first (small), then the data against it.
    std::vector<uint64_t> table(TablePages(f.table_offset) * kSumsPerTablePage);
    std::vector<bool> page_ok(TablePages(f.table_offset), true);
    for (uint64_t page = 0; page < page_ok.size(); ++page) {
      if (page >= pages_held) {  // cut off: reported with the file's size above
        page_ok[page] = false;
        continue;
      }
      Status read = read_now(file->get(), f.table_offset + page * kBlockSize, kBlockSize);
      std::string wrong;
      if (!read.ok()) {
        wrong = "checksum table page " + std::to_string(page) + " cannot be read: " + read.message();
      } else if (Checksum64(data, kBlockSize) != f.table_page_sums[page]) {
        wrong = "checksum table page " + std::to_string(page) + " does not match the manifest";
      }
      if (!wrong.empty()) {
        // The blocks this page covers are unverifiable: one problem here, none per block below.
        page_ok[page] = false;
        uint64_t first = page * kSumsPerTablePage * kBlockSize;
        problem(f.table_offset + page * kBlockSize,
                HoldersOf(spans[fi], first, std::min(f.table_offset, first + kSumsPerTablePage * kBlockSize)), wrong,
                FailedWithoutDamage(read));
        continue;
      }
      std::memcpy(table.data() + page * kSumsPerTablePage, data, kBlockSize);
    }
    for (uint64_t at = 0; at < f.table_offset; at += kExtent) {
      uint64_t length = std::min(kExtent, f.table_offset - at);
      // Blocks whose sums are lost or wrong cannot be checked: not read (a file cut at its table
      // is not read whole for nothing).
      bool checkable = false;
      for (uint64_t page = at / kBlockSize / kSumsPerTablePage; page <= (at + length - 1) / kBlockSize / kSumsPerTablePage;
           ++page) {
        checkable = checkable || page_ok[page];
      }
      if (!checkable) {
        done += length;
        if (progress) progress(done, total);
        continue;
      }
      Status read = read_now(file->get(), at, length);
      if (!read.ok()) {
        problem(at, HoldersOf(spans[fi], at, at + length), read.message(), FailedWithoutDamage(read));
        break;
      }
      for (uint64_t b = 0; b < length; b += kBlockSize) {
        uint64_t block = (at + b) / kBlockSize;
        if (!page_ok[block / kSumsPerTablePage]) continue;  // reported once, above; not checked
        report.blocks_checked++;
        report.bytes_checked += std::min(kBlockSize, length - b);
        if (Checksum64(data + b, kBlockSize) != table[block]) {
          problem(at + b, HoldersOf(spans[fi], at + b, at + b + kBlockSize), "checksum mismatch in a 4096-byte block");
        }
      }
      done += length;
      if (progress) progress(done, total);
    }
    // The table and its padding, read first, count too: the bar stopped short of 100% by them.
    done += f.size - std::min(f.size, f.table_offset);
    if (progress) progress(done, total);
  }
  return report;
}

}  // namespace shardckpt
