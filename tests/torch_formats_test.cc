// Interchange with torch as it is today (issue 13): the dtypes torch 2.x writes, tensors inside
// lists and the values beside them, tied weights and key order, Hugging Face sharded sets. The
// same cases against files real torch writes are in tests/interop/formats_case.sh.
#include <gmock/gmock.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "shardckpt/engine/core/consolidate.h"
#include "shardckpt/engine/core/convert.h"
#include "shardckpt/engine/core/dcp_export.h"
#include "shardckpt/collectives/communicator.h"
#include "shardckpt/engine/core/checkpoint_reader.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/offline_writer.h"
#include "shardckpt/engine/formats/safetensors.h"
#include "shardckpt/engine/formats/sha256_sidecar.h"
#include "shardckpt/engine/formats/state_tree.h"
#include "shardckpt/engine/formats/torch_file.h"
#include "shardckpt/engine/formats/gguf_writer.h"
#include "shardckpt/engine/formats/output_file.h"
#include "shardckpt/engine/formats/torch_pickle.h"
#include "shardckpt/engine/model/entry_alias.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"
#include "tests/test_util.h"
#include "tests/torch_files.h"

using ::testing::ElementsAre;
using ::testing::HasSubstr;

namespace shardckpt {
namespace {

using testing::TempDir;

PickleTensor Contiguous(const std::string& name, DType dtype, const Shape& shape, const std::string& key) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return PickleTensor{name, dtype, shape, strides, 0, key, NumElements(shape).value()};
}

}  // namespace

// Steps in a failure message as their JSON would show them.
void PrintTo(const StatePathStep& step, std::ostream* os) {
  *os << (step.in_tuple ? "{tuple: " : step.int_key ? "{int: " : step.is_index ? "" : "\"") << step.key
      << (step.in_tuple || step.int_key ? "}" : step.is_index ? "" : "\"");
}

namespace {

PickleNode Leaf(size_t tensor) {
  PickleNode n;
  n.kind = PickleNode::kTensor;
  n.tensor = tensor;
  return n;
}
PickleNode Value(const std::string& json) {
  PickleNode n;
  n.kind = PickleNode::kValue;
  n.json = json;
  return n;
}

std::vector<std::string> EntryNames(const Manifest& m) {
  std::vector<std::string> names;
  for (const EntryRecord& e : m.entries) names.push_back(e.name);
  return names;
}

TEST(TorchDTypes, TheTypesTorchHasAreNamedInEveryFormat) {
  struct Row {
    DType dtype;
    size_t size;
    const char* name;
    const char* safetensors;
    const char* storage;
  } rows[] = {{DType::kUInt16, 2, "uint16", "U16", nullptr},
              {DType::kUInt32, 4, "uint32", "U32", nullptr},
              {DType::kUInt64, 8, "uint64", "U64", nullptr},
              {DType::kComplex64, 8, "complex64", "C64", "ComplexFloatStorage"},
              {DType::kComplex128, 16, "complex128", nullptr, "ComplexDoubleStorage"},
              // torch has no Float8 storage classes: naming one made torch 2.x refuse the file.
              {DType::kFloat8E4M3, 1, "float8_e4m3fn", "F8_E4M3", nullptr},
              {DType::kFloat32, 4, "float32", "F32", "FloatStorage"}};
  for (const Row& r : rows) {
    SCOPED_TRACE(r.name);
    EXPECT_EQ(DTypeSize(r.dtype), r.size);
    EXPECT_EQ(ParseDType(r.name).value(), r.dtype);
    if (r.safetensors) {
      EXPECT_STREQ(SafetensorsDTypeName(r.dtype), r.safetensors);
      EXPECT_EQ(ParseSafetensorsDType(r.safetensors).value(), r.dtype);
    } else {
      EXPECT_EQ(SafetensorsDTypeName(r.dtype), nullptr);
    }
    if (r.storage) {
      EXPECT_STREQ(TorchStorageName(r.dtype), r.storage);
      EXPECT_EQ(ParseTorchStorageName(r.storage).value(), r.dtype);
    } else {
      EXPECT_EQ(TorchStorageName(r.dtype), nullptr);
    }
  }
  std::vector<SafetensorsEntry> entries = {{"w", DType::kComplex128, {2}, 0, 0}};
  Result<std::string> header = EncodeSafetensorsHeader(entries, {});
  ASSERT_FALSE(header.ok());
  EXPECT_THAT(header.status().message(), HasSubstr("tensor 'w': dtype complex128 has no safetensors type"));
  std::vector<SafetensorsEntry> reserved = {{"__metadata__", DType::kFloat32, {2}, 0, 0}};
  Result<std::string> named_metadata = EncodeSafetensorsHeader(reserved, {});
  ASSERT_FALSE(named_metadata.ok());
  EXPECT_THAT(named_metadata.status().message(), HasSubstr("tensor '__metadata__': safetensors reserves that name"));
}

// A header nesting deeper than any real one (a text of nothing but '[', up to the header's 100 MB
// cap) is refused by the key pass, before a document of tens of bytes per level is built.
// Tied tensors of a .pt are found by their whole view (storage, dtype, offset, sizes, strides):
// each field that differs makes another tensor, and a third name for a view points at the first.
TEST(TorchFile, FirstOfSameViewComparesEveryFieldOfTheView) {
  const PickleTensor w = Contiguous("w", DType::kFloat32, {4, 3}, "0");
  auto with = [&](const std::string& name, auto change) {
    PickleTensor t = w;
    t.name = name;
    change(t);
    return t;
  };
  const std::vector<PickleTensor> tensors = {
      w,
      with("tied", [](PickleTensor&) {}),
      with("other storage", [](PickleTensor& t) { t.storage_key = "1"; }),
      with("other dtype", [](PickleTensor& t) { t.dtype = DType::kInt32; }),
      with("other offset", [](PickleTensor& t) { t.storage_offset = 1; }),
      with("other sizes", [](PickleTensor& t) { t.sizes = {3, 4}; t.strides = {4, 1}; }),
      with("transposed", [](PickleTensor& t) { t.sizes = {3, 4}; t.strides = {1, 3}; }),
      with("other strides", [](PickleTensor& t) { t.strides = {1, 4}; }),
      with("tied again", [](PickleTensor&) {}),
      with("transposed twice", [](PickleTensor& t) { t.sizes = {3, 4}; t.strides = {1, 3}; }),
  };
  EXPECT_EQ(FirstOfSameView(tensors), (std::vector<int64_t>{-1, 0, -1, -1, -1, -1, -1, -1, 0, 6}));
}

TEST(Safetensors, AHeaderNestingTooDeepIsRefusedBeforeItIsParsed) {
  const std::string deep = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":)" + std::string(100000, '[');
  Result<std::vector<SafetensorsEntry>> parsed = ParseSafetensorsHeader(deep, 1, "deep.safetensors");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("deep.safetensors: invalid safetensors: the header nests deeper than 64 levels"));
  std::string nested = R"({"__metadata__":{"k":"v"},"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})";
  EXPECT_TRUE(ParseSafetensorsHeader(nested, 1, "ok.safetensors").ok());
}

// The header keeps the entries' order both ways (nested keys do not count as entries), at a
// size where a key search per entry would take minutes; a name given twice is refused.
TEST(Safetensors, HeaderKeepsTheOrderOfManyEntriesAndRefusesADuplicate) {
  std::vector<SafetensorsEntry> entries;
  // Enough entries that a sorted or hashed container would reorder them many ways over.
  for (int i = 0; i < 20000; ++i) entries.push_back({"layers." + std::to_string(19999 - i) + ".w", DType::kFloat16, {2, 3}, 0, 0});
  const std::string encoded = EncodeSafetensorsHeader(entries, {{"author", "me"}}).value();
  uint64_t n = 0;
  std::memcpy(&n, encoded.data(), 8);
  ASSERT_EQ(n % 8, 0u);
  const std::string text = encoded.substr(8, n);
  EXPECT_EQ(text.substr(0, 59), R"({"__metadata__":{"format":"pt","author":"me"},"layers.19999)");
  Result<std::vector<SafetensorsEntry>> parsed = ParseSafetensorsHeader(text, 20000 * 12, "many.safetensors");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    ASSERT_EQ((*parsed)[i].name, entries[i].name);
    ASSERT_EQ((*parsed)[i].begin, 12 * i);
    ASSERT_EQ((*parsed)[i].shape, (Shape{2, 3}));
  }
  const std::string twice = R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                            R"("a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})";
  EXPECT_EQ(ParseSafetensorsHeader(twice, 2, "twice.safetensors").status().ToString(),
            "DataLoss: twice.safetensors: invalid safetensors: entry 'a' is given twice");
}

