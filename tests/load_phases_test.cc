// Each phase of Load on its own (engine/core/load_phases.h): the pure steps by tables, the
// collective ones with the single-process communicator.
#include "shardckpt/engine/core/load_phases.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/engine/model/manifest_wire.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "test_util.h"

namespace shardckpt::load_phases {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// The wire bits of EntryWant, named as the tables below read them.
constexpr unsigned char kWanted = EntryWant::kWanted, kWantedWhole = EntryWant::kWhole,
                        kWantedPart = EntryWant::kPart, kWholeOnDevice = EntryWant::kWholeOnDevice;

// Entries "a" float32 [4] and "b" float32 [2, 2].
Manifest TwoEntries() {
  Manifest m;
  m.world_size = 1;
  m.entries.push_back(EntryRecord{"a", DType::kFloat32, {4}, {}});
  m.entries.push_back(EntryRecord{"b", DType::kFloat32, {2, 2}, {}});
  return m;
}

struct Want {
  std::string name;
  DType dtype;
  Shape shape;
  Layout layout;
};

TEST(MatchPieces, FlagsMissingAndMismatches) {
  float buffer[16] = {};
  const Layout half = Layout::Box({0}, {2});
  struct Case {
    const char* what;
    std::vector<Want> wants;
    std::function<std::string(const std::string&)> rename;
    std::vector<long> entry_of_piece;
    std::string flags;  // by entry
    std::vector<std::string> missing;
    std::string error;  // substring; "" for Ok
  } cases[] = {
      {"whole", {{"a", DType::kFloat32, {4}, Layout::Whole()}}, nullptr, {0}, {char(kWanted | kWantedWhole), 0}, {}, ""},
      {"part", {{"a", DType::kFloat32, {4}, half}}, nullptr, {0}, {char(kWanted | kWantedPart), 0}, {}, ""},
      {"whole and part",
       {{"b", DType::kFloat32, {2, 2}, Layout::Whole()}, {"a", DType::kFloat32, {4}, half},
        {"a", DType::kFloat32, {4}, Layout::Whole()}},
       nullptr, {1, 0, 0}, {char(kWanted | kWantedWhole | kWantedPart), char(kWanted | kWantedWhole)}, {}, ""},
      {"missing once", {{"c", DType::kFloat32, {4}, half}, {"c", DType::kFloat32, {4}, half}}, nullptr, {-1, -1},
       {0, 0}, {"c"}, ""},
      {"dtype", {{"a", DType::kInt32, {4}, Layout::Whole()}}, nullptr, {0}, {char(kWanted | kWantedWhole), 0},
       {}, "entry 'a' is float32 in the checkpoint but int32 in the target (no silent casts)"},
      {"shape", {{"b", DType::kFloat32, {4}, Layout::Whole()}}, nullptr, {1}, {0, char(kWanted | kWantedWhole)},
       {}, "entry 'b' has shape [2, 2] in the checkpoint but [4] in the target"},
      {"dtype and shape",
       {{"a", DType::kInt32, {4}, Layout::Whole()}, {"b", DType::kFloat32, {4}, Layout::Whole()}}, nullptr, {0, 1},
       {char(kWanted | kWantedWhole), char(kWanted | kWantedWhole)}, {},
       "entry 'a' is float32 in the checkpoint but int32 in the target (no silent casts); 1 more entry differs: "
       "entry 'b' has shape [2, 2] in the checkpoint but [4] in the target"},
      {"renamed", {{"m.a", DType::kFloat32, {4}, Layout::Whole()}}, AddPrefix("m."), {0},
       {char(kWanted | kWantedWhole), 0}, {}, ""},
  };
  for (const Case& c : cases) {
    ShardedState targets;
    for (const Want& w : c.wants) ASSERT_TRUE(targets.AddTensor(w.name, w.dtype, w.shape, w.layout, buffer).ok()) << c.what;
    LoadOptions options;
    options.rename = c.rename;
    LocalMatch match = MatchPieces(TwoEntries(), targets, options);
    EXPECT_EQ(match.entry_of_piece, c.entry_of_piece) << c.what;
    EXPECT_EQ(EncodeEntryWants(match.wants), c.flags) << c.what;
    EXPECT_EQ(match.missing, c.missing) << c.what;
    if (c.error.empty()) {
      EXPECT_TRUE(match.status.ok()) << c.what << ": " << match.status.ToString();
    } else {
      EXPECT_EQ(match.status.code(), Code::kInvalidArgument) << c.what;
      EXPECT_THAT(match.status.message(), HasSubstr(c.error)) << c.what;
    }
  }
}

// A model cast to another dtype differs from its checkpoint in every entry: all are counted, each
// once however many pieces want it, and the first few named.
TEST(MatchPieces, EveryMismatchIsCountedAndTheFirstFewNamed) {
  int32_t buffer[4] = {};
  Manifest m;
  m.world_size = 1;
  for (int i = 0; i < 9; ++i) m.entries.push_back(EntryRecord{"w" + std::to_string(i), DType::kFloat32, {4}, {}});
  ShardedState targets;
  for (int i = 0; i < 9; ++i) {
    for (const Layout& half : {Layout::Box({0}, {2}), Layout::Box({2}, {2})}) {
      ASSERT_TRUE(targets.AddTensor("w" + std::to_string(i), DType::kInt32, {4}, half, buffer).ok());
    }
  }
  const LocalMatch match = MatchPieces(m, targets, LoadOptions{});
  EXPECT_EQ(match.status.code(), Code::kInvalidArgument);
  std::string expected = "entry 'w0' is float32 in the checkpoint but int32 in the target (no silent casts); 8 more entries differ";
  for (int i = 1; i < 5; ++i) {
    expected += (i == 1 ? ": " : "; ") + ("entry 'w" + std::to_string(i)) + "' is float32 in the checkpoint but int32 in "
                "the target (no silent casts)";
  }
  EXPECT_EQ(match.status.message(), expected + "; ...");
}

// More pieces than the lookups MatchPieces runs ahead, in another order than the manifest's
// (sorted) entries, with names the checkpoint lacks between them, renamed and not.
TEST(MatchPieces, ManyPiecesInTheirOwnOrderFindTheirEntries) {
  float buffer[4] = {};
  Manifest m;
  m.world_size = 1;
  for (int i = 0; i < 500; ++i) m.entries.push_back(EntryRecord{"layer." + std::to_string(i), DType::kFloat32, {4}, {}});
  std::sort(m.entries.begin(), m.entries.end(), [](const EntryRecord& a, const EntryRecord& b) { return a.name < b.name; });
  for (const char* prefix : {"", "model."}) {
    ShardedState targets;
    std::vector<long> expected;
    std::vector<std::string> missing;
    for (int i = 499; i >= 0; i -= (i % 7 == 0 ? 2 : 1)) {
      const std::string name = prefix + ("layer." + std::to_string(i));
      ASSERT_TRUE(targets.AddTensor(name, DType::kFloat32, {4}, Layout::Whole(), buffer).ok());
      auto at = std::find_if(m.entries.begin(), m.entries.end(), [&](const EntryRecord& e) { return prefix + e.name == name; });
      expected.push_back(at - m.entries.begin());
      if (i % 5 == 0) {
        missing.push_back(prefix + ("extra." + std::to_string(i)));
        ASSERT_TRUE(targets.AddTensor(missing.back(), DType::kFloat32, {4}, Layout::Whole(), buffer).ok());
        expected.push_back(-1);
      }
    }
    LoadOptions options;
    if (*prefix != '\0') options.rename = AddPrefix(prefix);
    LocalMatch match = MatchPieces(m, targets, options);
    EXPECT_EQ(match.entry_of_piece, expected) << prefix;
    EXPECT_EQ(match.missing, missing) << prefix;
    EXPECT_TRUE(match.status.ok()) << match.status.ToString();
  }
}

// Every count of pieces around the look-ahead distances, the piece list often exactly full (a
// power of two): no stage reads past its end (ASan runs this), and each piece finds its entry
// and is planned once.
TEST(MatchPieces, AnyNumberOfPiecesAroundTheLookAheadIsMatchedAndPlanned) {
  float buffer[4] = {};
  for (int n = 0; n <= 40; ++n) {
    Manifest m;
    m.world_size = 1;
    m.files.push_back(FileRecord{"rank-00000.bin", 8192, 4096, {0}});
    for (int i = 0; i < n; ++i) {
      char name[16];
      std::snprintf(name, sizeof(name), "t%03d", i);  // sorted as the manifest's entries are
      m.entries.push_back(EntryRecord{name, DType::kFloat32, {4}, {ChunkRecord{0, uint64_t(16 * i), 16, Layout::Whole()}}});
    }
    ShardedState targets;
    std::vector<long> expected;
    for (int i = n - 1; i >= 0; --i) {
      ASSERT_TRUE(targets.AddTensor(m.entries[i].name, DType::kFloat32, {4}, Layout::Whole(), buffer).ok());
      expected.push_back(i);
    }
    Match match;
    match.local = MatchPieces(m, targets, LoadOptions{});
    EXPECT_EQ(match.local.entry_of_piece, expected) << n;
    match.reader_of.assign(m.entries.size(), -1);
    LoadReport report;
    ReadWork work = PlanReads(m, targets, match, 0, 1, ReadPlanOptions{}, false, &report);
    EXPECT_EQ(work.targets.names.size(), static_cast<size_t>(n));
    EXPECT_EQ(work.plan.bytes_wanted, 16u * n);
  }
}

// A rename (strip_prefix) that makes two saved names one is refused naming both where a target
// wants that name; a partial load that wants neither, and a per-rank value stored by several
// ranks under one name, are not.
TEST(RenameCollisions, AWantedNameMadeOfTwoSavedNamesIsNamed) {
  Manifest m;
  m.entries.push_back(EntryRecord{"a", DType::kFloat32, {4}, {}});
  m.entries.push_back(EntryRecord{"module.a", DType::kFloat32, {4}, {}});
  m.entries.push_back(EntryRecord{"module.b", DType::kFloat32, {4}, {}});
  m.blobs.push_back(BlobRecord{"module.rng", BlobScope::kPerRank, 0, 0, 0, 1});
  m.blobs.push_back(BlobRecord{"module.rng", BlobScope::kPerRank, 1, 0, 0, 1});
  m.blobs.push_back(BlobRecord{"v", BlobScope::kGlobal, 0, 0, 0, 1});
  m.blobs.push_back(BlobRecord{"module.v", BlobScope::kGlobal, 0, 0, 0, 1});
  LoadOptions options;
  options.rename = StripPrefix("module.");
  std::vector<float> buffer(4);
  ShardedState only_b;
  ASSERT_TRUE(only_b.AddTensor("b", DType::kFloat32, {4}, Layout::Whole(), buffer.data()).ok());
  EXPECT_TRUE(MatchPieces(m, only_b, options).status.ok());
  EXPECT_TRUE(MatchValues(m, {"rng"}, options).status.ok());
  ShardedState wants_a;
  ASSERT_TRUE(wants_a.AddTensor("a", DType::kFloat32, {4}, Layout::Whole(), buffer.data()).ok());
  Status tensors = MatchPieces(m, wants_a, options).status;
  EXPECT_EQ(tensors.code(), Code::kInvalidArgument);
  EXPECT_THAT(tensors.message(), HasSubstr("'a' and 'module.a' of the checkpoint both become 'a' after the rename"));
  Status values = MatchValues(m, {"v"}, options).status;
  EXPECT_THAT(values.message(), HasSubstr("'v' and 'module.v' of the checkpoint both become 'v'"));
  options.rename = nullptr;
  EXPECT_TRUE(MatchPieces(m, wants_a, options).status.ok());
}

TEST(ParseManifestSharing, TheThreeNamesAndNothingElse) {
  EXPECT_EQ(ParseManifestSharing("auto").value(), ManifestSharing::kAuto);
  EXPECT_EQ(ParseManifestSharing("root").value(), ManifestSharing::kRootSends);
  EXPECT_EQ(ParseManifestSharing("every-rank").value(), ManifestSharing::kEveryRankParses);
  for (const char* bad : {"", "Root", "every_rank", "all"}) {
    const Result<ManifestSharing> parsed = ParseManifestSharing(bad);
    EXPECT_EQ(parsed.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_THAT(parsed.status().message(), HasSubstr("use auto, root or every-rank")) << bad;
  }
}

TEST(EveryRankParses, ForcedOrWhereEveryHostHasACpuPerRank) {
  using M = ManifestSharing;
  EXPECT_TRUE(EveryRankParses(M::kEveryRankParses, {}));
  EXPECT_FALSE(EveryRankParses(M::kRootSends, {"64 a", "64 a"}));
  // With the CPUs each rank has to itself, and the threads each decodes on.
  const struct {
    const char* what;
    std::vector<std::string> ranks;
    bool expected;
    long cpus_per_rank;
    size_t decode_threads;
  } cases[] = {
      {"2 ranks, both on CPUs 0-1", {"0 3 a", "0 3 a"}, true, 1, 1},
      {"2 ranks bound one to each CPU", {"0 1 a", "0 2 a"}, true, 1, 1},
      {"2 ranks both bound to CPU 0 (taskset -c 0)", {"0 1 a", "0 1 a"}, false, 0, 1},
      {"3 ranks on 2 CPUs", {"0 3 a", "0 3 a", "0 3 a"}, false, 0, 1},
      {"CPUs 4-7 and 0-3", {"0 0f a", "0 f a"}, true, 4, 4},
      {"two hosts, each with enough", {"0 3 a", "0 3 b", "0 3 a", "0 3 b"}, true, 1, 1},
      {"one host of two short", {"0 3 a", "0 3 a", "0 1 b", "0 1 b"}, false, 0, 1},
      {"a quota of 1 CPU on 2 ranks", {"1 3 a", "1 3 a"}, false, 0, 1},
      {"a quota of 2 CPUs on 2 ranks", {"2 ff a", "2 ff a"}, true, 1, 1},
      {"host names that share a prefix are other hosts", {"0 1 node1", "0 1 node10"}, true, 1, 1},
      {"one rank", {"0 1 a"}, true, 1, 1},
      {"8 ranks on 96 CPUs: 12 each, 4 threads", std::vector<std::string>(8, "0 ffffffffffffffffffffffff a"), true, 12, 4},
      {"3 ranks on 8 CPUs: 2 each", {"0 ff a", "0 ff a", "0 ff a"}, true, 2, 2},
      {"the more crowded of two hosts", {"0 ff a", "0 ff a", "0 ff b"}, true, 4, 4},
      {"the more crowded of two hosts, the other way", {"0 f a", "0 f a", "0 ff b"}, true, 2, 2},
      {"nothing gathered", {}, false, 0, 1},
      {"malformed", {"0 3"}, false, 0, 1},
      {"not hex", {"0 xy a"}, false, 0, 1},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(EveryRankParses(M::kAuto, c.ranks), c.expected) << c.what;
    EXPECT_EQ(CpusPerRank(c.ranks), c.cpus_per_rank) << c.what;
    EXPECT_EQ(DecodeThreadsFor(CpusPerRank(c.ranks)), c.decode_threads) << c.what;
  }
  // This process's own: a quota, then at least one CPU it may run on.
  const std::string mine = ThisRanksCpus();
  EXPECT_THAT(mine, ::testing::MatchesRegex("[0-9]+ [0-9a-f]+"));
  EXPECT_TRUE(EveryRankParses(M::kAuto, {mine + " here"})) << mine;
  const size_t threads = ThisProcessDecodeThreads();
  EXPECT_GE(threads, 1u);
  EXPECT_LE(threads, 4u);
  if (std::thread::hardware_concurrency() > 0) {
    EXPECT_LE(threads, std::thread::hardware_concurrency());
  }
}

TEST(CombineWants, ByEntryOverRanks) {
  const char W = kWanted | kWantedWhole, P = kWanted | kWantedPart, D = kWanted | kWantedWhole | kWholeOnDevice;
  struct Case {
    std::vector<std::string> wants;  // by rank
    std::vector<bool> any, whole_by_all, on_device;
  } cases[] = {
      {{{W, 0}, {W, 0}}, {true, false}, {true, false}, {false, false}},
      {{{W, P}, {P, P}}, {true, true}, {false, false}, {false, false}},
      {{{char(W | P), W}}, {true, true}, {false, true}, {false, false}},
      {{{D, D}, {D, W}}, {true, true}, {true, true}, {true, false}},
  };
  for (const Case& c : cases) {
    Demand d = CombineWants(c.wants, 2);
    EXPECT_EQ(d.wanted_any, c.any);
    EXPECT_EQ(d.wanted_whole_by_all, c.whole_by_all);
    EXPECT_EQ(d.whole_on_device_everywhere, c.on_device);
  }
  EXPECT_THAT(UnwantedEntries(TwoEntries(), CombineWants({{W, 0}}, 2)), ElementsAre("b"));
}

TEST(MatchVerdict, LocalErrorThenMissingThenUnexpected) {
  const Status mismatch = InvalidArgument("entry 'a' has shape");
  struct Case {
    Status local;
    bool strict;
    std::vector<std::string> missing, unexpected;
    Code code;
    std::string message;
  } cases[] = {
      {mismatch, true, {"x"}, {"y"}, Code::kInvalidArgument, "entry 'a' has shape"},
      {mismatch, false, {}, {}, Code::kInvalidArgument, "entry 'a' has shape"},
      {Status::Ok(), true, {"x", "z"}, {"y"}, Code::kNotFound,
       "not in checkpoint /c: 'x', 'z'; checkpoint /c has entries no rank loads: 'y' (a non-strict load loads the "
       "rest and reports them)"},
      {Status::Ok(), true, {"x"}, {}, Code::kNotFound, "not in checkpoint /c: 'x' (a non-strict load loads the rest and reports them)"},
      {Status::Ok(), true, {}, {"y"}, Code::kInvalidArgument,
       "checkpoint /c has entries no rank loads: 'y' (a non-strict load loads the rest and reports them)"},
      {Status::Ok(), false, {"x"}, {"y"}, Code::kOk, ""},
      {Status::Ok(), true, {}, {}, Code::kOk, ""},
  };
  for (const Case& c : cases) {
    Status s = MatchVerdict(c.local, c.strict, "/c", c.missing, c.unexpected);
    EXPECT_EQ(s.code(), c.code) << c.message;
    EXPECT_EQ(s.message(), c.message);
  }
}

// Values (blobs) by name: a wanted value matches its blob or the blobs under it (DCP's leaves);
// blobs of several ranks count once.
TEST(MatchValues, ByNameOrUnderTheNameAfterRenaming) {
  Manifest m;
  for (const char* name : {"module.step", "module.optim.param_groups.0.lr", "module.optim.param_groups.0.eps", "module.extra"}) {
    m.blobs.push_back(BlobRecord{name, BlobScope::kGlobal, 0, 0, 0, 1});
  }
  m.blobs.push_back(BlobRecord{"module.rng", BlobScope::kPerRank, 0, 0, 0, 1});
  m.blobs.push_back(BlobRecord{"module.rng", BlobScope::kPerRank, 1, 0, 0, 1});
  LoadOptions options;
  options.rename = [](const std::string& name) { return name.substr(7); };
  // "optim.param_groups" is found by its leaves; "optim.param" has none of its own.
  options.wanted_value_leaves = {{}, {"optim.param_groups.0.lr", "optim.param_groups.0.eps"}, {}, {}, {}};
  ValueMatch v = MatchValues(m, {"step", "optim.param_groups", "rng", "cfg", "optim.param"}, options);
  EXPECT_THAT(v.missing, ElementsAre("cfg", "optim.param"));
  EXPECT_THAT(v.unexpected, ElementsAre("extra"));
  // A leaf the value has and the checkpoint lacks is named; without leaves, no prefix counts.
  options.wanted_value_leaves = {{}, {"optim.param_groups.0.lr", "optim.param_groups.0.extra"}, {}, {}, {}};
  v = MatchValues(m, {"step", "optim.param_groups", "rng", "extra"}, options);
  EXPECT_THAT(v.missing, ElementsAre("optim.param_groups.0.extra"));
  EXPECT_THAT(v.unexpected, ElementsAre("optim.param_groups.0.eps"));
  options.wanted_value_leaves = {};
  v = MatchValues(m, {"step", "optim.param_groups", "rng", "extra"}, options);
  EXPECT_THAT(v.missing, ElementsAre("optim.param_groups"));
  v = MatchValues(m, {}, options);
  EXPECT_EQ(v.unexpected.size(), 5u);
  // At the saved world size a rank takes only its own per-rank values: rank 2 saved no "rng".
  options.wanted_value_leaves = {{}, {"optim.param_groups.0.lr", "optim.param_groups.0.eps"}};
  v = MatchValues(m, {"step", "optim.param_groups", "extra"}, options, 2);
  EXPECT_TRUE(v.missing.empty() && v.unexpected.empty());
  v = MatchValues(m, {"step", "optim.param_groups", "extra", "rng"}, options, 2);
  EXPECT_THAT(v.missing, ElementsAre("rng"));
  // Rank 1 leaving its own "rng" out is said as that, not as a value no rank loads.
  v = MatchValues(m, {"step", "optim.param_groups", "extra"}, options, 1);
  EXPECT_THAT(v.unexpected, ElementsAre("rng"));
  EXPECT_THAT(v.own_unloaded, ElementsAre("rng"));
  const Status said = MatchVerdict(Status::Ok(), true, "/c", {}, {}, v);
  EXPECT_THAT(said.message(), HasSubstr("checkpoint /c holds per-rank values this rank saved that its state now leaves "
                                        "out: 'rng'"));
  EXPECT_THAT(said.message(), Not(HasSubstr("no rank loads")));
  // Every rank's verdict reads the same, so a job of many ranks gets one line, not one per rank.
  ValueMatch v0 = MatchValues(m, {"step", "optim.param_groups", "extra"}, options, 0);
  EXPECT_EQ(MatchVerdict(Status::Ok(), true, "/c", {}, {}, v0).message(), said.message());
  // At another world size every rank's records count as one value, as before.
  v = MatchValues(m, {"step", "optim.param_groups", "extra"}, options);
  EXPECT_TRUE(v.own_unloaded.empty());
  EXPECT_THAT(MatchVerdict(Status::Ok(), true, "/c", {}, {}, v).message(), HasSubstr("no rank loads: 'rng'"));
}

// Tensors passed under a name the checkpoint holds as one value (a tuple DCP pickled whole): said
// as that, with how to load it, not as two missing tensors and one value nothing loads.
TEST(MatchVerdict, TensorsUnderAValueOfTheCheckpointAreSaidAsSuch) {
  ValueMatch values;
  values.unexpected = {"tup", "other"};
  const Status s = MatchVerdict(Status::Ok(), true, "/c", {"tup.0", "tup.1", "w"}, {}, values);
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("'tup' is one value in the checkpoint (DCP stores a tuple whole, tensors inside), "
                                     "but the state passed holds tensors under it ('tup.0', 'tup.1'): pass a value "
                                     "there (None)"));
  EXPECT_THAT(s.message(), HasSubstr("not in checkpoint /c: 'w'"));
  EXPECT_THAT(s.message(), HasSubstr("has entries no rank loads: 'other'"));
  EXPECT_THAT(s.message(), Not(HasSubstr("'tup.0', 'tup.1';")));
  EXPECT_THAT(s.message(), Not(HasSubstr("loads: 'other', 'tup'")));
}

// An empty dict DCP stored nothing of matches with nothing in a folder DCP wrote, and only there.
TEST(MatchValues, AnEmptyDictMatchesNothingOnlyInADcpFolder) {
  Manifest m;
  m.blobs.push_back(BlobRecord{"step", BlobScope::kGlobal, 0, 0, 0, 1});
  m.files.push_back(FileRecord{"__0_0.distcp"});
  LoadOptions options;
  options.wanted_values_dcp_stores_nothing_of = {"scaler"};
  EXPECT_THAT(MatchValues(m, {"step", "scaler", "cfg"}, options).missing, ElementsAre("scaler", "cfg"));
  m.created.user[kDcpSourceKey] = kDcpSourceValue;
  EXPECT_THAT(MatchValues(m, {"step", "scaler", "cfg"}, options).missing, ElementsAre("cfg"));
}

// A value in the state passed with checkpoint tensors under its name: an optimizer's state before
// its first step. The refusal names both sides and says to create the state.
TEST(MatchVerdict, AValueWithTensorsUnderItsNameIsExplained) {
  ValueMatch values{{"optim"}, {}};
  Status s = MatchVerdict(Status::Ok(), true, "/c", {}, {"optim.state.0.exp_avg"}, values, {"step", "optim"});
  EXPECT_EQ(s.code(), Code::kNotFound);
  // The cause first, then what is missing and unloaded.
  EXPECT_THAT(s.message(), ::testing::StartsWith("'optim' holds no tensors in the state passed, but checkpoint /c holds "
                                                 "optim.* tensors, which have nowhere to go"));
  EXPECT_THAT(s.message(), HasSubstr("; not in checkpoint /c: 'optim'; checkpoint /c has entries no rank loads: 'optim.state.0.exp_avg'"));
  EXPECT_THAT(s.message(), HasSubstr("get_state_dict"));
  EXPECT_THAT(s.message(), ::testing::Not(HasSubstr("non-strict")));
}

// One name stored as a value and passed as a tensor (or the other way round): said in so many
// words, not only listed as missing and as unloaded.
TEST(MatchVerdict, ANameOfAnotherKindIsSaidToBeSo) {
  Status s = MatchVerdict(Status::Ok(), true, "/c", {"step"}, {"w"}, ValueMatch{{"w"}, {"step"}}, {"w"});
  EXPECT_EQ(s.code(), Code::kInvalidArgument);  // nothing is missing: both are there, of another kind
  EXPECT_EQ(s.message(), "'step' is a value in the checkpoint but a tensor in the state passed; "
                         "'w' is a tensor in the checkpoint but a value in the state passed "
                         "(a non-strict load loads the rest and reports them)");
  Status with_more = MatchVerdict(Status::Ok(), true, "/c", {"step", "x"}, {"y"}, ValueMatch{{}, {"step"}}, {});
  EXPECT_EQ(with_more.code(), Code::kNotFound);
  EXPECT_THAT(with_more.message(), ::testing::StartsWith("not in checkpoint /c: 'x'; checkpoint /c has entries no rank "
                                                         "loads: 'y'; 'step' is a value in the checkpoint"));
  // Passed as a value on this rank only, as a tensor on another: the tensor is wanted, so not in
  // `unexpected`, and still said to be a tensor, not "not in checkpoint".
  Manifest m;
  m.entries.push_back(EntryRecord{"module.rep", DType::kFloat32, {4}, {}});
  LoadOptions strip;
  strip.rename = [](const std::string& name) { return name.substr(7); };
  const ValueMatch one_rank = MatchValues(m, {"rep"}, strip);
  EXPECT_THAT(one_rank.tensors_named, ElementsAre("rep"));
  EXPECT_THAT(one_rank.tensors_named_saved, ElementsAre("module.rep"));
  // Every rank passing the value: the tensor is one nobody loads too, said once, not twice.
  EXPECT_EQ(MatchVerdict(Status::Ok(), true, "/c", {}, {"module.rep"}, one_rank, {"rep"}).message(),
            "'rep' is a tensor in the checkpoint but a value in the state passed (a non-strict load loads the rest and "
            "reports them)");
  EXPECT_EQ(MatchVerdict(Status::Ok(), true, "/c", {}, {}, one_rank, {"rep"}).message(),
            "'rep' is a tensor in the checkpoint but a value in the state passed (a non-strict load loads the rest and "
            "reports them)");
  Status plain = MatchVerdict(Status::Ok(), true, "/c", {"a"}, {"b"}, ValueMatch{{"c"}, {"d"}}, {"c"});
  EXPECT_THAT(plain.message(), ::testing::Not(HasSubstr(" in the state passed")));
}

TEST(ChooseBroadcast, OptionEnvironmentHostsAndStorage) {
  using R = ReplicatedReads;
  struct Case {
    bool broadcast_replicated;
    R mode;
    const char* env;
    bool one_host;
    bool memory;  // the checkpoint is on tmpfs
    bool broadcast;
  } cases[] = {
      {true, R::kAuto, nullptr, true, true, false},          // one host, from memory: every rank reads
      {true, R::kAuto, nullptr, true, false, true},          // one host, from storage: read once
      {true, R::kAuto, nullptr, false, true, true},          // across hosts: read once, broadcast
      {true, R::kAuto, nullptr, false, false, true},
      {true, R::kAuto, "", false, true, true},               // empty: unset
      {true, R::kBroadcast, nullptr, true, true, true},
      {true, R::kEveryRank, nullptr, false, false, false},
      {true, R::kEveryRank, nullptr, true, false, false},
      {false, R::kBroadcast, nullptr, false, false, false},  // the old switch still turns it off
      {true, R::kEveryRank, "broadcast", true, true, true},  // the environment overrides the option
      {true, R::kBroadcast, "every-rank", false, false, false},
      {true, R::kBroadcast, "auto", true, true, false},
      {true, R::kEveryRank, "auto", true, false, true},
  };
  for (const Case& c : cases) {
    Result<bool> got = ChooseBroadcast(c.broadcast_replicated, c.mode, c.env, c.one_host, c.memory);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, c.broadcast) << static_cast<int>(c.mode) << " " << (c.env ? c.env : "-") << " " << c.one_host
                                 << " " << c.memory;
  }
  Result<bool> bad = ChooseBroadcast(true, R::kAuto, "always", true, true);
  EXPECT_EQ(bad.status().message(), "SHARDCKPT_REPLICATED_READS: replicated reads 'always': use auto, broadcast or every-rank");
}

