// shardckpt: the command line over a checkpoint.
//
//   shardckpt inspect CHECKPOINT [--json]
//   shardckpt verify CHECKPOINT [--json]
//   shardckpt consolidate CHECKPOINT --out FILE [--format torch|safetensors] [--include GLOB]...
//             [--exclude GLOB]... [--strip-prefix P] [--dtype bf16|fp16|fp32] [--max-shard-size SIZE]
//             [--gguf-arch A --gguf-name N --gguf-metadata FILE]   (--format gguf)
//   shardckpt export CHECKPOINT --format dcp --out DIR
//   shardckpt import FILE --out ROOT --world-size N [--layout flat|dim0|replicated]
//   shardckpt reshard CHECKPOINT --out ROOT --world-size M [--layout flat|dim0|replicated]
//   shardckpt list ROOT [--json] [--keep-last K --keep-best K --metric NAME --mode min|max]
//   shardckpt prune ROOT --keep-last K [--keep-best K --metric NAME --mode min|max] [--dry-run] [--json]
//
// CHECKPOINT is a committed checkpoint folder or a root (then `latest`). Exit status 0 on success,
// 1 on a failed check or error (with a message on stderr), 2 on bad usage.
#include <boost/program_options.hpp>

#include <csignal>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <set>

#include "shardckpt/engine/core/consolidate.h"
#include "shardckpt/engine/core/convert.h"
#include "shardckpt/engine/core/dcp_export.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/verify.h"
#include "shardckpt/engine/core/version.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/retention.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/size_text.h"
#include "tools/interrupt.h"
#include "tools/progress.h"

namespace po = boost::program_options;
using namespace shardckpt;
using shardckpt::tools::InterruptScope;
using shardckpt::tools::ProgressBar;
using json = nlohmann::ordered_json;

namespace {

struct Usage {
  std::string message;
};

uint64_t ParseSize(const std::string& text) {
  Result<uint64_t> bytes = ParseByteSize(text);
  if (!bytes.ok()) throw Usage{bytes.status().message()};
  return *bytes;
}

// Set by Parse when the one command this process runs asked for --json: a script reading stdout
// then gets a JSON object on failure too, not an empty stream it must tell apart from a crash.
bool json_output = false;

po::variables_map Parse(const std::string& command, po::options_description& flags, const std::string& positional,
                        int argc, char** argv) {
  flags.add_options()("help,h", "this text");
  po::options_description all = flags;
  po::positional_options_description pos;
  if (!positional.empty()) {
    all.add_options()(positional.c_str(), po::value<std::string>(), "");
    pos.add(positional.c_str(), 1);
  }
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(argc, argv).options(all).positional(pos).run(), vm);
    // Before notify, which enforces required flags: `import --help` needs no --out.
    if (vm.count("help")) {
      std::cout << "usage: shardckpt " << command << (positional.empty() ? "" : " " + positional) << " [options]\n" << flags;
      std::exit(0);
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw Usage{e.what()};
  }
  if (!positional.empty() && !vm.count(positional)) throw Usage{command + " needs " + positional};
  json_output = vm.count("json") > 0;
  return vm;
}

// Every --json object printed. A path need not be UTF-8: its invalid bytes become U+FFFD rather
// than a throw, which would abort the tool after prune, consolidate or import had done its work.
// Every object printed says "ok", as errors and verify's reports do: a script checks one key.
void PrintJson(json out) {
  if (out.is_object() && !out.contains("ok")) out["ok"] = true;
  std::cout << out.dump(2, ' ', false, json::error_handler_t::replace) << "\n";
}

// The step of the checkpoint folder `path` names, for every verb's --json ("step": which step of
// a root was read or written); null for a folder not named as a step (a DCP folder).
json StepOf(const std::string& path) {
  int64_t step = 0;
  return ParseStepDirName(BaseName(WithoutTrailingSlashes(path)), &step) ? json(step) : json(nullptr);
}

// The --json failure object, for runtime and usage errors alike.
void PrintJsonError(const std::string& code, const std::string& message) {
  PrintJson(json{{"ok", false}, {"error", {{"code", code}, {"message", message}}}});
}

int Fail(const Status& status) {
  std::fprintf(stderr, "shardckpt: %s\n", status.ToString().c_str());
  if (json_output) {
    PrintJsonError(CodeName(status.code()), status.message());
  }
  // Stopped by Ctrl-C or SIGTERM: the status a shell expects of a command the signal ended.
  if (status.code() == Code::kAborted && InterruptScope::Caught() != 0) return 128 + InterruptScope::Caught();
  return 1;
}

// The kinds of layout an entry's chunks have, as "box", "flat", "whole" joined by '+' in that
// order. A bit per kind, not a set of strings: this runs for every chunk (millions). "whole", not
// "replicated": a whole chunk is stored once, whether one rank held the tensor or every rank did.
std::string LayoutsOf(const EntryRecord& e) {
  enum : unsigned { kBoxBit = 1, kFlatBit = 2, kWholeBit = 4 };
  unsigned kinds = 0;
  for (const ChunkRecord& c : e.chunks) {
    kinds |= c.layout.kind == LayoutKind::kFlatRange ? kFlatBit : c.layout.sizes == e.shape ? kWholeBit : kBoxBit;
  }
  std::string out;
  for (const auto& [bit, name] : {std::pair{kBoxBit, "box"}, {kFlatBit, "flat"}, {kWholeBit, "whole"}}) {
    if (kinds & bit) out += (out.empty() ? "" : "+") + std::string(name);
  }
  return out.empty() ? "-" : out;
}

// One row of inspect's entry table; a JSON object only for --json (the table of a checkpoint of
// a hundred thousand entries would otherwise build and destroy as many JSON objects).
struct EntryRow {
  const EntryRecord* entry;
  uint64_t bytes;
  std::string layouts;
};