TEST(TorchPickle, DTypesWithoutAStorageClassAreWrittenAsTorch2WritesThem) {
  std::vector<PickleTensor> tensors = {Contiguous("f8", DType::kFloat8E5M2, {4}, "0"),
                                       Contiguous("u32", DType::kUInt32, {2}, "1"),
                                       Contiguous("c64", DType::kComplex64, {3}, "2")};
  const std::string pickle = PickleStateDict(tensors).value();
  // The global torch.load(weights_only=True) allows, with the element count in bytes.
  EXPECT_THAT(pickle, HasSubstr("ctorch.storage\nUntypedStorage\n"));
  EXPECT_THAT(pickle, Not(HasSubstr("Float8")));
  EXPECT_THAT(pickle, HasSubstr("ctorch\nuint32\n"));
  EXPECT_THAT(pickle, HasSubstr("ctorch\nComplexFloatStorage\n"));
  Result<UnpickledStateDict> back = UnpickleStateDict(pickle);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->tensors.size(), 3u);
  EXPECT_EQ(back->tensors[0].dtype, DType::kFloat8E5M2);
  EXPECT_EQ(back->tensors[1].dtype, DType::kUInt32);
  EXPECT_EQ(back->tensors[1].storage_numel, 8);  // bytes of the untyped storage
  EXPECT_EQ(back->tensors[1].storage_element_size, 1u);
  EXPECT_EQ(back->tensors[2].dtype, DType::kComplex64);
  EXPECT_EQ(back->tensors[2].storage_numel, 3);
}

TEST(TorchPickle, TensorsInListsAreEntriesByIndexAndValuesAreBlobs) {
  std::vector<PickleTensor> tensors = {Contiguous("a", DType::kFloat32, {2}, "0"), Contiguous("b", DType::kInt64, {1}, "1"),
                                       Contiguous("c", DType::kFloat32, {1}, "2")};
  PickleNode root;
  PickleNode list;
  list.kind = PickleNode::kList;
  list.items.emplace_back("", Leaf(0));
  PickleNode inner;  // a dict inside the list
  inner.items.emplace_back("m", Leaf(1));
  inner.items.emplace_back("lr", Value("0.5"));
  list.items.emplace_back("", std::move(inner));
  root.items.emplace_back("lst", std::move(list));
  PickleNode tuple;
  tuple.kind = PickleNode::kTuple;
  tuple.items.emplace_back("", Leaf(2));
  root.items.emplace_back("tup", std::move(tuple));
  root.items.emplace_back("epoch", Value("42"));
  root.items.emplace_back("name", Value("\"run\""));
  root.items.emplace_back("none", Value("null"));
  root.items.emplace_back("flags", Value(R"([1,{"__shardckpt__":"tuple","v":[true,"x"]},{"__shardckpt__":"float","v":"inf"},{"__shardckpt__":"int","v":"000000000000000040"},{"__shardckpt__":"bytes","v":"AP8="}])"));
  const std::string pickle = PickleTree(tensors, root).value();
  Result<UnpickledStateDict> r = UnpickleStateDict(pickle);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::string> names;
  for (const PickleTensor& t : r->tensors) names.push_back(t.name);
  EXPECT_THAT(names, ElementsAre("lst.0", "lst.1.m", "tup.0"));
  std::vector<std::pair<std::string, std::string>> values;
  for (const PickleValue& v : r->values) values.emplace_back(v.name, v.blob);
  const std::string j(kPickleValueTag, 2);
  EXPECT_THAT(values, ElementsAre(std::make_pair("lst.1.lr", j + "0.5"), std::make_pair("epoch", j + "42"),
                                  std::make_pair("name", j + "\"run\""), std::make_pair("none", j + "null"),
                                  std::make_pair("flags", j + R"([1,{"__shardckpt__":"tuple","v":[true,"x"]},{"__shardckpt__":"float","v":"inf"},{"__shardckpt__":"int","v":"000000000000000040"},{"__shardckpt__":"bytes","v":"AP8="}])")));
  EXPECT_THAT(r->containers, ElementsAre(std::make_pair(std::string("lst"), std::string("list")),
                                         std::make_pair(std::string("tup"), std::string("tuple"))));
  EXPECT_TRUE(r->skipped.empty());
}

TEST(StateTree, RestoresRecordedListsAndKeepsTopLevelKeysDotted) {
  StateTreeBuilder tree(std::map<std::string, std::string>{{"opt.steps", "list"}, {"t", "tuple"}});
  ASSERT_TRUE(tree.Add("layers.0.w", Leaf(0)).ok());
  ASSERT_TRUE(tree.Add("opt.steps.1", Leaf(1)).ok());
  ASSERT_TRUE(tree.Add("opt.steps.0.m", Leaf(2)).ok());
  ASSERT_TRUE(tree.Add("t.0", Leaf(3)).ok());
  ASSERT_TRUE(tree.Add("t.2", Leaf(4)).ok());  // t.1 not selected: a dict of those there are
  EXPECT_THAT(tree.Add("layers.0.w", Leaf(5)).message(), HasSubstr("'layers.0.w'"));
  PickleNode root = tree.Finish();
  ASSERT_EQ(root.items.size(), 3u);
  EXPECT_EQ(root.items[0].first, "layers.0.w");
  EXPECT_EQ(root.items[1].first, "opt.steps");
  const PickleNode& steps = root.items[1].second;
  ASSERT_EQ(steps.kind, PickleNode::kList);
  ASSERT_EQ(steps.items.size(), 2u);
  EXPECT_EQ(steps.items[0].second.kind, PickleNode::kDict);  // index 0 first, whatever the order added
  EXPECT_EQ(steps.items[0].second.items[0].first, "m");
  EXPECT_EQ(steps.items[1].second.tensor, 1u);
  const PickleNode& t = root.items[2].second;
  EXPECT_EQ(t.kind, PickleNode::kDict);
  EXPECT_EQ(t.items[1].first, "2");
}

// A DCP folder's planner_data: each leaf exactly where its path says, dicts and lists as
// dcp_to_torch_save rebuilds them; a leaf without a path stays a key at the top.
TEST(StateTree, PathsPutEachLeafWhereItSat) {
  const std::string json =
      R"({"model.layers.0.weight": ["model", "layers.0.weight"], "model.bias": ["model", "bias"],)"
      R"( "optim.param_groups.0.lr": ["optim", "param_groups", 0, "lr"],)"
      R"( "optim.param_groups.0.params.1": ["optim", "param_groups", 0, "params", 1],)"
      R"( "optim.param_groups.0.params.0": ["optim", "param_groups", 0, "params", 0],)"
      R"( "bad.join": ["bad", "joins"], "neg.0": ["neg", -1], "num": [1.5], "notalist": "x"})";
  std::unordered_map<std::string, StatePath> paths = DecodeStatePaths(json);
  EXPECT_EQ(paths.size(), 5u);  // the last four refused: steps that do not join to the key, a
                                // negative index, a float, not a list
  EXPECT_EQ(paths.at("optim.param_groups.0.lr")[2], (StatePathStep{"0", true}));
  std::vector<std::pair<std::string, StatePath>> listed(paths.begin(), paths.end());
  EXPECT_EQ(DecodeStatePaths(EncodeStatePaths(listed)), paths);

  StateTreeBuilder tree({}, paths);
  const std::vector<std::string> names = {"model.layers.0.weight", "epoch", "model.bias", "optim.param_groups.0.lr",
                                          "optim.param_groups.0.params.1", "optim.param_groups.0.params.0"};
  for (size_t i = 0; i < names.size(); ++i) ASSERT_TRUE(tree.Add(names[i], Leaf(i)).ok()) << names[i];
  EXPECT_THAT(tree.Add("model.bias", Leaf(9)).message(), HasSubstr("'model.bias' names two values"));
  PickleNode root = tree.Finish();
  ASSERT_EQ(root.items.size(), 3u);
  EXPECT_EQ(root.items[0].first, "model");
  const PickleNode& model = root.items[0].second;
  ASSERT_EQ(model.kind, PickleNode::kDict);
  ASSERT_EQ(model.items.size(), 2u);
  EXPECT_EQ(model.items[0].first, "layers.0.weight");  // one key, dots and all
  EXPECT_EQ(model.items[0].second.tensor, 0u);
  EXPECT_EQ(root.items[1].first, "epoch");
  const PickleNode& groups = root.items[2].second.items[0].second;
  ASSERT_EQ(groups.kind, PickleNode::kList);
  const PickleNode& group = groups.items[0].second;
  ASSERT_EQ(group.kind, PickleNode::kDict);
  EXPECT_EQ(group.items[0].first, "lr");
  const PickleNode& params = group.items[1].second;
  ASSERT_EQ(params.kind, PickleNode::kList);
  EXPECT_EQ(params.items[0].second.tensor, 5u);  // index 0 first, whatever the order added
  EXPECT_EQ(params.items[1].second.tensor, 4u);
}