TEST(ParseReplicatedReads, TheThreeNamesAndNothingElse) {
  EXPECT_EQ(ParseReplicatedReads("auto").value(), ReplicatedReads::kAuto);
  EXPECT_EQ(ParseReplicatedReads("broadcast").value(), ReplicatedReads::kBroadcast);
  EXPECT_EQ(ParseReplicatedReads("every-rank").value(), ReplicatedReads::kEveryRank);
  for (const char* bad : {"", "Broadcast", "every_rank", "root"}) {
    const Result<ReplicatedReads> parsed = ParseReplicatedReads(bad);
    EXPECT_EQ(parsed.status().code(), Code::kInvalidArgument) << bad;
    EXPECT_EQ(parsed.status().message(), "replicated reads '" + std::string(bad) + "': use auto, broadcast or every-rank");
  }
}

TEST(BatchBroadcasts, SmallEntriesPackedPerReaderLargeOrDeviceOnesAlone) {
  //                              0    1   2    3    4    5   6    7
  const std::vector<int> reader = {0, 1, 0, -1, 1, 0, 0, 1};
  const std::vector<uint64_t> bytes = {10, 20, 30, 0, 100, 50, 15, 5};
  std::vector<bool> alone(8, false);
  alone[7] = true;  // device to device
  auto batches = BatchBroadcasts(reader, bytes, alone, 2, 60);
  struct Want {
    int reader;
    std::vector<size_t> entries;
    uint64_t bytes;
    bool packed;
  };
  const std::vector<Want> want = {
      {0, {0, 2}, 40, true},   // 10 + 30; adding 50 would pass 60
      {0, {5}, 50, true},      // then 50 + 15 would too
      {0, {6}, 15, true},
      {1, {4}, 100, false},    // at least the batch size: alone
      {1, {7}, 5, false},      // marked alone
      {1, {1}, 20, true},
  };
  ASSERT_EQ(batches.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(batches[i].reader, want[i].reader) << i;
    EXPECT_EQ(batches[i].entries, want[i].entries) << i;
    EXPECT_EQ(batches[i].bytes, want[i].bytes) << i;
    EXPECT_EQ(batches[i].packed, want[i].packed) << i;
  }
  EXPECT_TRUE(BatchBroadcasts(reader, std::vector<uint64_t>(8, 0), alone, 2, 60).empty());  // all empty
}