json EntryRowJson(const EntryRow& row) {
  const EntryRecord& e = *row.entry;
  return {{"name", e.name}, {"dtype", DTypeName(e.dtype)}, {"shape", e.shape}, {"bytes", row.bytes},
          {"chunks", e.chunks.size()}, {"layouts", row.layouts}};
}

// `text` followed by spaces up to `columns` terminal columns: printf's %-Ns counts bytes, so UTF-8
// names (two or three bytes a character, CJK ones two columns wide) broke the table's alignment.
std::string PadToColumns(const std::string& text, size_t columns) {
  size_t width = 0;
  for (size_t k = 0; k < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[k]);
    const size_t length = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    uint32_t point = length == 1 ? c : c & (0xFF >> (length + 1));
    for (size_t j = 1; j < length && k + j < text.size(); ++j) point = point << 6 | (static_cast<unsigned char>(text[k + j]) & 0x3F);
    k += length;
    const bool combining = point >= 0x300 && point <= 0x36F;
    const bool wide = (point >= 0x1100 && point <= 0x115F) || (point >= 0x2E80 && point <= 0xA4CF) ||
                      (point >= 0xAC00 && point <= 0xD7A3) || (point >= 0xF900 && point <= 0xFAFF) ||
                      (point >= 0xFE30 && point <= 0xFE4F) || (point >= 0xFF00 && point <= 0xFF60) ||
                      (point >= 0xFFE0 && point <= 0xFFE6) || (point >= 0x20000 && point <= 0x3FFFD);
    width += combining ? 0 : wide ? 2 : 1;
  }
  return width >= columns ? text : text + std::string(columns - width, ' ');
}

int Inspect(int argc, char** argv) {
  po::options_description flags("inspect: what a checkpoint holds");
  flags.add_options()("json", "machine-readable output");
  po::variables_map vm = Parse("inspect", flags, "CHECKPOINT", argc, argv);
  Result<CheckpointHold> hold = HoldCheckpoint(vm["CHECKPOINT"].as<std::string>());
  if (!hold.ok()) return Fail(hold.status());
  const std::string* dir = &hold->dir();
  Result<Manifest> m = ReadManifest(*dir);
  if (!m.ok()) return Fail(m.status());
  uint64_t total = 0;
  std::vector<EntryRow> rows;
  rows.reserve(m->entries.size());
  for (const EntryRecord& e : m->entries) {
    uint64_t bytes = static_cast<uint64_t>(NumBytes(e.shape, DTypeSize(e.dtype)).value());
    total += bytes;
    rows.push_back(EntryRow{&e, bytes, LayoutsOf(e)});
  }
  // A DCP folder's byte items are torch.save files: those holding more than plain values are
  // named (restoring them would run their pickle), never unpickled here.
  const bool dcp = BuiltFromDcpFolder(*m);
  Result<std::map<std::string, std::string>> opaque_items = DcpOpaqueByteItems(*dir, *m);
  if (!opaque_items.ok()) return Fail(opaque_items.status());
  std::map<std::string, std::string>& opaque = *opaque_items;
  json blobs = json::array();
  for (const BlobRecord& b : m->blobs) {
    blobs.push_back({{"name", b.name}, {"scope", b.scope == BlobScope::kGlobal ? "global" : "per_rank"}, {"rank", b.rank},
                     {"bytes", b.bytes}});
    if (dcp) blobs.back()["plain"] = !opaque.count(b.name);
    if (opaque.count(b.name)) blobs.back()["not_plain_because"] = opaque[b.name];
  }
  uint64_t file_bytes = 0;
  for (const FileRecord& f : m->files) file_bytes += f.size;
  if (vm.count("json")) {
    json entries = json::array();
    for (const EntryRow& row : rows) entries.push_back(EntryRowJson(row));
    json out = {{"checkpoint", *dir},
                {"format", dcp ? "dcp" : "shardckpt"},
                {"format_version", dcp ? m->created.user["dcp_version"]
                                       : std::to_string(m->format_major) + "." + std::to_string(m->format_minor)},
                {"step", dcp ? json(nullptr) : json(m->step)},  // a DCP folder has no step, as the other verbs say
                {"world_size", m->world_size},
                {"created", {{"time", m->created.time}, {"shardckpt_version", m->created.shardckpt_version},
                             {"torch_version", m->created.torch_version}, {"hosts", m->created.hosts},
                             {"git_commit", m->created.git_commit}, {"user", m->created.user}}},
                {"metrics", m->metrics},
                {"entries", entries},
                {"blobs", blobs},
                {"tensor_bytes", total},
                {"files", m->files.size()},
                {"file_bytes", file_bytes}};
    PrintJson(out);
    return 0;
  }
  if (dcp) std::printf("checkpoint  %s\nformat      PyTorch DCP (read in place; no checksums)\n", dir->c_str());
  if (!dcp) std::printf("checkpoint  %s\nformat      shardckpt %d.%d\nstep        %lld\nsaved by    %d ranks on %d host(s)\n",
              dir->c_str(), m->format_major, m->format_minor, static_cast<long long>(m->step), m->world_size, m->created.hosts);
  if (dcp) std::printf("saved by    %d ranks\n", m->world_size);
  if (!dcp) std::printf("created     %s by shardckpt %s%s%s\n", m->created.time.c_str(), m->created.shardckpt_version.c_str(),
              m->created.torch_version.empty() ? "" : ", torch ", m->created.torch_version.c_str());
  for (const auto& [k, v] : m->created.user) {
    // A DCP folder's key paths, or import's value order, run to megabytes at 20,000 tensors:
    // the table shows their start (`--json` gives them whole).
    constexpr size_t kShown = 200;
    if (v.size() <= kShown) {
      std::printf("meta        %s = %s\n", k.c_str(), v.c_str());
      continue;
    }
    size_t shown = kShown;
    while (shown > 0 && (static_cast<unsigned char>(v[shown]) & 0xC0) == 0x80) --shown;  // on a whole UTF-8 character
    std::printf("meta        %s = %.*s... (%zu bytes)\n", k.c_str(), static_cast<int>(shown), v.c_str(), v.size());
  }
  for (const auto& [k, v] : m->metrics) std::printf("metric      %s = %.17g\n", k.c_str(), v);
  std::printf("\n%-48s %-14s %-20s %12s %7s  %s\n", "entry", "dtype", "shape", "bytes", "chunks", "layouts");
  for (const EntryRow& row : rows) {
    const EntryRecord& e = *row.entry;
    std::printf("%s %-14s %-20s %12llu %7zu  %s\n", PadToColumns(e.name, 48).c_str(), DTypeName(e.dtype), ShapeString(e.shape).c_str(),
                static_cast<unsigned long long>(row.bytes), e.chunks.size(), row.layouts.c_str());
  }
  for (const json& b : blobs) {
    std::printf("blob %s %-14s rank %-15d %12llu%s\n", PadToColumns(b["name"].get<std::string>(), 43).c_str(), b["scope"].get<std::string>().c_str(),
                b["rank"].get<int>(), static_cast<unsigned long long>(b["bytes"].get<uint64_t>()),
                b.contains("not_plain_because") ? ("  (not plain, not restored: " + b["not_plain_because"].get<std::string>() + ")").c_str() : "");
  }
  std::printf("\n%zu entries, %zu blobs, %llu tensor bytes in %zu files (%llu bytes on disk)\n", m->entries.size(),
              m->blobs.size(), static_cast<unsigned long long>(total), m->files.size(),
              static_cast<unsigned long long>(file_bytes));
  return 0;
}