// A training checkpoint's nesting (an optimizer's state by int parameter number, a tuple inside
// a dict, a module's dotted keys one level down) goes from a .pt's pickle to the paths import
// records, through their JSON, and back through the tree into a pickle that reads the same.
TEST(StateTree, IntKeysAndTuplesRoundTripThroughPathsAndThePickle) {
  const std::string json =
      R"({"optim.state.0.exp_avg": ["optim", "state", {"int": 0}, "exp_avg"],)"
      R"( "optim.state.-3.step": ["optim", "state", {"int": -3}, "step"],)"
      R"( "pair.0": ["pair", {"tuple": 0}], "pair.1.0": ["pair", {"tuple": 1}, 0], "model.layers.0.w": ["model", "layers.0.w"],)"
      R"( "7": [{"int": 7}],)"
      R"( "neg.-1": ["neg", {"tuple": -1}], "two.1": ["two", {"int": 1, "tuple": 1}],)"
      R"( "huge.18446744073709551615": ["huge", {"int": 18446744073709551615}]})";
  std::unordered_map<std::string, StatePath> paths = DecodeStatePaths(json);
  EXPECT_EQ(paths.size(), 6u);  // refused: a negative tuple index, a step of two tags, an int key past int64
  EXPECT_EQ(paths.at("optim.state.-3.step")[2], (StatePathStep{"-3", false, true}));
  EXPECT_EQ(paths.at("pair.1.0")[1], (StatePathStep{"1", true, false, true}));
  std::vector<std::pair<std::string, StatePath>> listed(paths.begin(), paths.end());
  EXPECT_EQ(DecodeStatePaths(EncodeStatePaths(listed)), paths);

  const std::vector<std::string> names = {"model.layers.0.w", "optim.state.0.exp_avg", "optim.state.-3.step",
                                          "pair.0", "pair.1.0", "7"};
  std::vector<PickleTensor> tensors;
  StateTreeBuilder tree({}, paths);
  for (size_t i = 0; i < names.size(); ++i) {
    tensors.push_back(Contiguous(names[i], DType::kFloat32, {1}, std::to_string(i)));
    ASSERT_TRUE(tree.Add(names[i], Leaf(i)).ok()) << names[i];
  }
  Result<std::string> pickle = PickleTree(tensors, tree.Finish());
  ASSERT_TRUE(pickle.ok()) << pickle.status().ToString();
  Result<UnpickledStateDict> back = UnpickleStateDict(*pickle);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  std::vector<std::string> read;
  for (const PickleTensor& t : back->tensors) read.push_back(t.name);
  EXPECT_EQ(read, names);
  // Every leaf below the top, and the top one under an int key, with its path as recorded.
  std::unordered_map<std::string, StatePath> recorded(back->paths.begin(), back->paths.end());
  EXPECT_EQ(recorded, paths);
  EXPECT_THAT(back->containers, ElementsAre(std::make_pair(std::string("pair"), std::string("tuple")),
                                            std::make_pair(std::string("pair.1"), std::string("list"))));
}

// A record of paths that leaves a name beside the nested dict it belongs in is found: another
// rank's leaf, also under a nested dict whose own name has a dot.
TEST(StateTree, ANameLeftBesideANestedDictOfItsPrefixIsFound) {
  const std::unordered_map<std::string, StatePath> paths = {
      {"optim.state.0.m", {{"optim"}, {"state"}, {"0", false, true}, {"m"}}},
      {"opt.a.state.0.m", {{"opt.a"}, {"state"}, {"0", false, true}, {"m"}}},
      {"7.w", {{"7", false, true}, {"w"}}}};
  struct Case {
    std::vector<std::string> names;
    std::string unplaced;
  };
  const std::vector<Case> cases = {
      {{"optim.state.0.m", "opt.a.state.0.m", "7.w", "epoch", "layers.0.weight"}, ""},
      {{"optim.state.0.m", "optim.state.1.m"}, "optim.state.1.m"},
      {{"opt.a.state.1.m"}, "opt.a.state.1.m"},
      {{"7.b"}, "7.b"},
      {{"opt.b.x", "optimizer.x", "opt"}, ""},  // no recorded dict of those prefixes
      {{"optim.y"}, "optim.y"},  // a top-level key with a dot looks the same: taken as unplaced
  };
  for (const Case& c : cases) EXPECT_EQ(FirstNameLeftUnplaced(paths, c.names), c.unplaced) << c.names.back();
}

// A .pt holds 128 levels (more than dcp_to_torch_save's 65); deeper is refused naming where,
// and a path of more steps than that is not taken from a .metadata at all.
TEST(StateTree, DepthIsBoundedAndTheRefusalNamesThePath) {
  auto nested = [](size_t levels) {
    StatePath path;
    std::string name;
    for (size_t i = 0; i < levels; ++i) {
      path.push_back({i == 1 ? "1" : "k", i == 1});
      name += (i ? "." : "") + path.back().key;
    }
    return std::make_pair(name, path);
  };
  for (size_t levels : {size_t{129}, size_t{130}}) {  // steps: containers are one fewer
    auto [name, path] = nested(levels);
    StateTreeBuilder tree({}, {{name, path}});
    ASSERT_TRUE(tree.Add(name, Leaf(0)).ok());
    ASSERT_TRUE(tree.Add("w", Leaf(1)).ok());
    Result<std::string> pickle = PickleTree({PickleTensor{"t", DType::kFloat32, {1}, {1}, 0, "0", 1},
                                             PickleTensor{"w", DType::kFloat32, {1}, {1}, 0, "1", 1}},
                                            tree.Finish());
    if (levels == 129) {
      EXPECT_TRUE(pickle.ok()) << pickle.status().ToString();
    } else {
      EXPECT_EQ(pickle.status().code(), Code::kInvalidArgument);
      EXPECT_THAT(pickle.status().message(), HasSubstr("more than 128 levels deep, at 'k.1.k.k"));
    }
  }
  auto [long_name, long_path] = nested(130);
  EXPECT_TRUE(DecodeStatePaths(EncodeStatePaths({{long_name, long_path}})).empty());
}

TEST(StateTree, TheValueOrderRecordKeepsStringFollowersOnly) {
  const std::unordered_map<std::string, std::string> expected = {{"epoch", "model.w"}};
  EXPECT_EQ(DecodeValueOrder(R"({"epoch": "model.w", "lr": 3, "name": null})"), expected);
  EXPECT_TRUE(DecodeValueOrder("[\"epoch\"]").empty());
  EXPECT_TRUE(DecodeValueOrder("not json").empty());
}

TEST(StateTree, APlainStateDictKeepsItsOrderAndRefusesARepeatedName) {
  StateTreeBuilder tree({});
  const std::vector<std::string> names = {"layers.1.w", "layers.0.w", "step", "a", "layers.10.b"};
  for (size_t i = 0; i < names.size(); ++i) ASSERT_TRUE(tree.Add(names[i], Leaf(i)).ok());
  EXPECT_EQ(tree.Add("step", Leaf(9)).message(), "'step' names two values (an entry and a blob?)");
  PickleNode root = tree.Finish();
  EXPECT_EQ(root.kind, PickleNode::kDict);
  ASSERT_EQ(root.items.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_EQ(root.items[i].first, names[i]);  // dotted names stay single keys, in the order added
    EXPECT_EQ(root.items[i].second.tensor, i);
  }
}

TEST(EntryAliasTest, EntriesSharingEveryChunkAreAliases) {
  Manifest m;
  const ChunkRecord c0{0, 0, 16, Layout::FlatRange(0, 4)}, c1{0, 4096, 16, Layout::FlatRange(4, 8)};
  m.entries = {{"embed", DType::kFloat32, {8}, {c0, c1}},
               {"other", DType::kFloat32, {8}, {c0}},          // one chunk in common: not an alias
               {"head", DType::kFloat32, {8}, {c0, c1}},       // tied to embed
               {"as_int", DType::kInt32, {8}, {c0, c1}},       // same bytes, another dtype
               {"empty", DType::kFloat32, {0}, {}},
               {"empty2", DType::kFloat32, {0}, {}}};
  EXPECT_THAT(EntryAliases(m), ElementsAre(-1, -1, 0, -1, -1, -1));
}

TEST(EntryAliasTest, EveryNameOfATensorPointsAtItsFirstName) {
  Manifest m;
  const ChunkRecord c0{1, 8192, 16, Layout::FlatRange(0, 4)}, c1{0, 0, 16, Layout::FlatRange(4, 8)};
  const ChunkRecord elsewhere{0, 4096, 16, Layout::FlatRange(0, 4)};
  m.entries = {{"other", DType::kFloat32, {4}, {c0}},         // the same first chunk, fewer chunks
               {"embed", DType::kFloat32, {8}, {c0, c1}},
               {"x", DType::kFloat32, {4}, {elsewhere}},
               {"head", DType::kFloat32, {8}, {c0, c1}},
               {"as_int", DType::kInt32, {8}, {c0, c1}},
               {"head2", DType::kFloat32, {8}, {c0, c1}},
               {"as_int2", DType::kInt32, {8}, {c0, c1}},
               {"x2", DType::kFloat32, {4}, {elsewhere}}};
  EXPECT_THAT(EntryAliases(m), ElementsAre(-1, -1, -1, 1, -1, 1, 4, 2));
}

class TorchFormatsTest : public ::testing::Test {
 protected:
  void SetUp() override { SetLogLevel(LogLevel::kWarn); }
  std::string Path(const std::string& name) const { return JoinPath(dir_.path(), name); }
  TempDir dir_;
};