TEST(AssignReaders, RoundRobinOverEntriesEveryoneWantsWhole) {
  Demand d;
  d.wanted_any = {true, true, false, true, true};
  d.wanted_whole_by_all = {true, false, true, true, true};
  EXPECT_EQ(AssignReaders(d, true, 2), (std::vector<int>{0, -1, -1, 1, 0}));
  EXPECT_EQ(AssignReaders(d, true, 3), (std::vector<int>{0, -1, -1, 1, 2}));
  EXPECT_EQ(AssignReaders(d, true, 1), (std::vector<int>(5, -1)));
  EXPECT_EQ(AssignReaders(d, false, 2), (std::vector<int>(5, -1)));
}

TEST(SizeStaging, ManySmallBuffersOrFewLargeOnes) {
  struct Case {
    std::vector<uint64_t> extents;
    size_t buffers;
    uint64_t max_extent;
    StagingSize expected;
  } cases[] = {
      {{}, 8, 1 << 20, {128, 4096}},                // nothing larger than a block: the cap
      {{1 << 20, 4096}, 8, 1 << 20, {8, 1 << 20}},  // extents of max size: the configured count
      {{64 << 10}, 8, 1 << 20, {128, 64 << 10}},
      {{256 << 10}, 8, 1 << 20, {32, 256 << 10}},
  };
  for (const Case& c : cases) {
    ReadPlan plan;
    for (uint64_t length : c.extents) {
      ReadExtent e;
      e.length = length;
      plan.extents.push_back(e);
    }
    StagingSize s = SizeStaging(plan, c.buffers, c.max_extent);
    EXPECT_EQ(s.buffers, c.expected.buffers);
    EXPECT_EQ(s.buffer_bytes, c.expected.buffer_bytes);
  }
}