int Verify(int argc, char** argv) {
  po::options_description flags("verify: read every byte and check every checksum");
  flags.add_options()("json", "machine-readable output");
  po::variables_map vm = Parse("verify", flags, "CHECKPOINT", argc, argv);
  bool as_json = vm.count("json");
  ProgressBar bar("verify", !as_json);
  Result<VerifyReport> r = VerifyCheckpoint(vm["CHECKPOINT"].as<std::string>(),
                                            [&](uint64_t d, uint64_t t) { bar.Update(d, t); });
  bar.Finish();
  if (!r.ok()) return Fail(r.status());
  if (as_json) {
    json problems = json::array();
    for (const VerifyProblem& p : r->problems) {
      problems.push_back({{"file", p.file}, {"offset", p.offset}, {"entries", p.entries}, {"blobs", p.blobs}, {"problem", p.what},
                          {"unreadable", p.unreadable}});
    }
    PrintJson(json{{"checkpoint", r->checkpoint}, {"step", StepOf(r->checkpoint)}, {"ok", r->problems.empty()},
                   {"damaged", r->Damaged()}, {"files", r->files},
                      {"bytes_checked", r->bytes_checked}, {"blocks_checked", r->blocks_checked}, {"problems", problems},
                      {"checksums", r->checksums}, {"note", r->note}});
  } else {
    for (const VerifyProblem& p : r->problems) {
      std::fprintf(stderr, "%s/%s at offset %llu (%s): %s\n", r->checkpoint.c_str(), p.file.c_str(),
                   static_cast<unsigned long long>(p.offset), HoldersText(p).c_str(), p.what.c_str());
    }
    // A DCP folder has no block checksums: say what was checked instead of "0 blocks checked".
    const std::string checked = !r->dcp ? std::to_string(r->blocks_checked) + " blocks checked"
                                : r->checksums ? "whole files checked against their checksums"
                                               : "structure only (no checksums stored)";
    // A structure-only check reads no data bytes: "0 bytes" would read as an empty checkpoint.
    const std::string bytes = r->bytes_checked > 0 || r->checksums ? std::to_string(r->bytes_checked) + " bytes, " : "";
    // A file it may not read (a permission) tells nothing of the bytes: not called damaged, so
    // that nobody discards a sound checkpoint for it.
    const char* verdict = r->problems.empty() ? "OK" : r->Damaged() ? "DAMAGED" : "UNREADABLE (not known to be damaged)";
    std::printf("%s: %s: %llu files, %s%s, %zu problem(s)\n", r->checkpoint.c_str(), verdict, static_cast<unsigned long long>(r->files),
                bytes.c_str(), checked.c_str(), r->problems.size());
    if (!r->note.empty()) std::printf("note: %s\n", r->note.c_str());
  }
  return r->problems.empty() ? 0 : 1;
}

// --gguf-arch and --gguf-name win over the same keys of the --gguf-metadata file.
Result<std::vector<GgufKeyValue>> GgufMetadataFrom(const po::variables_map& vm) {
  std::vector<GgufKeyValue> file_keys;
  if (vm.count("gguf-metadata")) {
    const std::string path = vm["gguf-metadata"].as<std::string>();
    SC_ASSIGN_OR_RETURN(std::string text, ReadFileLimited(path, 1u << 20));
    SC_ASSIGN_OR_RETURN(file_keys, ParseGgufMetadataJson(text, path));
  }
  auto flag = [&](const char* name) { return vm.count(name) ? vm[name].as<std::string>() : std::string(); };
  return GgufMetadataWith(flag("gguf-arch"), flag("gguf-name"), file_keys);
}