TEST_F(TorchFormatsTest, TiedWeightsAreStoredOnceInStateDictOrderAndStayTied) {
  // "z.embed" and "head" name one storage, keys unsorted.
  testing::TorchFileCase c;
  c.name = "tied";
  std::vector<PickleTensor> tensors = {Contiguous("z.embed", DType::kFloat32, {4, 2}, "0"),
                                       Contiguous("b.norm", DType::kFloat32, {2}, "1"),
                                       Contiguous("head", DType::kFloat32, {4, 2}, "0")};
  c.pickle = PickleStateDict(tensors).value();
  c.records = {{"0", 32}, {"1", 8}};
  ASSERT_TRUE(testing::WriteTorchFile(Path("tied.pt"), c).ok());
  ConvertOptions options;
  options.world_size = 2;
  Result<ConvertReport> r = ImportFile(Path("tied.pt"), Path("root"), options);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->tensors, 3u);
  EXPECT_EQ(r->bytes, 40u);  // the tied tensor once
  Manifest m = ReadManifest(r->path).value();
  EXPECT_THAT(EntryNames(m), ElementsAre("z.embed", "b.norm", "head"));
  EXPECT_THAT(EntryAliases(m), ElementsAre(-1, -1, 0));
  options.world_size = 3;
  Result<ConvertReport> resharded = Reshard(r->path, Path("root3"), options);
  ASSERT_TRUE(resharded.ok()) << resharded.status().ToString();
  EXPECT_EQ(resharded->bytes, 40u);
  Manifest m3 = ReadManifest(resharded->path).value();
  EXPECT_THAT(EntryNames(m3), ElementsAre("z.embed", "b.norm", "head"));
  EXPECT_THAT(EntryAliases(m3), ElementsAre(-1, -1, 0));
  Result<ConsolidateReport> out = Consolidate(resharded->path, Path("out.pt"), ConsolidateOptions{});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->aliases, 1u);
  ZipReader zip = ZipReader::Open(Path("out.pt")).value();
  UnpickledStateDict back = ReadTorchStateDict(zip).value();
  ASSERT_EQ(back.tensors.size(), 3u);
  EXPECT_EQ(back.tensors[0].name, "z.embed");
  EXPECT_EQ(back.tensors[2].name, "head");
  EXPECT_EQ(back.tensors[2].storage_key, back.tensors[0].storage_key);
  EXPECT_EQ(zip.records().count(zip.prefix() + "data/2"), 0u) << "the tied tensor's bytes written twice";
  std::vector<unsigned char> a, b;
  ASSERT_TRUE(ReadTorchTensor(zip, back.tensors[0], &a).ok());
  ASSERT_TRUE(ReadTorchTensor(zip, back.tensors[2], &b).ok());
  EXPECT_EQ(a, b);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_EQ(a[k], testing::RecordByte("0", k));
}

// Two entries that one --strip-prefix makes equal: both named, the one renamed and the other.
// And a .pt whose records are compressed (a re-zipped file torch reads): not damage, a kind of
// file shardckpt does not read, said as such.
TEST_F(TorchFormatsTest, StripPrefixCollisionsAndCompressedRecordsAreNamed) {
  testing::TorchFileCase c;
  c.name = "two";
  c.pickle = PickleStateDict({Contiguous("model.x", DType::kFloat32, {2}, "0"), Contiguous("x", DType::kFloat32, {2}, "1")}).value();
  c.records = {{"0", 8}, {"1", 8}};
  ASSERT_TRUE(testing::WriteTorchFile(Path("two.pt"), c).ok());
  Result<ConvertReport> r = ImportFile(Path("two.pt"), Path("root"), ConvertOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ConsolidateOptions strip;
  strip.strip_prefix = "model.";
  Result<ConsolidateReport> out = Consolidate(r->path, Path("out.pt"), strip);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.status().message(), HasSubstr("entries 'model.x' and 'x' both become 'x' after --strip-prefix"));
  // Method 8 (deflate) in the first record's local and central headers: refused before its data is read.
  std::string bytes = ReadFileLimited(Path("two.pt"), 1 << 20).value();
  const size_t central = bytes.find("PK\x01\x02");
  ASSERT_NE(central, std::string::npos);
  bytes[central + 10] = 8;
  bytes[8] = 8;
  ASSERT_TRUE(WriteFileAtomic(Path("deflated.pt"), bytes, "test").ok());
  Result<ConvertReport> deflated = ImportFile(Path("deflated.pt"), Path("root2"), ConvertOptions{});
  ASSERT_FALSE(deflated.ok());
  EXPECT_EQ(deflated.status().code(), Code::kUnimplemented);
  EXPECT_THAT(deflated.status().message(), HasSubstr("is compressed (zip method 8)"));
  EXPECT_FALSE(PathExists(Path("root2")));
}

TEST_F(TorchFormatsTest, ValuesAndListsSurviveImportAndConsolidation) {
  testing::TorchFileCase c;
  c.name = "lists";
  std::vector<PickleTensor> tensors = {Contiguous("w", DType::kFloat32, {2}, "0"), Contiguous("x", DType::kInt32, {1}, "1")};
  PickleNode root;
  PickleNode list;
  list.kind = PickleNode::kList;
  list.items.emplace_back("", Leaf(0));
  list.items.emplace_back("", Leaf(1));
  root.items.emplace_back("lst", std::move(list));
  root.items.emplace_back("epoch", Value("7"));
  c.pickle = PickleTree(tensors, root).value();
  c.records = {{"0", 8}, {"1", 4}};
  ASSERT_TRUE(testing::WriteTorchFile(Path("lists.pt"), c).ok());
  Result<ConvertReport> r = ImportFile(Path("lists.pt"), Path("root"), ConvertOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT(r->values, ElementsAre("epoch"));
  Manifest m = ReadManifest(r->path).value();
  EXPECT_THAT(EntryNames(m), ElementsAre("lst.0", "lst.1"));
  ASSERT_EQ(m.blobs.size(), 1u);
  EXPECT_EQ(m.created.user.at(kTorchContainersKey), R"({"lst":"list"})");
  ASSERT_TRUE(Consolidate(r->path, Path("out.pt"), ConsolidateOptions{}).ok());
  ZipReader zip = ZipReader::Open(Path("out.pt")).value();
  const std::string pickle = zip.ReadRecord(zip.prefix() + "data.pkl", 1 << 20).value();
  // The same pickle a list of two tensors and an int make.
  Result<UnpickledStateDict> back = UnpickleStateDict(pickle);
  ASSERT_TRUE(back.ok());
  EXPECT_THAT(back->containers, ElementsAre(std::make_pair(std::string("lst"), std::string("list"))));
  ASSERT_EQ(back->values.size(), 1u);
  EXPECT_EQ(back->values[0].blob, std::string(kPickleValueTag, 2) + "7");
  // Formats that hold tensors only list the value as not written, GGUF as safetensors does.
  ConsolidateOptions floats;
  floats.exclude = {"lst.1"};  // GGUF holds no int32
  floats.format = ExportFormat::kSafetensors;
  Result<ConsolidateReport> st = Consolidate(r->path, Path("out.safetensors"), floats);
  ASSERT_TRUE(st.ok()) << st.status().ToString();
  EXPECT_THAT(st->skipped, ElementsAre("epoch (safetensors holds tensors only)"));
  floats.format = ExportFormat::kGguf;
  floats.gguf_metadata = {GgufKeyValue{"general.architecture", GgufValue{GgufValue::Kind::kString, "llama"}}};
  Result<ConsolidateReport> gguf = Consolidate(r->path, Path("out.gguf"), floats);
  ASSERT_TRUE(gguf.ok()) << gguf.status().ToString();
  EXPECT_THAT(gguf->skipped, ElementsAre("epoch (GGUF holds tensors and its header's keys only)"));
}

// An optimizer's state_dict before its first step holds "state": {}. Walked as a container it
// would leave no name behind and come back missing; it is kept as a value and comes back empty.
TEST_F(TorchFormatsTest, AnEmptyDictIsKeptAsAValueNotDropped) {
  testing::TorchFileCase c;
  c.name = "empty";
  std::vector<PickleTensor> tensors = {Contiguous("w", DType::kFloat32, {2}, "0")};
  PickleNode root;
  root.items.emplace_back("w", Leaf(0));
  PickleNode optim;
  optim.items.emplace_back("state", PickleNode{});
  optim.items.emplace_back("lr", Value("0.5"));
  root.items.emplace_back("optim", std::move(optim));
  c.pickle = PickleTree(tensors, root).value();
  c.records = {{"0", 8}};
  Result<UnpickledStateDict> read = UnpickleStateDict(c.pickle);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  const std::string j(kPickleValueTag, 2);
  std::vector<std::pair<std::string, std::string>> values;
  for (const PickleValue& v : read->values) values.emplace_back(v.name, v.blob);
  EXPECT_THAT(values, ElementsAre(std::make_pair("optim.state", j + "{}"), std::make_pair("optim.lr", j + "0.5")));
  ASSERT_TRUE(testing::WriteTorchFile(Path("empty.pt"), c).ok());
  Result<ConvertReport> r = ImportFile(Path("empty.pt"), Path("root"), ConvertOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(Consolidate(r->path, Path("out.pt"), ConsolidateOptions{}).ok());
  Result<UnpickledStateDict> back = ReadTorchStateDict(ZipReader::Open(Path("out.pt")).value());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  values.clear();
  for (const PickleValue& v : back->values) values.emplace_back(v.name, v.blob);
  EXPECT_THAT(values, ::testing::UnorderedElementsAre(std::make_pair("optim.state", j + "{}"), std::make_pair("optim.lr", j + "0.5")));
}

TEST_F(TorchFormatsTest, HuggingFaceShardedSetsImportInTheIndexOrder) {
  auto write_shard = [&](const std::string& name, std::vector<SafetensorsEntry> entries) {
    std::string header = EncodeSafetensorsHeader(entries, {}).value();
    std::ofstream f(Path("hf/" + name), std::ios::binary);
    f << header;
    for (const SafetensorsEntry& e : entries) f << std::string(e.end - e.begin, static_cast<char>(e.name[0]));
  };
  ASSERT_TRUE(MakeDirs(Path("hf")).ok());
  write_shard("m-1.safetensors", {{"b", DType::kFloat32, {2}, 0, 0}, {"a", DType::kBFloat16, {3}, 0, 0}});
  write_shard("m-2.safetensors", {{"c", DType::kUInt16, {1}, 0, 0}});
  auto index = [&](const std::string& text) { std::ofstream(Path("hf/model.safetensors.index.json")) << text; };
  index(R"({"metadata": {}, "weight_map": {"c": "m-2.safetensors", "a": "m-1.safetensors", "b": "m-1.safetensors"}})");
  for (const std::string& input : {Path("hf"), Path("hf/model.safetensors.index.json")}) {
    Result<ConvertReport> r = ImportFile(input, Path("root"), ConvertOptions{});
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    Manifest m = ReadManifest(r->path).value();
    EXPECT_THAT(EntryNames(m), ElementsAre("c", "a", "b"));
    EXPECT_EQ(m.entries[0].dtype, DType::kUInt16);
    ASSERT_TRUE(RemoveTree(Path("root")).ok());
  }
  struct Bad {
    std::string index, refusal;
  } bad[] = {
      {R"({"weight_map": {"a": "m-1.safetensors", "c": "m-1.safetensors"}})", "tensor 'c' is not in m-1.safetensors"},
      {R"({"weight_map": {"a": "m-1.safetensors"}})", "the shard files hold 2 tensors but the index lists 1"},
      {R"({"weight_map": {"a": "../m-1.safetensors"}})", "not a file name in the index's folder"},
      {R"({"weight_map": {"a": "sub\\m-1.safetensors"}})", "not a file name in the index's folder"},
      {R"({"weight_map": {"a": "m-1.safetensors\u0000x"}})", "maps to 'm-1.safetensors\\0x', not a file name"},
      {R"({"weight_map": {"a": ")" + std::string(256, 'm') + R"("}})", "not a file name in the index's folder"},
      {R"({"weights": {}})", "not a JSON object with a \"weight_map\" object"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.index);
    index(b.index);
    Result<ConvertReport> r = ImportFile(Path("hf"), Path("root"), ConvertOptions{});
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr(b.refusal));
    EXPECT_FALSE(PathExists(Path("root")));
  }
}


// Integers past 255 bytes pickle as LONG4 (torch's own weights_only reader refuses those, as it
// refuses torch.save's): written and read back to the same value.
TEST(TorchPickle, IntegersOfAnyWidthRoundTrip) {
  const std::string j(kPickleValueTag, 2);
  const std::string wide = R"({"__shardckpt__":"int","v":")" + std::string(600, '0') + R"(01"})";
  PickleNode root;
  root.items.emplace_back("wide", Value(wide));
  root.items.emplace_back("neg", Value(R"({"__shardckpt__":"int","v":"0000000000000000fe"})"));
  Result<UnpickledStateDict> back = UnpickleStateDict(PickleTree({}, root).value());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->values.size(), 2u);
  EXPECT_EQ(back->values[0].blob, j + wide);
  EXPECT_EQ(back->values[1].blob, j + R"({"__shardckpt__":"int","v":"0000000000000000fe"})");
}