TEST(PlanReads, SkipsEntriesAnotherRankReadsAndPerRankBlobsOfAnotherWorld) {
  Manifest m = TwoEntries();
  m.world_size = 2;
  m.files.push_back(FileRecord{"rank-00000.bin", 8192, 4096, {0}});
  m.entries[0].chunks.push_back(ChunkRecord{0, 0, 16, Layout::Whole()});
  m.entries[1].chunks.push_back(ChunkRecord{0, 16, 16, Layout::Whole()});
  m.blobs.push_back(BlobRecord{"step", BlobScope::kGlobal, 0, 0, 32, 4});
  m.blobs.push_back(BlobRecord{"rng", BlobScope::kPerRank, 1, 0, 36, 3});
  float a[4], b[4];
  ShardedState targets;
  ASSERT_TRUE(targets.AddTensor("a", DType::kFloat32, {4}, Layout::Whole(), a).ok());
  ASSERT_TRUE(targets.AddTensor("b", DType::kFloat32, {2, 2}, Layout::Whole(), b).ok());
  Match match;
  match.local.entry_of_piece = {0, 1};
  match.reader_of = {1, -1};  // rank 1 reads "a" for everyone
  LoadReport report;
  ReadWork work = PlanReads(m, targets, match, 0, 3, ReadPlanOptions{}, false, &report);
  EXPECT_THAT(work.targets.names, ElementsAre("b", "blob step"));
  EXPECT_FALSE(work.any_device_target);
  EXPECT_EQ(work.plan.bytes_wanted, 16u + 4u);
  EXPECT_TRUE(report.blobs.at("step").available);
  EXPECT_EQ(report.blobs.at("step").bytes.size(), 4u);
  EXPECT_FALSE(report.blobs.at("rng").available);
  EXPECT_EQ(report.blobs.at("rng").reason,
            "per-rank blob saved by 2 ranks; this job has 3, so it is not restored");

  // Same world: this rank's own per-rank blob only.
  LoadReport same;
  work = PlanReads(m, targets, match, 1, 2, ReadPlanOptions{}, false, &same);
  EXPECT_THAT(work.targets.names, ElementsAre("a", "b", "blob step", "blob rng"));
  EXPECT_TRUE(same.blobs.at("rng").available);
  EXPECT_EQ(work.max_extent, ReadPlanOptions{}.max_extent);

  // Verified from memory into host memory: extents cut for the cache.
  LoadReport cut;
  work = PlanReads(m, targets, match, 1, 2, ReadPlanOptions{}, true, &cut);
  EXPECT_EQ(work.max_extent, ReadPlanOptions{}.memory_backed_max_extent);
}