int ConsolidateCommand(int argc, char** argv) {
  po::options_description flags("consolidate: one state-dict file from a sharded checkpoint");
  flags.add_options()("out", po::value<std::string>()->required(), "output file (.pt, .pth, .bin, .safetensors or .gguf); missing parent folders are made")
      ("format", po::value<std::string>(), "torch | safetensors | gguf (default: from the extension)")
      ("include", po::value<std::vector<std::string>>()->composing(), "keep entries matching this glob (repeatable)")
      ("exclude", po::value<std::vector<std::string>>()->composing(), "drop entries matching this glob (repeatable)")
      ("strip-prefix", po::value<std::string>(), "remove this prefix from names")
      ("dtype", po::value<std::string>(), "cast floating tensors (not float8): bf16 | fp16 | fp32")
      ("max-shard-size", po::value<std::string>(), "safetensors: split into shards of at most SIZE (e.g. 5GB)")
      ("gguf-arch", po::value<std::string>(), "gguf: general.architecture (e.g. llama); required unless in --gguf-metadata")
      ("gguf-name", po::value<std::string>(), "gguf: general.name")
      ("gguf-metadata", po::value<std::string>(), "gguf: a JSON file holding one object of string/int/float/bool metadata values")
      ("json", "machine-readable summary");
  po::variables_map vm = Parse("consolidate", flags, "CHECKPOINT", argc, argv);
  const std::string out = vm["out"].as<std::string>();
  ConsolidateOptions options;
  if (vm.count("format")) {
    std::string f = vm["format"].as<std::string>();
    if (f != "torch" && f != "safetensors" && f != "gguf") throw Usage{"--format must be torch, safetensors or gguf"};
    options.format = f == "torch" ? ExportFormat::kTorch : f == "gguf" ? ExportFormat::kGguf : ExportFormat::kSafetensors;
  } else {
    Result<ExportFormat> f = FormatFromPath(out);
    if (!f.ok()) throw Usage{f.status().message()};
    options.format = *f;
  }
  if (vm.count("include")) options.include = vm["include"].as<std::vector<std::string>>();
  if (vm.count("exclude")) options.exclude = vm["exclude"].as<std::vector<std::string>>();
  if (vm.count("strip-prefix")) options.strip_prefix = vm["strip-prefix"].as<std::string>();
  if (vm.count("dtype")) {
    Result<DType> cast = ParseCastDType(vm["dtype"].as<std::string>());
    if (!cast.ok()) throw Usage{"--" + cast.status().message()};
    options.cast = *cast;
  }
  if (vm.count("max-shard-size")) {
    if (options.format != ExportFormat::kSafetensors) throw Usage{"--max-shard-size applies to safetensors output"};
    options.max_shard_bytes = ParseSize(vm["max-shard-size"].as<std::string>());
  }
  if (options.format == ExportFormat::kGguf) {
    Result<std::vector<GgufKeyValue>> metadata = GgufMetadataFrom(vm);
    if (!metadata.ok()) return Fail(metadata.status());
    options.gguf_metadata = std::move(*metadata);
  } else if (vm.count("gguf-arch") || vm.count("gguf-name") || vm.count("gguf-metadata")) {
    throw Usage{"--gguf-arch, --gguf-name and --gguf-metadata apply to gguf output"};
  }
  ProgressBar bar("consolidate", !vm.count("json"));
  InterruptScope interrupt;
  options.progress = [&](uint64_t d, uint64_t t) { return bar.Update(d, t), InterruptScope::Check(); };
  Result<ConsolidateReport> r = Consolidate(vm["CHECKPOINT"].as<std::string>(), out, options);
  bar.Finish();
  if (!r.ok()) return Fail(r.status());
  if (vm.count("json")) {
    PrintJson(json{{"checkpoint", r->checkpoint}, {"step", StepOf(r->checkpoint)}, {"files", r->files}, {"sha256", r->sha256}, {"entries", r->entries},
                      {"tensor_bytes", r->tensor_bytes}, {"bytes_read", r->bytes_read}, {"aliases", r->aliases},
                      {"values", r->values}, {"skipped", r->skipped}});
  } else {
    for (size_t i = 0; i < r->files.size(); ++i) {
      std::printf("wrote %s%s%s\n", r->files[i].c_str(), i < r->sha256.size() ? "  sha256 " : "",
                  i < r->sha256.size() ? r->sha256[i].c_str() : "");
    }
    std::printf("%llu entries, %llu tensor bytes from %s\n", static_cast<unsigned long long>(r->entries),
                static_cast<unsigned long long>(r->tensor_bytes), r->checkpoint.c_str());
    if (r->aliases) std::printf("%llu tied entries stored once\n", static_cast<unsigned long long>(r->aliases));
    for (const std::string& v : r->values) std::printf("value (not a tensor): %s\n", v.c_str());
    for (const std::string& v : r->skipped) std::printf("not written: %s\n", v.c_str());
  }
  return 0;
}

int Convert(bool import, int argc, char** argv) {
  po::options_description flags(import ? "import: a torch.save file (.pt, .pth, .bin, or any name: .ckpt), a .safetensors file, a Hugging Face sharded set (its "
                                         "*.safetensors.index.json or folder) or a PyTorch DCP folder into a "
                                         "sharded checkpoint with checksums"
                                       : "reshard: a checkpoint for another world size, without a job");
  flags.add_options()("out", po::value<std::string>()->required(), "a new checkpoint root to write into (missing, or holding no checkpoint)")
      ("world-size", po::value<int>()->required(), "ranks of the new checkpoint")
      ("layout", po::value<std::string>()->default_value("flat"), "flat | dim0 | replicated")
      ("json", "machine-readable summary");
  po::variables_map vm = Parse(import ? "import" : "reshard", flags, import ? "FILE" : "CHECKPOINT", argc, argv);
  ConvertOptions options;
  options.world_size = vm["world-size"].as<int>();
  options.layout = vm["layout"].as<std::string>();
  if (options.world_size < 1) throw Usage{"--world-size must be at least 1"};
  if (options.layout != "flat" && options.layout != "dim0" && options.layout != "replicated") {
    throw Usage{"--layout '" + options.layout + "': use flat, dim0 or replicated"};
  }
  ProgressBar bar(import ? "import" : "reshard", !vm.count("json"), import ? "tensors" : "");  // import counts tensors
  InterruptScope interrupt;
  options.progress = [&](uint64_t d, uint64_t t) { return bar.Update(d, t), InterruptScope::Check(); };
  const std::string input = vm[import ? "FILE" : "CHECKPOINT"].as<std::string>();
  Result<ConvertReport> r = import ? ImportFile(input, vm["out"].as<std::string>(), options)
                                   : Reshard(input, vm["out"].as<std::string>(), options);
  bar.Finish();
  if (!r.ok()) return Fail(r.status());
  if (!vm.count("json") && IsDcpFolder(input)) {
    std::printf("the DCP folder %s stores no checksums; the checkpoint written has them: `shardckpt verify %s` checks every byte\n",
                input.c_str(), r->path.c_str());
  }
  if (vm.count("json")) {
    // "checkpoint" and "bytes" as before; "out", "source" and "tensor_bytes" as the other verbs
    // name the written folder, the one read and the tensors' bytes.
    PrintJson(json{{"checkpoint", r->path}, {"out", r->path}, {"source", input}, {"step", StepOf(r->path)},
                      {"tensors", r->tensors}, {"bytes", r->bytes}, {"tensor_bytes", r->bytes}, {"world_size", options.world_size},
                      {"layout", options.layout}, {"skipped", r->skipped}, {"values", r->values}});
  } else {
    std::printf("wrote %s: %llu tensors, %llu bytes, %d ranks, %s layout\n", r->path.c_str(),
                static_cast<unsigned long long>(r->tensors), static_cast<unsigned long long>(r->bytes), options.world_size,
                options.layout.c_str());
    for (const std::string& s : r->skipped) std::printf("skipped: %s\n", s.c_str());
    for (const std::string& s : r->values) std::printf("kept as a blob (not a tensor): %s\n", s.c_str());
  }
  return 0;
}

