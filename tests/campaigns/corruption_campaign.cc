// Corruption campaign: damage a committed checkpoint at random -- flip a bit, flip a byte, or
// truncate, in a random data file or the manifest -- and check that both `verify` and a full
// load detect it and name the damaged file (or an entry in it), with no crash. Prints trials and
// detections; exits non-zero unless every trial is detected by both.
//
//   build/bin/corruption_campaign [--trials 1000] [--seed S] [--dir D]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "shardckpt/engine/core/checkpoint_reader.h"
#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/offline_writer.h"
#include "shardckpt/engine/core/verify.h"
#include "shardckpt/io/fs.h"

using namespace shardckpt;

namespace {

Status LoadEverything(const std::string& root) {
  SC_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(root));
  const Manifest& m = reader->manifest();
  for (size_t i = 0; i < m.entries.size(); ++i) {
    std::vector<unsigned char> out(static_cast<size_t>(NumBytes(m.entries[i].shape, DTypeSize(m.entries[i].dtype)).value()));
    SC_RETURN_IF_ERROR(reader->ReadPiece(i, Layout::Whole(), out.data()));
  }
  for (const BlobRecord& b : m.blobs) SC_RETURN_IF_ERROR(reader->ReadBlob(b).status());
  return Status::Ok();
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

}  // namespace

int main(int argc, char** argv) {
  int trials = 1000;
  unsigned seed = 2026;
  std::string dir = "/tmp/shardckpt-corruption";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--trials")) trials = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--seed")) seed = static_cast<unsigned>(std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--dir")) dir = argv[i + 1];
  }
  RemoveTree(dir).IgnoreError();
  // A checkpoint of 3 rank files: flat-sharded entries of several dtypes, and blobs.
  {
    auto out = OfflineCheckpointWriter::Begin(dir, 1, 3).value();
    std::mt19937 fill(1);
    const std::vector<std::pair<DType, Shape>> kinds = {{DType::kFloat32, {300, 70}}, {DType::kBFloat16, {64, 33}},
                                                        {DType::kInt64, {129}}, {DType::kUInt8, {5000}}};
    for (size_t e = 0; e < kinds.size(); ++e) {
      for (int r = 0; r < 3; ++r) {
        Layout l = FlatShardLayout(kinds[e].second, 3, r);
        std::vector<unsigned char> bytes(static_cast<size_t>(l.end - l.begin) * DTypeSize(kinds[e].first));
        for (auto& b : bytes) b = static_cast<unsigned char>(fill());
        out->AddPiece(r, "entry" + std::to_string(e), kinds[e].first, kinds[e].second, l, bytes.data(), bytes.size()).IgnoreError();
      }
    }
    out->AddBlob(0, "step", BlobScope::kGlobal, "1").IgnoreError();
    for (int r = 0; r < 3; ++r) out->AddBlob(r, "rng", BlobScope::kPerRank, std::string(100, static_cast<char>('a' + r))).IgnoreError();
    if (!out->Commit(MakeCreationInfo(1, "", "", {})).ok()) return 2;
  }
  const std::string ckpt = JoinPath(dir, "step-000000001");
  std::vector<std::string> names = {"manifest.json", "rank-00000.bin", "rank-00001.bin", "rank-00002.bin"};
  std::vector<std::string> pristine;
  for (const std::string& n : names) pristine.push_back(ReadFileLimited(JoinPath(ckpt, n), 1 << 26).value());
  if (!VerifyCheckpoint(dir).ok() || !VerifyCheckpoint(dir)->problems.empty() || !LoadEverything(dir).ok()) {
    std::fprintf(stderr, "the pristine checkpoint does not verify\n");
    return 2;
  }
  std::mt19937_64 rng(seed);
  int by_verify = 0, by_load = 0, named = 0, flips = 0, bytes = 0, truncations = 0;
  for (int t = 0; t < trials; ++t) {
    size_t f = rng() % names.size();
    std::string damaged = pristine[f];
    int kind = static_cast<int>(rng() % 3);
    size_t at = rng() % damaged.size();
    if (kind == 0) {
      damaged[at] ^= static_cast<char>(1u << (rng() % 8));
      ++flips;
    } else if (kind == 1) {
      damaged[at] ^= static_cast<char>(1 + rng() % 255);
      ++bytes;
    } else {
      damaged.resize(at);
      ++truncations;
    }
    WriteBytes(JoinPath(ckpt, names[f]), damaged);
    Result<VerifyReport> v = VerifyCheckpoint(dir);
    std::string verify_text = v.ok() ? "" : v.status().message();
    if (v.ok()) {
      for (const VerifyProblem& p : v->problems) verify_text += p.file + " " + HoldersText(p) + " " + p.what + "; ";
    }
    bool verified = !v.ok() || !v->problems.empty();
    Status load = LoadEverything(dir);
    by_verify += verified;
    by_load += !load.ok();
    if (verify_text.find(names[f]) != std::string::npos && load.message().find(names[f]) != std::string::npos) ++named;
    else if (verified && !load.ok()) {
      std::fprintf(stderr, "trial %d (%s, kind %d at %zu): detected but not named:\n  verify: %s\n  load: %s\n", t,
                   names[f].c_str(), kind, at, verify_text.c_str(), load.message().c_str());
    }
    if (!verified || load.ok()) {
      std::fprintf(stderr, "trial %d: %s damaged (kind %d at %zu) was NOT detected (verify %d, load %s)\n", t,
                   names[f].c_str(), kind, at, verified, load.ToString().c_str());
    }
    WriteBytes(JoinPath(ckpt, names[f]), pristine[f]);
  }
  std::printf("corruption campaign: %d trials (%d bit flips, %d byte flips, %d truncations); detected by verify %d, "
              "by load %d, file named by both %d\n",
              trials, flips, bytes, truncations, by_verify, by_load, named);
  std::printf("%d passed, %d failed\n", named, trials - named);
  RemoveTree(dir).IgnoreError();
  return by_verify == trials && by_load == trials && named == trials ? 0 : 1;
}