// Phase 1 whole, as Load runs it on one rank.
ManifestRead ReadOnRoot(int rank, const std::string& path) {
  ManifestRead read = OpenManifestOnRoot(rank, 1, path);
  DecodeManifestText(rank, &read);
  return read;
}

// The collective phases, on one rank, against a checkpoint saved for the purpose.
class LoadPhasesOnDisk : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardedState state;
    ASSERT_TRUE(state.AddTensor("a", DType::kFloat32, {4}, Layout::Whole(), saved_).ok());
    ASSERT_TRUE(Save(*comm_, root(), 3, state).ok());
  }
  void TearDown() override { SetFailpoints("").IgnoreError(); }
  std::string root() const { return JoinPath(dir_.path(), "ckpt"); }

  testing::TempDir dir_;
  std::unique_ptr<Communicator> comm_ = CreateSingleProcessCommunicator();
  float saved_[4] = {1, 2, 3, 4};
};

TEST_F(LoadPhasesOnDisk, ReadManifestOnRootReadsOnlyOnRankZero) {
  ManifestRead read = ReadOnRoot(0, root());
  ASSERT_TRUE(read.status.ok()) << read.status.ToString();
  EXPECT_EQ(read.dir, JoinPath(root(), StepDirName(3)));
  EXPECT_EQ(read.manifest.step, 3);
  ASSERT_EQ(read.manifest.entries.size(), 1u);
  EXPECT_EQ(read.manifest.entries[0].name, "a");
  EXPECT_TRUE(read.text.empty());  // not held past its decode
  EXPECT_GT(read.hint.manifest_bytes, 0u);
  EXPECT_TRUE(read.hint.same_world);  // rank-00000.bin and no rank-00001.bin, for 1 rank
  EXPECT_FALSE(OpenManifestOnRoot(0, 2, root()).hint.same_world);

  ManifestRead elsewhere = ReadOnRoot(1, root());
  EXPECT_TRUE(elsewhere.status.ok());
  EXPECT_TRUE(elsewhere.dir.empty());
  EXPECT_TRUE(elsewhere.manifest.entries.empty());

  EXPECT_EQ(ReadOnRoot(0, JoinPath(dir_.path(), "none")).status.code(), Code::kNotFound);
  ASSERT_TRUE(SetFailpoints("load.read_manifest=EIO").ok());
  Status failed = ReadOnRoot(0, root()).status;
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.ToString(), HasSubstr("read " + JoinPath(read.dir, kManifestName)));
}