int ExportCommand(int argc, char** argv) {
  po::options_description flags("export: a checkpoint as another framework's sharded format (streaming)");
  flags.add_options()("format", po::value<std::string>()->required(),
                      "dcp: a PyTorch Distributed Checkpoint folder (dcp.load at any world size, dcp_to_torch_save)")
      ("out", po::value<std::string>()->required(), "the folder to write (new or empty)")
      ("json", "machine-readable summary");
  po::variables_map vm = Parse("export", flags, "CHECKPOINT", argc, argv);
  if (vm["format"].as<std::string>() != "dcp") throw Usage{"--format must be dcp"};
  DcpExportOptions options;
  ProgressBar bar("export", !vm.count("json"));
  InterruptScope interrupt;
  options.progress = [&](uint64_t d, uint64_t t) { return bar.Update(d, t), InterruptScope::Check(); };
  Result<DcpExportReport> r = ExportDcp(vm["CHECKPOINT"].as<std::string>(), vm["out"].as<std::string>(), options);
  bar.Finish();
  if (!r.ok()) return Fail(r.status());
  if (vm.count("json")) {
    PrintJson(json{{"checkpoint", r->checkpoint}, {"step", StepOf(r->checkpoint)}, {"out", r->out}, {"files", r->files}, {"tensors", r->tensors},
                      {"chunks", r->chunks}, {"byte_items", r->byte_items}, {"tensor_bytes", r->tensor_bytes},
                      {"bytes_read", r->bytes_read}, {"skipped", r->skipped}});
  } else {
    std::printf("wrote %s: %llu tensors in %llu chunks, %llu byte items, %llu tensor bytes, %zu files\n", r->out.c_str(),
                static_cast<unsigned long long>(r->tensors), static_cast<unsigned long long>(r->chunks),
                static_cast<unsigned long long>(r->byte_items), static_cast<unsigned long long>(r->tensor_bytes),
                r->files.size());
    for (const std::string& s : r->skipped) std::printf("skipped: %s\n", s.c_str());
  }
  return 0;
}

void AddPolicyFlags(po::options_description& flags) {
  flags.add_options()("keep-last", po::value<int>()->default_value(0), "keep the newest K committed checkpoints")
      ("keep-best", po::value<int>()->default_value(0), "and the best K by --metric")
      ("metric", po::value<std::string>(), "the recorded metric --keep-best ranks by")
      ("mode", po::value<std::string>()->default_value("min"), "min | max: which end of --metric is best");
}

RetentionPolicy PolicyFrom(const po::variables_map& vm) {
  RetentionPolicy policy;
  policy.keep_last = vm["keep-last"].as<int>();
  policy.keep_best = vm["keep-best"].as<int>();
  if (vm.count("metric")) policy.metric = vm["metric"].as<std::string>();
  const std::string mode = vm["mode"].as<std::string>();
  if (mode != "min" && mode != "max") throw Usage{"--mode must be min or max"};
  policy.higher_is_better = mode == "max";
  if (policy.keep_best > 0 && policy.metric.empty()) throw Usage{"--keep-best needs --metric NAME"};
  Status valid = ValidatePolicy(policy);
  if (!valid.ok()) throw Usage{valid.message()};
  return policy;
}

// The one word `list` shows for a folder (its --json `state`).
const char* StateOf(const CheckpointInfo& c) {
  if (c.committed) return c.problem.empty() ? "committed" : c.unreadable ? "unreadable" : "damaged";
  if (c.temp) return "temporary";
  return c.unreachable.empty() ? "partial" : "unreachable";
}

json InfoJson(const CheckpointInfo& c) {
  json out = {{"name", c.name}, {"step", c.step}, {"state", StateOf(c)}, {"committed", c.committed}, {"temporary", c.temp},
              {"symlink", c.symlink}, {"time", c.time}, {"world_size", c.world_size}, {"bytes", c.bytes},
              {"metrics", c.metrics}, {"keep", c.keep}, {"why", c.why}};
  if (!c.problem.empty()) out["problem"] = c.problem;
  if (c.unreadable) out["unreadable"] = true;  // a problem that is not known damage: kept
  if (!c.unreachable.empty()) out["unreachable"] = c.unreachable;
  return out;
}

std::string MetricsText(const std::map<std::string, double>& metrics) {
  std::string out;
  for (const auto& [k, v] : metrics) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.6g", v);
    out += (out.empty() ? "" : " ") + k + "=" + buf;
  }
  return out.empty() ? "-" : out;
}

// list and prune take a root folder; a link to one that cannot be reached now (an archive not
// mounted, a loop of links) is named as such, not as "not a folder".
Status RequireRootFolder(const std::string& root) {
  SC_RETURN_IF_ERROR(RefuseEmptyRoot(root));
  if (IsDirectory(root)) return Status::Ok();
  if (const std::string why = UnreachableLink(root); !why.empty()) return FailedPrecondition(root + " is " + why);
  return NotFound(root + " is not a folder");
}