// torch.save(AdamW(...).state_dict()) before the first step: values only, still a .pt.
TEST_F(TorchFormatsTest, AStateDictOfValuesOnlyConsolidates) {
  testing::TorchFileCase c;
  c.name = "optim";
  PickleNode root;
  root.items.emplace_back("state", PickleNode{});
  root.items.emplace_back("param_groups", Value(R"([{"lr":0.001,"params":[0,1]}])"));
  c.pickle = PickleTree({}, root).value();
  ASSERT_TRUE(testing::WriteTorchFile(Path("optim.pt"), c).ok());
  Result<ConvertReport> r = ImportFile(Path("optim.pt"), Path("root"), ConvertOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Result<ConsolidateReport> out = Consolidate(r->path, Path("out.pt"), ConsolidateOptions{});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  Result<UnpickledStateDict> back = ReadTorchStateDict(ZipReader::Open(Path("out.pt")).value());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  std::vector<std::string> names;
  for (const PickleValue& v : back->values) names.push_back(v.name);
  EXPECT_THAT(names, ElementsAre("state", "param_groups"));
  ConsolidateOptions only;
  only.include = {"model.*"};
  EXPECT_THAT(Consolidate(r->path, Path("none.pt"), only).status().message(), HasSubstr("is selected"));
}

// Entries and blobs are kept apart; import records where each value sat among the tensors, and
// consolidation puts it back there, so the .pt's keys come in the state dict's order.
TEST_F(TorchFormatsTest, ValuesKeepTheirPlaceAmongTheTensors) {
  testing::TorchFileCase c;
  c.name = "order";
  std::vector<PickleTensor> tensors = {Contiguous("a", DType::kFloat32, {2}, "0"), Contiguous("b", DType::kFloat32, {2}, "1")};
  PickleNode root;
  root.items.emplace_back("first", Value("1"));
  root.items.emplace_back("a", Leaf(0));
  PickleNode opt;  // a nested dict: a tensor, then a value, then a tensor
  opt.items.emplace_back("lr", Value("0.5"));
  opt.items.emplace_back("b", Leaf(1));
  root.items.emplace_back("opt", std::move(opt));
  root.items.emplace_back("epoch", Value("7"));
  c.pickle = PickleTree(tensors, root).value();
  c.records = {{"0", 8}, {"1", 8}};
  ASSERT_TRUE(testing::WriteTorchFile(Path("order.pt"), c).ok());
  ConvertOptions three;
  three.world_size = 3;
  Result<ConvertReport> r = ImportFile(Path("order.pt"), Path("root"), three);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  Result<ConvertReport> resharded = Reshard(r->path, Path("root2"), ConvertOptions{});
  ASSERT_TRUE(resharded.ok()) << resharded.status().ToString();
  ASSERT_TRUE(Consolidate(resharded->path, Path("out.pt"), ConsolidateOptions{}).ok());
  Result<UnpickledStateDict> back = ReadTorchStateDict(ZipReader::Open(Path("out.pt")).value());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  std::vector<std::pair<std::string, size_t>> places;
  for (const PickleValue& v : back->values) places.emplace_back(v.name, v.tensors_before);
  EXPECT_THAT(places, ElementsAre(std::make_pair("first", 0u), std::make_pair("opt.lr", 1u), std::make_pair("epoch", 2u)));
}

// A C++ program's blob is raw bytes; export writes it as a Python bytes object. A load of the
// DCP folder and a load of its import both give the bytes back (not the JSON the import keeps,
// which is what Python and consolidate read).
TEST_F(TorchFormatsTest, ABlobSurvivesExportToDcpAndImport) {
  auto writer = OfflineCheckpointWriter::Begin(Path("root"), 3, 2).value();
  const std::vector<float> w = {1.5f, -2.0f, 3.25f, 4.0f};
  ASSERT_TRUE(writer->AddPiece(0, "w", DType::kFloat32, {4}, Layout::Whole(), w.data(), 16).ok());
  const std::string raw("hello-w3\0\xff", 10);
  const std::string typed = std::string(kPickleValueTag, 2) + R"({"epoch":3})";
  ASSERT_TRUE(writer->AddBlob(0, "meta", BlobScope::kGlobal, raw).ok());
  ASSERT_TRUE(writer->AddBlob(0, "extra", BlobScope::kGlobal, typed).ok());
  const std::string ckpt = writer->Commit(CreationInfo{}).value();
  ASSERT_TRUE(ExportDcp(ckpt, Path("dcp"), DcpExportOptions{}).ok());
  ConvertOptions three;
  three.world_size = 3;
  std::unique_ptr<Communicator> comm = CreateSingleProcessCommunicator();
  for (const std::string& loaded : {Path("dcp"), ImportFile(Path("dcp"), Path("imported"), three).value().path,
                                    Reshard(Path("dcp"), Path("resharded"), three).value().path}) {
    SCOPED_TRACE(loaded);
    std::vector<float> got(4, 0.0f);
    ShardedState targets;
    ASSERT_TRUE(targets.AddTensor("w", DType::kFloat32, {4}, Layout::Whole(), got.data()).ok());
    Result<LoadReport> report = Load(*comm, loaded, targets);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(got, w);
    EXPECT_EQ(report->blobs.at("meta").bytes, raw);
    EXPECT_TRUE(report->blobs.at("meta").python_bytes);
    EXPECT_EQ(report->blobs.at("extra").bytes, typed);
    EXPECT_FALSE(report->blobs.at("extra").python_bytes);
  }
  // What the import stores is the typed value: consolidate writes it into a .pt as bytes.
  const std::string imported = ResolveCheckpoint(Path("imported")).value();
  ASSERT_TRUE(Consolidate(imported, Path("back.pt"), ConsolidateOptions{}).ok());
  Result<UnpickledStateDict> back = ReadTorchStateDict(ZipReader::Open(Path("back.pt")).value());
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  std::vector<std::string> names;
  for (const PickleValue& v : back->values) names.push_back(v.name);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre("meta", "extra.epoch"));  // dicts as dotted keys
}