TEST_F(LoadPhasesOnDisk, ShareManifestReturnsRankZerosStatus) {
  ManifestRead read = ReadOnRoot(0, JoinPath(dir_.path(), "none"));
  Status shared = ShareManifest(*comm_, &read);
  EXPECT_EQ(shared.code(), Code::kNotFound);
  read = ReadOnRoot(0, root());
  EXPECT_TRUE(ShareManifest(*comm_, &read).ok());
  EXPECT_EQ(read.manifest.step, 3);
  ASSERT_EQ(read.manifest.entries.size(), 1u);
  EXPECT_EQ(read.manifest.entries[0].name, "a");

  // Rank 0 checks the manifest fully before sharing it: a damaged one is its full validation's
  // error, naming the file, and that is what every rank reports.
  const std::string manifest_path = JoinPath(read.dir, kManifestName);
  std::string text = ReadFileLimited(manifest_path, 1 << 20).value();
  text[text.find("\"a\"") + 1] = 'b';
  ASSERT_TRUE(WriteFileAtomic(manifest_path, text, "test").ok());
  read = ReadOnRoot(0, root());
  EXPECT_EQ(read.status.code(), Code::kDataLoss);
  shared = ShareManifest(*comm_, &read);
  EXPECT_EQ(shared.code(), Code::kDataLoss);
  EXPECT_THAT(shared.ToString(), HasSubstr(manifest_path));
}