int List(int argc, char** argv) {
  po::options_description flags("list: every checkpoint of a root, and which ones retention would keep");
  flags.add_options()("json", "machine-readable output");
  AddPolicyFlags(flags);
  po::variables_map vm = Parse("list", flags, "ROOT", argc, argv);
  const std::string root = vm["ROOT"].as<std::string>();
  RetentionPolicy policy = PolicyFrom(vm);
  if (Status folder = RequireRootFolder(root); !folder.ok()) return Fail(folder);
  if (Status root_ok = RefuseCheckpointAsRoot(root, "list"); !root_ok.ok()) return Fail(root_ok);
  Result<std::vector<CheckpointInfo>> all = ListCheckpoints(root);
  if (!all.ok()) return Fail(all.status());
  // The preview refuses what prune would refuse, rather than show removals that will not happen.
  Status recorded = CheckMetricRecorded(policy, root, *all);
  if (!recorded.ok()) return Fail(recorded);
  // What readers resolve the root to; a `latest` naming another folder (a save stopped between
  // its rename and `latest`) is shown as such, and the next save or prune mends it.
  const std::string latest = NewestCommitted(*all), latest_file = ReadLatestName(root);
  PlanRetention(policy, latest, &*all);
  // A save or prune running now: its temporary folder is no leftover of a dead save. And a
  // folder retention would remove that a reader holds now is left by a prune until it is free.
  const bool save_running = RootLock::Held(root);
  auto retention_of = [&](const CheckpointInfo& c) -> std::string {
    if (c.committed && c.keep) return "keep: " + c.why;
    if (c.committed) return HeldByReader(root, c.name) ? "would remove (a reader holds it now)" : "would remove";
    if (c.foreign == c.name) return std::string("left: a file, not a folder a save writes");
    if (!c.unreachable.empty()) return "left: " + c.unreachable;
    if (c.temp && save_running) return "a save or prune holds the root now (perhaps its own)";
    if (!c.foreign.empty()) return "left: holds " + c.foreign + ", which no save writes";
    return "next save removes";
  };
  // A step folder newer than every committed one that cannot be reached now: readers refuse the
  // root while it is so, naming the first such step (ResolveCheckpoint), rather than use `latest`.
  const CheckpointInfo* unreachable_newest = nullptr;
  for (const CheckpointInfo& c : *all) {
    if (c.unreachable.empty()) continue;
    const bool newer = std::none_of(all->begin(), all->end(), [&](const CheckpointInfo& o) {
      return o.committed && o.step >= c.step;
    });
    if (newer && (unreachable_newest == nullptr || c.step < unreachable_newest->step)) unreachable_newest = &c;
  }
  const Status latest_in_the_way = CheckLatestIsNoFolder(root);
  if (vm.count("json")) {
    json rows = json::array();
    for (const CheckpointInfo& c : *all) {
      rows.push_back(InfoJson(c));
      rows.back()["retention"] = retention_of(c);
    }
    json out{{"root", root}, {"latest", latest}, {"save_running", save_running}, {"checkpoints", rows}};
    if (latest_file != latest) out["latest_file"] = latest_file;
    if (unreachable_newest != nullptr) out["unreachable_newest"] = unreachable_newest->name;
    if (!latest_in_the_way.ok()) out["latest_is_a_folder"] = true;
    PrintJson(out);
    return 0;
  }
  if (!latest_in_the_way.ok()) {
    std::fprintf(stderr, "note: %s; saves and prune refuse the root until then\n", latest_in_the_way.message().c_str());
  }
  if (unreachable_newest != nullptr) {
    std::fprintf(stderr, "note: %s, newer than every committed checkpoint, is %s: loading the root is refused until it "
                 "is back%s\n",
                 JoinPath(root, unreachable_newest->name).c_str(), unreachable_newest->unreachable.c_str(),
                 latest.empty() ? " (the root holds no committed checkpoint)" : " (name a checkpoint folder to read an older one)");
  } else if (latest_file != latest && latest_in_the_way.ok()) {
    const std::string path = JoinPath(root, kLatestName);
    // No `latest` at all: a root copied without it, or one it was removed from; not a save that
    // stopped (which leaves the one before).
    const bool missing = latest_file.empty() && !PathExists(path);
    const std::string named = missing ? root + " has no " + kLatestName + " file"
                                      : path + " names " + (latest_file.empty() ? "nothing" : WithNulsShown(latest_file));
    if (latest.empty()) {
      std::fprintf(stderr, "note: %s, which is not a committed checkpoint\n", named.c_str());
    } else {
      std::fprintf(stderr, "note: %s; readers use %s, the newest committed checkpoint%s; the next save or prune "
                   "mends it\n", named.c_str(), latest.c_str(),
                   missing ? "" : " (a save stopped before updating latest, or it was edited)");
    }
  }
  // The folder column as wide as the longest name (a temporary or retired folder's is 50 or more).
  size_t width = 28;
  for (const CheckpointInfo& c : *all) width = std::max(width, c.name.size() + (c.symlink ? 1 : 0));
  const int w = static_cast<int>(width);
  std::printf("%-*s %12s %-10s %-20s %6s %14s  %-28s %s\n", w, "folder", "step", "state", "time", "ranks", "bytes",
              "metrics", "retention");
  for (const CheckpointInfo& c : *all) {
    const char* state = StateOf(c);
    std::string name = c.name + (c.symlink ? "@" : "");
    std::printf("%-*s %12lld %-10s %-20s %6d %14llu  %-28s %s\n", w, name.c_str(), static_cast<long long>(c.step), state,
                c.time.empty() ? "-" : c.time.c_str(), c.world_size, static_cast<unsigned long long>(c.bytes),
                MetricsText(c.metrics).c_str(), retention_of(c).c_str());
    if (!c.problem.empty() && (c.committed || !c.foreign.empty() || !c.unreachable.empty())) {
      std::printf("    %s\n", c.problem.c_str());
    }
  }
  return 0;
}