// reshard lists each value it carries once: per-rank ones are stored once per rank.
TEST_F(TorchFormatsTest, ReshardListsEachValueOnce) {
  auto writer = OfflineCheckpointWriter::Begin(Path("root"), 1, 2).value();
  const std::vector<float> w = {1, 2};
  ASSERT_TRUE(writer->AddPiece(0, "w", DType::kFloat32, {2}, Layout::Whole(), w.data(), 8).ok());
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(writer->AddBlob(rank, "a", BlobScope::kPerRank, "a" + std::to_string(rank)).ok());
    ASSERT_TRUE(writer->AddBlob(rank, "b", BlobScope::kPerRank, "b" + std::to_string(rank)).ok());
  }
  ASSERT_TRUE(writer->AddBlob(0, "epoch", BlobScope::kGlobal, "1").ok());
  const std::string ckpt = writer->Commit(CreationInfo{}).value();
  ConvertOptions two;
  two.world_size = 2;
  Result<ConvertReport> r = Reshard(ckpt, Path("again"), two);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::string> values = r->values;
  std::sort(values.begin(), values.end());
  EXPECT_THAT(values, ElementsAre("a", "b", "epoch"));
}

// Exports that write several files: a failure after the first file (a dtype the format cannot
// hold, a full disk) leaves none of them behind, as a single-file export leaves no half file.
class MultiFileExportTest : public TorchFormatsTest {
 protected:
  void TearDown() override { SetFailpoints("").IgnoreError(); }
  // Three float32 tensors of 1 KiB and, last, `tail`: a checkpoint of two ranks.
  std::string Checkpoint(DType tail) {
    testing::TorchFileCase c;
    c.name = "multi";
    std::vector<PickleTensor> tensors = {Contiguous("a", DType::kFloat32, {256}, "0"), Contiguous("b", DType::kFloat32, {256}, "1"),
                                         Contiguous("c", DType::kFloat32, {256}, "2"), Contiguous("d", tail, {4}, "3")};
    c.pickle = PickleStateDict(tensors).value();
    c.records = {{"0", 1024}, {"1", 1024}, {"2", 1024}, {"3", 4 * DTypeSize(tail)}};
    EXPECT_TRUE(testing::WriteTorchFile(Path("multi.pt"), c).ok());
    ConvertOptions options;
    options.world_size = 2;
    Result<ConvertReport> r = ImportFile(Path("multi.pt"), Path("root"), options);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? r->path : "";
  }
  std::vector<std::string> Listing(const std::string& dir) {
    std::vector<std::string> names = ListDir(dir).value();
    std::sort(names.begin(), names.end());
    return names;
  }
};

TEST_F(MultiFileExportTest, ShardedSafetensorsLeaveNoShardBehind) {
  ConsolidateOptions options;
  options.format = ExportFormat::kSafetensors;
  options.max_shard_bytes = 1024;
  ASSERT_TRUE(MakeDirs(Path("st")).ok());
  // complex128 in the last shard: refused before the first shard is written.
  Result<ConsolidateReport> r = Consolidate(Checkpoint(DType::kComplex128), Path("st/model.safetensors"), options);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("tensor 'd': dtype complex128 has no safetensors type"));
  EXPECT_TRUE(Listing(Path("st")).empty());
  // A full disk while writing the second shard: the first, closed already, is removed too.
  ASSERT_TRUE(RemoveTree(Path("root")).ok());
  const std::string ckpt = Checkpoint(DType::kFloat32);
  ASSERT_TRUE(SetFailpoints("io.write#2=ENOSPC").ok());
  r = Consolidate(ckpt, Path("st/model.safetensors"), options);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kNoSpace) << r.status().ToString();
  EXPECT_TRUE(Listing(Path("st")).empty()) << ::testing::PrintToString(Listing(Path("st")));
  ASSERT_TRUE(SetFailpoints("").ok());
  r = Consolidate(ckpt, Path("st/model.safetensors"), options);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->files.size(), 5u);  // a shard per tensor and the index
}

// Consolidating again into the same folder with fewer shards replaces the set: the old shards
// its index listed go, files it did not list stay.
TEST_F(MultiFileExportTest, AShardedSetReplacesThePreviousOne) {
  const std::string ckpt = Checkpoint(DType::kFloat32);
  ConsolidateOptions options;
  options.format = ExportFormat::kSafetensors;
  options.max_shard_bytes = 1024;
  ASSERT_TRUE(Consolidate(ckpt, Path("st/model.safetensors"), options).ok());
  std::ofstream(Path("st/notes.txt")) << "mine";
  std::ofstream(Path("st/model-00009-of-00009.safetensors")) << "not in the index";
  options.max_shard_bytes = 2048;
  Result<ConsolidateReport> r = Consolidate(ckpt, Path("st/model.safetensors"), options);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT(Listing(Path("st")),
              ElementsAre("model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors.sha256",
                          "model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors.sha256",
                          "model-00009-of-00009.safetensors", "model.safetensors.index.json",
                          "model.safetensors.index.json.sha256", "notes.txt"));
}

// A failed export over an earlier one leaves the earlier one whole: nothing is renamed into place
// until every file is written.
TEST_F(MultiFileExportTest, AFailedExportKeepsThePreviousOutput) {
  const std::string ckpt = Checkpoint(DType::kFloat32);
  ConsolidateOptions options;
  options.format = ExportFormat::kSafetensors;
  for (uint64_t shard_bytes : {uint64_t{0}, uint64_t{1024}}) {
    SCOPED_TRACE(shard_bytes);
    options.max_shard_bytes = shard_bytes;
    const std::string dir = Path("keep" + std::to_string(shard_bytes));
    Result<ConsolidateReport> first = Consolidate(ckpt, JoinPath(dir, "model.safetensors"), options);
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    std::map<std::string, std::string> before;
    for (const std::string& name : Listing(dir)) before[name] = ReadFileLimited(JoinPath(dir, name), 1 << 20).value();
    for (const char* failure : {"io.write#1=ENOSPC", "io.write#3=ENOSPC", "export.sha256.write=ENOSPC", "fs.rename#2=EIO"}) {
      SCOPED_TRACE(failure);
      ASSERT_TRUE(SetFailpoints(failure).ok());
      Result<ConsolidateReport> again = Consolidate(ckpt, JoinPath(dir, "model.safetensors"), options);
      ASSERT_TRUE(SetFailpoints("").ok());
      if (again.ok()) continue;  // a failpoint this layout never reaches
      std::map<std::string, std::string> after;
      for (const std::string& name : Listing(dir)) after[name] = ReadFileLimited(JoinPath(dir, name), 1 << 20).value();
      if (std::string(failure).rfind("fs.rename", 0) == 0) {
        // Renames cannot be atomic as a set: failing the second, the first (already new) is
        // removed again and the error says the set must be exported again; never a silent mix
        // of new and old shards.
        EXPECT_THAT(again.status().message(), HasSubstr("publishing file 2 of 4"));
        EXPECT_FALSE(after.count("model-00001-of-00004.safetensors"));
        // The old index went before any shard was replaced: a crash between two renames left
        // old and new shards under it, which passed every check and imported as one model.
        EXPECT_FALSE(after.count("model.safetensors.index.json"));
        EXPECT_EQ(after.at("model-00002-of-00004.safetensors"), before.at("model-00002-of-00004.safetensors"));
      } else {
        EXPECT_EQ(after, before);
      }
    }
  }
}

// A file whose sidecar cannot be put in place after the file was is removed again, said: a file
// without its digest passed for a finished export while the export reported a failure.
TEST_F(MultiFileExportTest, AFileWhoseSidecarFailsIsNotLeftLookingFinished) {
  const std::string ckpt = Checkpoint(DType::kFloat32);
  for (const char* out : {"fresh/model.pt", "fresh/model.safetensors"}) {
    SCOPED_TRACE(out);
    ConsolidateOptions options;
    options.format = FormatFromPath(out).value();
    ASSERT_TRUE(SetFailpoints("export.sha256.rename=EIO").ok());
    Result<ConsolidateReport> failed = Consolidate(ckpt, Path(out), options);
    ASSERT_TRUE(SetFailpoints("").ok());
    ASSERT_FALSE(failed.ok());
    EXPECT_THAT(failed.status().message(), HasSubstr(Path(out) + " is removed again: export again"));
    EXPECT_FALSE(PathExists(Path(out)));
    EXPECT_FALSE(PathExists(Path(out) + ".sha256"));
    EXPECT_FALSE(PathExists(Path(out) + ".sha256.tmp"));
  }
}