TEST_F(LoadPhasesOnDisk, DecodeSharedManifestReadsRankZerosMessage) {
  ManifestRead read = ReadOnRoot(0, root());
  const std::string message = EncodeManifestMessage(read.manifest);
  Result<Manifest> parsed = DecodeSharedManifest(read.dir, message);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(EncodeManifest(*parsed).value(), EncodeManifest(read.manifest).value());
  Result<Manifest> cut = DecodeSharedManifest(read.dir, message.substr(0, message.size() - 1));
  EXPECT_EQ(cut.status().code(), Code::kDataLoss);
  EXPECT_THAT(cut.status().ToString(), HasSubstr(JoinPath(read.dir, kManifestName)));
  ASSERT_TRUE(SetFailpoints("load.decode_manifest=EIO").ok());
  Result<Manifest> failed = DecodeSharedManifest(read.dir, message);
  EXPECT_FALSE(failed.ok());
  EXPECT_THAT(failed.status().ToString(), HasSubstr("read the shared " + JoinPath(read.dir, kManifestName)));
}

TEST_F(LoadPhasesOnDisk, MatchEntriesFillsTheReportAndAgrees) {
  ManifestRead read = ReadOnRoot(0, root());
  ASSERT_TRUE(ShareManifest(*comm_, &read).ok());
  float a[4] = {}, extra[2] = {};
  ShardedState targets;
  ASSERT_TRUE(targets.AddTensor("a", DType::kFloat32, {4}, Layout::Whole(), a).ok());
  ASSERT_TRUE(targets.AddTensor("extra", DType::kFloat32, {2}, Layout::Whole(), extra).ok());
  LoadReport report;
  Result<Match> strict = MatchEntries(*comm_, read.manifest, read.dir, targets, LoadOptions{}, &report);
  EXPECT_EQ(strict.status().code(), Code::kNotFound);
  EXPECT_THAT(report.missing, ElementsAre("extra"));

  LoadOptions loose;
  loose.strict = false;
  LoadReport loose_report;
  Result<Match> match = MatchEntries(*comm_, read.manifest, read.dir, targets, loose, &loose_report);
  ASSERT_TRUE(match.ok()) << match.status().ToString();
  EXPECT_EQ(match->local.entry_of_piece, (std::vector<long>{0, -1}));
  EXPECT_EQ(match->reader_of, (std::vector<int>{-1}));  // one rank: nothing to broadcast
  EXPECT_TRUE(loose_report.unexpected.empty());

  // Read and share: the whole phase sequence of Load, one rank.
  ReadWork work = PlanReads(read.manifest, targets, *match, 0, 1, loose.plan, false, &loose_report);
  ASSERT_TRUE(ReadExtents(read.dir, read.manifest, work, loose, &loose_report.stats).ok());
  EXPECT_EQ(std::vector<float>(a, a + 4), std::vector<float>(saved_, saved_ + 4));
  EXPECT_TRUE(ShareReplicated(*comm_, read.manifest, targets, *match, loose, &loose_report).ok());
  EXPECT_EQ(loose_report.bytes_received, 0u);
}

TEST(CopyPiece, HostToHost) {
  float from[3] = {1, 2, 3}, to[3] = {};
  ShardedState state;
  ASSERT_TRUE(state.AddTensor("x", DType::kFloat32, {3}, Layout::Whole(), from).ok());
  ASSERT_TRUE(state.AddTensor("x", DType::kFloat32, {3}, Layout::Whole(), to).ok());
  ASSERT_TRUE(CopyPiece(state.pieces()[1], state.pieces()[0]).ok());
  EXPECT_EQ(std::vector<float>(to, to + 3), (std::vector<float>{1, 2, 3}));
}

}  // namespace
}  // namespace shardckpt::load_phases