int Prune(int argc, char** argv) {
  po::options_description flags("prune: apply a retention rule to a root now");
  flags.add_options()("dry-run", "print what would be removed; remove nothing")("json", "machine-readable output");
  AddPolicyFlags(flags);
  po::variables_map vm = Parse("prune", flags, "ROOT", argc, argv);
  const std::string root = vm["ROOT"].as<std::string>();
  RetentionPolicy policy = PolicyFrom(vm);
  if (policy.KeepsEverything()) throw Usage{"prune needs --keep-last K and/or --keep-best K (K >= 1)"};
  const bool dry_run = vm.count("dry-run") > 0;
  if (Status folder = RequireRootFolder(root); !folder.ok()) return Fail(folder);
  if (Status root_ok = RefuseCheckpointAsRoot(root, "prune"); !root_ok.ok()) return Fail(root_ok);
  // A folder with nothing a save writes (no step, temporary or retired folder, no `latest`): not
  // a root, or not one yet; said so, and no lock files are left in it. A dry run (no lock, a
  // moment's view) takes its leftovers from this listing too.
  Result<std::vector<CheckpointInfo>> listed = ListCheckpoints(root, /*with_manifests=*/false, /*with_bytes=*/false);
  if (!listed.ok()) return Fail(listed.status());
  if (listed->empty() && !PathExists(JoinPath(root, kLatestName))) {
    if (vm.count("json")) {
      PrintJson(json{{"ok", true}, {"root", root}, {"dry_run", dry_run}, {"removed", json::array()},
                     {"deferred", json::array()}, {"failed", json::array()}, {"left_alone", json::array()},
                     {"save_running", false}});
    } else {
      std::printf("nothing to prune: %s holds no checkpoint folders\n", root.c_str());
    }
    return 0;
  }
  // The writer lock: a save into this root and a prune never interleave (a save waits for it).
  // A dry run writes nothing, not even the lock files, and shows a moment's view.
  std::optional<RootLock> lock;
  // On a read-only file system no lock can be made, and nothing can write there either: the
  // rule is worked out as a dry run, and only a rule that would remove something fails.
  bool read_only = false;
  if (!dry_run) {
    Result<RootLock> held = RootLock::AcquireForPrune(root);
    struct statvfs fs {};
    read_only = !held.ok() && ::statvfs(root.c_str(), &fs) == 0 && (fs.f_flag & ST_RDONLY) != 0;
    if (!held.ok() && !read_only) return Fail(held.status());
    if (held.ok()) lock.emplace(std::move(*held));
  }
  const bool plan_only = dry_run || read_only;
  if (policy.keep_best > 0) {
    // A misspelt metric would make nothing best: every checkpoint but the newest would go.
    Result<std::vector<CheckpointInfo>> ranked = ListCheckpoints(root);
    if (!ranked.ok()) return Fail(ranked.status());
    Status recorded = CheckMetricRecorded(policy, root, *ranked);
    if (!recorded.ok()) return Fail(recorded);
  }
  // Leftovers of dead saves: what was removed, and what was left (a reader holds it, or another
  // process is removing a retired folder), as the removal reports them, not as listed before it.
  std::vector<std::string> leftovers, left;
  std::vector<RemovalFailure> failed;
  // On a full disk `latest` cannot be rewritten, and prune is how an operator frees space: the
  // removals go first, keeping the folder `latest` names, and `latest` is mended after them.
  Status repaired = Status::Ok();
  std::string kept_for_latest;
  if (!plan_only) {
    repaired = RepairLatest(root);
    if (repaired.code() == Code::kNoSpace) {
      kept_for_latest = ReadLatestName(root);
      std::fprintf(stderr, "%s; removing first (keeping %s, which `latest` names), then mending `latest`\n",
                   repaired.ToString().c_str(), kept_for_latest.empty() ? "nothing" : kept_for_latest.c_str());
    } else if (!repaired.ok()) {
      return Fail(repaired);
    }
  } else if (Status latest_ok = CheckLatestIsNoFolder(root); !latest_ok.ok()) {
    return Fail(latest_ok);  // as the real prune refuses it
  }
  // A dry run beside a live save must not call the save's temporary folder a leftover.
  const bool save_running = dry_run && RootLock::Held(root);
  if (plan_only) {
    for (const CheckpointInfo& c : *listed) {
      if (c.committed || (save_running && c.temp)) continue;
      if (!c.foreign.empty()) {  // as the cleanup would report it
        failed.push_back(RemovalFailure{c.name, LeftForItsFiles(root, c.name, c.foreign), /*on_purpose=*/true});
        continue;
      }
      if (!c.unreachable.empty()) {
        failed.push_back(RemovalFailure{c.name, LeftUnreachable(root, c.name, c.unreachable), /*on_purpose=*/true});
        continue;
      }
      (HeldByReader(root, c.name) ? left : leftovers).push_back(c.name);
    }
  } else {
    Status cleaned = RemoveStaleTempDirs(root, &leftovers, &left, &failed);
    if (!cleaned.ok()) return Fail(cleaned);
  }
  Result<RetentionReport> r = ApplyRetention(root, policy, "", plan_only, Removal::kNow, kept_for_latest);
  if (!r.ok()) return Fail(r.status());
  if (!repaired.ok()) {
    repaired = RepairLatest(root);
    if (!repaired.ok()) std::fprintf(stderr, "`latest` is still not mended: %s\n", repaired.ToString().c_str());
  }
  if (read_only && !(r->removed.empty() && leftovers.empty())) {
    const std::string first = leftovers.empty() ? r->removed.front() : leftovers.front();
    return Fail(FailedPrecondition(root + " is on a read-only file system: the rule would remove " +
                                   std::to_string(r->removed.size() + leftovers.size()) + " folder(s), " +
                                   JoinPath(root, first) + " first; remount it read-write to prune"));
  }
  r->removed.insert(r->removed.begin(), leftovers.begin(), leftovers.end());
  r->deferred.insert(r->deferred.begin(), left.begin(), left.end());
  failed.insert(failed.end(), r->failed.begin(), r->failed.end());
  // Folders of someone's own files are left by design: named, no failure (a cron job's prune
  // would otherwise fail for as long as they stay).
  std::vector<RemovalFailure> left_alone;
  for (auto f = failed.begin(); f != failed.end();) {
    if (f->on_purpose) {
      left_alone.push_back(std::move(*f));
      f = failed.erase(f);
    } else {
      ++f;
    }
  }
  // The cleanup logged the ones it passed over; a plan (dry run, read-only root) names them here.
  if (plan_only) {
    for (const RemovalFailure& f : left_alone) std::fprintf(stderr, "left %s: %s\n", JoinPath(root, f.name).c_str(), f.status.message().c_str());
  }
  // On stderr with --json too, as every failure of a --json command gives its message.
  for (const RemovalFailure& f : failed) {
    std::fprintf(stderr, "%s %s: %s\n", dry_run ? "would not remove" : "could not remove", JoinPath(root, f.name).c_str(),
                 f.status.ToString().c_str());
  }
  // What could not be deleted is named, the rest is still removed, and the exit status says so.
  const bool ok = failed.empty() && repaired.ok();
  const int status = ok ? 0 : 1;
  if (vm.count("json")) {
    auto rows = [](const std::vector<RemovalFailure>& list) {
      json out = json::array();
      for (const RemovalFailure& f : list) {
        out.push_back(json{{"folder", f.name}, {"code", CodeName(f.status.code())}, {"message", f.status.message()}});
      }
      return out;
    };
    json out{{"ok", ok}, {"root", root}, {"dry_run", dry_run}, {"removed", r->removed},
             {"deferred", r->deferred}, {"failed", rows(failed)}, {"left_alone", rows(left_alone)},
             {"save_running", save_running}};
    if (!repaired.ok()) out["latest"] = json{{"code", CodeName(repaired.code())}, {"message", repaired.message()}};
    PrintJson(out);
    return status;
  }
  if (save_running) {
    std::printf("a save or prune holds %s now: temporary folders are not listed (they may be its own), and "
                "prune without --dry-run fails until it is done\n",
                root.c_str());
  }
  for (const std::string& name : r->removed) std::printf("%s %s\n", dry_run ? "would remove" : "removed", JoinPath(root, name).c_str());
  for (const std::string& name : r->deferred) {
    std::printf("%s for now (a reader holds it%s): %s\n", dry_run ? "would be kept" : "kept",
                IsRetiredDirName(name) ? ", or another process is removing it" : "", JoinPath(root, name).c_str());
  }
  std::printf("%zu folder(s) %s\n", r->removed.size(), dry_run ? "would be removed (dry run)" : "removed");
  if (!failed.empty()) std::fprintf(stderr, "%zu folder(s) %s\n", failed.size(), dry_run ? "would not be removed" : "could not be removed");
  return status;
}