// One file and a sharded set of the same name replace each other.
TEST_F(MultiFileExportTest, OneFileAndShardsOfTheSameNameReplaceEachOther) {
  const std::string ckpt = Checkpoint(DType::kFloat32);
  ConsolidateOptions options;
  options.format = ExportFormat::kSafetensors;
  ASSERT_TRUE(Consolidate(ckpt, Path("sw/model.safetensors"), options).ok());
  options.max_shard_bytes = 2048;
  ASSERT_TRUE(Consolidate(ckpt, Path("sw/model.safetensors"), options).ok());
  EXPECT_THAT(Listing(Path("sw")),
              ElementsAre("model-00001-of-00002.safetensors", "model-00001-of-00002.safetensors.sha256",
                          "model-00002-of-00002.safetensors", "model-00002-of-00002.safetensors.sha256",
                          "model.safetensors.index.json", "model.safetensors.index.json.sha256"));
  options.max_shard_bytes = 0;
  ASSERT_TRUE(Consolidate(ckpt, Path("sw/model.safetensors"), options).ok());
  EXPECT_THAT(Listing(Path("sw")), ElementsAre("model.safetensors", "model.safetensors.sha256"));
  // A shard size the whole model fits under is one file, as transformers writes it.
  options.max_shard_bytes = 2048;
  ASSERT_TRUE(Consolidate(ckpt, Path("sw/model.safetensors"), options).ok());
  options.max_shard_bytes = uint64_t{5} << 30;
  ASSERT_TRUE(Consolidate(ckpt, Path("sw/model.safetensors"), options).ok());
  EXPECT_THAT(Listing(Path("sw")), ElementsAre("model.safetensors", "model.safetensors.sha256"));
}

// Two exports to one path at once wrote one OUT.partial together: the second is refused at once,
// naming the path, and writes nothing; once the first lets go, the path is free again.
TEST_F(MultiFileExportTest, AnExportToAPathAnotherExportHoldsIsRefused) {
  const std::string ckpt = Checkpoint(DType::kFloat32);
  ASSERT_TRUE(MakeDirs(Path("out")).ok());
  const std::string pt = Path("out/model.pt"), dcp = Path("out/dcp");
  {
    OutputLock first = OutputLock::Acquire(pt).value();
    OutputLock other = OutputLock::Acquire(dcp).value();
    Result<ConsolidateReport> c = Consolidate(ckpt, pt, ConsolidateOptions{});
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), Code::kFailedPrecondition);
    EXPECT_THAT(c.status().message(), HasSubstr("another consolidate or export is writing " + pt));
    Result<DcpExportReport> d = ExportDcp(ckpt, dcp, DcpExportOptions{});
    ASSERT_FALSE(d.ok());
    EXPECT_THAT(d.status().message(), HasSubstr("another consolidate or export is writing " + dcp));
    EXPECT_THAT(Listing(Path("out")), ElementsAre(".dcp.lock", ".model.pt.lock"));
    EXPECT_EQ(OutputLock::Acquire(pt).status().code(), Code::kFailedPrecondition);
  }
  EXPECT_TRUE(Listing(Path("out")).empty());  // each hold's file goes with it
  ASSERT_TRUE(Consolidate(ckpt, pt, ConsolidateOptions{}).ok());
  ASSERT_TRUE(ExportDcp(ckpt, dcp, DcpExportOptions{}).ok());
  EXPECT_THAT(Listing(Path("out")), ElementsAre("dcp", "model.pt", "model.pt.sha256"));
}

// An export killed before its .metadata left files of its own in the folder, and every rerun
// was refused as "not empty" until someone removed them by hand. They are cleared; anything
// else in the folder still refuses it.
TEST_F(MultiFileExportTest, DcpExportAgainAfterAKilledOneClearsItsLeftovers) {
  const std::string ckpt = Checkpoint(DType::kFloat32);
  const std::string out = Path("killed");
  ASSERT_TRUE(MakeDirs(out).ok());
  for (const char* name : {"__0_0.distcp", "__0_0.distcp.sha256", "__1_0.distcp.partial", "__1_0.distcp.sha256.tmp",
                           ".metadata.tmp"}) {
    ASSERT_TRUE(WriteFileAtomic(JoinPath(out, name), "half", "test").ok());
  }
  Result<DcpExportReport> r = ExportDcp(ckpt, out, DcpExportOptions{});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_THAT(Listing(out), ElementsAre(".metadata", "__0_0.distcp", "__0_0.distcp.sha256", "__1_0.distcp",
                                        "__1_0.distcp.sha256"));
  const std::string mine = Path("mine");
  ASSERT_TRUE(MakeDirs(mine).ok());
  for (const char* name : {"__0_0.distcp.partial", "notes.txt"}) ASSERT_TRUE(WriteFileAtomic(JoinPath(mine, name), "x", "test").ok());
  Result<DcpExportReport> refused = ExportDcp(ckpt, mine, DcpExportOptions{});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr(mine + " is not empty"));
  EXPECT_THAT(Listing(mine), ElementsAre("__0_0.distcp.partial", "notes.txt"));
  // What torch's own writer leaves (a dcp.save in progress, no .partial or .sha256 of ours).
  const std::string torchs = Path("torchs");
  ASSERT_TRUE(MakeDirs(torchs).ok());
  for (const char* name : {"__0_0.distcp", "__3_7.distcp", ".metadata.tmp"}) {
    ASSERT_TRUE(WriteFileAtomic(JoinPath(torchs, name), "x", "test").ok());
  }
  EXPECT_THAT(ExportDcp(ckpt, torchs, DcpExportOptions{}).status().message(), HasSubstr(torchs + " is not empty"));
  EXPECT_THAT(Listing(torchs), ElementsAre(".metadata.tmp", "__0_0.distcp", "__3_7.distcp"));
}

// A consolidation over an earlier output: the earlier .sha256 goes before the new file takes the
// name, so no crash leaves the new file beside the old digest (import refused the good file).
TEST_F(MultiFileExportTest, ANewOutputNeverSitsBesideTheOldDigest) {
  const std::string ckpt = Checkpoint(DType::kFloat32);
  const std::string pt = Path("again/model.pt");
  ASSERT_TRUE(Consolidate(ckpt, pt, ConsolidateOptions{}).ok());
  ASSERT_TRUE(PathExists(pt + ".sha256"));
  const std::string before = ReadFileLimited(pt, 1 << 20).value();
  ConsolidateOptions bf16;
  bf16.cast = DType::kBFloat16;
  // Killed at the rename into place (a child process): the old file, and no digest of another.
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    SetFailpoints("fs.rename#1=kill").IgnoreError();
    Consolidate(ckpt, pt, bf16).status().IgnoreError();
    ::_exit(0);  // not reached: the failpoint kills it
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_EQ(ReadFileLimited(pt, 1 << 20).value(), before);
  EXPECT_FALSE(PathExists(pt + ".sha256"));
  ASSERT_TRUE(Consolidate(ckpt, pt, ConsolidateOptions{}).ok());
  // A rename that fails (no crash) puts the old digest back: the previous output whole.
  ASSERT_TRUE(SetFailpoints("fs.rename#1=EIO").ok());
  EXPECT_FALSE(Consolidate(ckpt, pt, bf16).ok());
  ASSERT_TRUE(SetFailpoints("").ok());
  EXPECT_EQ(ReadFileLimited(pt, 1 << 20).value(), before);
  EXPECT_TRUE(RequireSidecarMatch(pt).ok());
  ASSERT_TRUE(PathExists(pt + ".sha256"));
  ASSERT_TRUE(Consolidate(ckpt, pt, bf16).ok());
  EXPECT_TRUE(RequireSidecarMatch(pt).ok());
  EXPECT_NE(ReadFileLimited(pt, 1 << 20).value(), before);
}

// A sharded set over one of another count: the new shards take other names, and the old set,
// index and all, stays whole until the new index replaces it; a failure before that keeps it.
TEST_F(MultiFileExportTest, AShardedSetOfAnotherCountKeepsTheOldSetUntilItsIndexIsWritten) {
  const std::string ckpt = Checkpoint(DType::kFloat32);
  ConsolidateOptions options;
  options.format = ExportFormat::kSafetensors;
  options.max_shard_bytes = 1024;
  const std::string out = Path("counts/model.safetensors");
  ASSERT_TRUE(Consolidate(ckpt, out, options).ok());
  std::map<std::string, std::string> before;
  for (const std::string& name : Listing(Path("counts"))) before[name] = ReadFileLimited(JoinPath(Path("counts"), name), 1 << 20).value();
  ASSERT_TRUE(before.count("model.safetensors.index.json"));
  options.max_shard_bytes = 2048;  // fewer shards (two), other names
  ASSERT_TRUE(SetFailpoints("export.index.fsync=ENOSPC").ok());
  EXPECT_FALSE(Consolidate(ckpt, out, options).ok());
  ASSERT_TRUE(SetFailpoints("").ok());
  std::map<std::string, std::string> after;
  for (const std::string& name : Listing(Path("counts"))) after[name] = ReadFileLimited(JoinPath(Path("counts"), name), 1 << 20).value();
  EXPECT_EQ(after, before);
}

TEST_F(MultiFileExportTest, DcpExportAfterAFullDiskLeavesTheFolderAsItWas) {
  const std::string ckpt = Checkpoint(DType::kFloat32);
  ASSERT_TRUE(MakeDirs(Path("empty")).ok());
  for (const std::string& out : {Path("new"), Path("empty")}) {
    SCOPED_TRACE(out);
    ASSERT_TRUE(SetFailpoints("io.write#2=ENOSPC").ok());
    Result<DcpExportReport> r = ExportDcp(ckpt, out, DcpExportOptions{});
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kNoSpace) << r.status().ToString();
    if (out == Path("new")) {
      EXPECT_FALSE(PathExists(out));
    } else {
      EXPECT_TRUE(Listing(out).empty()) << ::testing::PrintToString(Listing(out));
    }
    ASSERT_TRUE(SetFailpoints("").ok());
    r = ExportDcp(ckpt, out, DcpExportOptions{});  // a retry is not refused as "not empty"
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_THAT(Listing(out), ElementsAre(".metadata", "__0_0.distcp", "__0_0.distcp.sha256", "__1_0.distcp",
                                          "__1_0.distcp.sha256"));
  }
}

// The .sha256 an export leaves beside each file vouches for it: import, reshard, consolidate and
// export refuse a file changed since (they read it whole into something new, which gets fresh
// checksums and would verify clean), naming the file; without a .sha256 nothing is checked.
TEST_F(MultiFileExportTest, ToolsRefuseAFileItsSha256DoesNotMatch) {
  const std::string ckpt = Checkpoint(DType::kFloat32);
  ASSERT_TRUE(ExportDcp(ckpt, Path("dcp"), DcpExportOptions{}).ok());
  ASSERT_TRUE(Consolidate(ckpt, Path("m.pt"), ConsolidateOptions{}).ok());
  ConsolidateOptions safetensors;
  safetensors.format = ExportFormat::kSafetensors;
  ASSERT_TRUE(Consolidate(ckpt, Path("m.safetensors"), safetensors).ok());
  ConvertOptions two;
  two.world_size = 2;
  // Sound: every tool goes ahead.
  EXPECT_TRUE(ImportFile(Path("dcp"), Path("ok-dcp"), two).ok());
  EXPECT_TRUE(ImportFile(Path("m.pt"), Path("ok-pt"), two).ok());
  Result<ConvertReport> st = ImportFile(Path("m.safetensors"), Path("ok-st"), two);
  EXPECT_TRUE(st.ok()) << st.status().ToString();
  // One byte of tensor data flipped in each (the last byte: data, not a header).
  for (const std::string& file : {Path("dcp") + "/__1_0.distcp", Path("m.safetensors")}) {
    const uint64_t size = FileSize(file).value();
    std::string bytes = ReadFileLimited(file, size).value();
    bytes[size - 1] ^= 0x01;
    ASSERT_TRUE(WriteFileAtomic(file, bytes, "test").ok());
  }
  for (const Result<ConvertReport>& r : {ImportFile(Path("dcp"), Path("bad-dcp"), two), Reshard(Path("dcp"), Path("bad-re"), two),
                                         ImportFile(Path("m.safetensors"), Path("bad-st"), two)}) {
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), Code::kDataLoss) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr("the file changed since it was written"));
  }
  Status dcp = ImportFile(Path("dcp"), Path("bad-dcp"), two).status();
  EXPECT_THAT(dcp.message(), HasSubstr(Path("dcp") + "/__1_0.distcp: SHA-256 "));
  EXPECT_THAT(dcp.message(), HasSubstr("does not match __1_0.distcp.sha256"));
  EXPECT_FALSE(PathExists(Path("bad-dcp")) && !ListDir(Path("bad-dcp")).value().empty());
  Status consolidated = Consolidate(Path("dcp"), Path("out.pt"), ConsolidateOptions{}).status();
  EXPECT_EQ(consolidated.code(), Code::kDataLoss) << consolidated.ToString();
  EXPECT_FALSE(PathExists(Path("out.pt")));
  EXPECT_EQ(ExportDcp(Path("dcp"), Path("again"), DcpExportOptions{}).status().code(), Code::kDataLoss);
  // A .sha256 that is not one is refused as such; without any, the file is taken as it is.
  ASSERT_TRUE(WriteFileAtomic(Path("m.pt.sha256"), "not a digest\n", "test").ok());
  Status not_sum = ImportFile(Path("m.pt"), Path("bad-pt"), two).status();
  EXPECT_EQ(not_sum.code(), Code::kDataLoss);
  EXPECT_THAT(not_sum.message(), HasSubstr("m.pt.sha256 holds no SHA-256 in sha256sum's form"));
  // sha256sum's --tag form and upper-case hex are sums like the others.
  const std::string sum = Sha256Hex(ReadFileLimited(Path("m.pt"), 1 << 20).value());
  std::string upper = sum;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (const std::string& line : {"SHA256 (m.pt) = " + sum + "\n", upper + "  m.pt\n"}) {
    ASSERT_TRUE(WriteFileAtomic(Path("m.pt.sha256"), line, "test").ok());
    Result<ConvertReport> tagged = ImportFile(Path("m.pt"), Path("tag" + std::to_string(line.size())), two);
    EXPECT_TRUE(tagged.ok()) << line << tagged.status().ToString();
  }
  ASSERT_EQ(::unlink(Path("m.safetensors.sha256").c_str()), 0);
  EXPECT_TRUE(ImportFile(Path("m.safetensors"), Path("unchecked"), two).ok());
}

// A model file given where a checkpoint is wanted is told to import it; an import into a root
// that has step 0 is told to use a new root; a DCP folder imported is recorded as imported.
TEST_F(MultiFileExportTest, ModelFilesAndImportsIntoUsedRootsSayWhatToDo) {
  const std::string ckpt = Checkpoint(DType::kFloat32);
  ASSERT_TRUE(Consolidate(ckpt, Path("m.pt"), ConsolidateOptions{}).ok());
  ASSERT_TRUE(ExportDcp(ckpt, Path("dcp"), DcpExportOptions{}).ok());
  Status model_file = Consolidate(Path("m.pt"), Path("again.pt"), ConsolidateOptions{}).status();
  EXPECT_EQ(model_file.code(), Code::kInvalidArgument);
  EXPECT_THAT(model_file.message(), HasSubstr(Path("m.pt") + " is a model file, not a checkpoint: `shardckpt import " +
                                              Path("m.pt") + " --out ROOT --world-size N`"));
  // Named by its bytes when its name says nothing (Lightning's .ckpt is a torch.save zip).
  ASSERT_EQ(::link(Path("m.pt").c_str(), Path("last.ckpt").c_str()), 0);
  Status lightning = ResolveCheckpoint(Path("last.ckpt")).status();
  EXPECT_THAT(lightning.message(), HasSubstr(Path("last.ckpt") + " is a model file, not a checkpoint: `shardckpt import"));
  Status manifest = ResolveCheckpoint(JoinPath(ckpt, kManifestName)).status();
  EXPECT_THAT(manifest.message(), HasSubstr("is a file: give the checkpoint folder (or the root) instead"));
  // So is a Hugging Face model folder (it was "neither a checkpoint nor a root").
  ASSERT_TRUE(MakeDir(Path("hf")).ok());
  ConsolidateOptions safetensors;
  safetensors.format = ExportFormat::kSafetensors;
  ASSERT_TRUE(Consolidate(ckpt, JoinPath(Path("hf"), "model.safetensors"), safetensors).ok());
  Status hf = ResolveCheckpoint(Path("hf")).status();
  EXPECT_EQ(hf.code(), Code::kInvalidArgument);
  EXPECT_THAT(hf.message(), HasSubstr(Path("hf") + " is a model folder (model.safetensors), not a checkpoint: `shardckpt "
                                      "import " + Path("hf") + " --out ROOT --world-size N`"));
  // A DCP folder's data file is often a torch.save zip too; its folder is what is meant.
  size_t distcp = 0;
  for (const std::string& name : Listing(Path("dcp"))) {
    if (!EndsWith(name, ".distcp")) continue;
    ++distcp;
    Status part = ResolveCheckpoint(JoinPath(Path("dcp"), name)).status();
    EXPECT_THAT(part.message(), HasSubstr("is a file: give the checkpoint folder (or the root) instead")) << name;
  }
  EXPECT_GT(distcp, 0u);
  ConvertOptions two;
  two.world_size = 2;
  Result<ConvertReport> imported = ImportFile(Path("dcp"), Path("from-dcp"), two);
  ASSERT_TRUE(imported.ok()) << imported.status().ToString();
  const Manifest m = ReadManifest(imported->path).value();
  EXPECT_EQ(m.created.user.at("imported_from"), Path("dcp"));
  EXPECT_EQ(m.created.user.count("resharded_from"), 0u);
  Status used = ImportFile(Path("m.pt"), Path("from-dcp"), two).status();
  EXPECT_EQ(used.code(), Code::kAlreadyExists);
  EXPECT_THAT(used.message(), HasSubstr("give an --out root (Python: out_root) that holds no checkpoint"));
}

}  // namespace
}  // namespace shardckpt