const char* kUsage =
    "usage: shardckpt COMMAND [options]   (COMMAND --help for each; --version)\n"
    "  CHECKPOINT: a shardckpt checkpoint (or its root: the newest) or a PyTorch DCP folder\n"
    "  inspect CHECKPOINT       what a checkpoint holds\n"
    "  verify CHECKPOINT        read everything, check every checksum\n"
    "  consolidate CHECKPOINT   one .pt, .safetensors or .gguf file (streaming)\n"
    "  export CHECKPOINT        a PyTorch DCP folder (--format dcp, streaming)\n"
    "  import FILE              a torch.save file, .safetensors, Hugging Face set or DCP folder into a checkpoint\n"
    "  reshard CHECKPOINT       a checkpoint for another world size\n"
    "  list ROOT                every checkpoint of a root, and what retention keeps\n"
    "  prune ROOT               apply --keep-last / --keep-best to a root now\n";

}  // namespace

// import and reshard write every rank's file at once, each with its own descriptor and ring: at
// the default soft limit of 1024 open files a reshard to about 500 ranks failed. The hard limit
// is the operator's ceiling; the soft one is only a default, which a tool that needs more raises.
void RaiseOpenFileLimit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

int main(int argc, char** argv) {
  RaiseOpenFileLimit();
  // Past a file-size limit (ulimit -f) a write fails with EFBIG, reported and cleaned up like a
  // full disk; the signal's default action killed the tool silently, its partial output left.
  std::signal(SIGXFSZ, SIG_IGN);
  if (argc >= 2 && std::string(argv[1]) == "--version") {
    std::printf("shardckpt %s (checkpoint format %d.%d)\n", kVersion, kFormatMajor, kFormatMinor);
    return 0;
  }
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  try {
    if (command == "inspect") return Inspect(argc - 1, argv + 1);
    if (command == "verify") return Verify(argc - 1, argv + 1);
    if (command == "consolidate") return ConsolidateCommand(argc - 1, argv + 1);
    if (command == "import") return Convert(true, argc - 1, argv + 1);
    if (command == "export") return ExportCommand(argc - 1, argv + 1);
    if (command == "reshard") return Convert(false, argc - 1, argv + 1);
    if (command == "list") return List(argc - 1, argv + 1);
    if (command == "prune") return Prune(argc - 1, argv + 1);
    throw Usage{"unknown command '" + command + "' (commands: inspect, verify, consolidate, export, import, reshard, "
                "list, prune; shardckpt --help says what each does)"};
  } catch (const Usage& u) {
    std::fprintf(stderr, "shardckpt %s: %s\n", command.c_str(), u.message.c_str());
    // --json is looked for in argv: the error may be that the flags did not parse at all.
    for (int i = 2; i < argc; ++i) {
      if (std::string(argv[i]) == "--json") {
        PrintJsonError("Usage", u.message);
        break;
      }
    }
    return 2;
  }
}
