// A program outside the shardckpt tree: every rank saves its flat shard of one tensor and its
// row block of another, then loads both back in the other layout (resharded) and checks every
// value. Run it under mpirun at any world size:
//   mpirun -np 2 ./save_load /tmp/example-ckpt
// Prints, on rank 0, the tensor bytes saved and loaded by all ranks together; they are equal
// when the load got back everything the save wrote.
#include <cstdio>
#include <string>
#include <vector>

#include "shardckpt/collectives/mpi_communicator.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"

namespace {

using shardckpt::Shape;

const shardckpt::DType kF32 = shardckpt::DType::kFloat32;
const Shape kWeightShape = {96, 40};
const Shape kEmbeddingShape = {50, 24};

// Element i of a tensor holds base + i, so any misplaced byte shows.
std::vector<float> Expected(const Shape& global, const shardckpt::Layout& layout, float base) {
  std::vector<float> values;
  int64_t columns = global[1];
  for (int64_t i = 0; i < global[0] * columns; ++i) {
    int64_t row = i / columns;
    bool mine = true;  // kWhole: the whole tensor
    if (layout.kind == shardckpt::LayoutKind::kFlatRange)
      mine = i >= layout.begin && i < layout.end;
    if (layout.kind == shardckpt::LayoutKind::kBox)
      mine = row >= layout.offsets[0] && row < layout.offsets[0] + layout.sizes[0];
    if (mine) values.push_back(base + static_cast<float>(i));
  }
  return values;
}

int Fail(const std::string& what, const shardckpt::Status& status) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  auto session = shardckpt::MpiSession::Init(&argc, &argv);
  if (!session.ok()) return Fail("MPI", session.status());
  auto comm = shardckpt::CreateMpiCommunicator().value();
  int rank = comm->rank(), size = comm->size();
  std::string root = argc > 1 ? argv[1] : "/tmp/shardckpt-example";

  // Save: "w" as flat shards (FSDP/ZeRO style), "emb" as row blocks (tensor parallel).
  auto w_save = shardckpt::FlatShardLayout(kWeightShape, size, rank);
  auto emb_save = shardckpt::ChunkLayout(kEmbeddingShape, 0, size, rank);
  std::vector<float> w = Expected(kWeightShape, w_save, 0.0f);
  std::vector<float> emb = Expected(kEmbeddingShape, emb_save, 0.5f);
  shardckpt::ShardedState state;
  shardckpt::Status added = state.AddTensor("model.w", kF32, kWeightShape, w_save, w.data());
  if (added.ok()) added = state.AddTensor("model.emb", kF32, kEmbeddingShape, emb_save, emb.data());
  if (added.ok()) added = state.AddBlob("step", "7");
  if (!added.ok()) return Fail("save state", added);
  auto saved = shardckpt::Save(*comm, root, 7, state);
  if (!saved.ok()) return Fail("save", saved.status());

  // Load in the other layouts: "w" by rows, "emb" as flat shards.
  auto w_load = shardckpt::ChunkLayout(kWeightShape, 0, size, rank);
  auto emb_load = shardckpt::FlatShardLayout(kEmbeddingShape, size, rank);
  std::vector<float> w_back(Expected(kWeightShape, w_load, 0.0f).size(), -1.0f);
  std::vector<float> emb_back(Expected(kEmbeddingShape, emb_load, 0.5f).size(), -1.0f);
  shardckpt::ShardedState want;
  added = want.AddTensor("model.w", kF32, kWeightShape, w_load, w_back.data());
  if (added.ok())
    added = want.AddTensor("model.emb", kF32, kEmbeddingShape, emb_load, emb_back.data());
  if (!added.ok()) return Fail("load state", added);
  auto report = shardckpt::Load(*comm, root, want);
  if (!report.ok()) return Fail("load", report.status());

  int wrong = 0;
  if (w_back != Expected(kWeightShape, w_load, 0.0f)) ++wrong;
  if (emb_back != Expected(kEmbeddingShape, emb_load, 0.5f)) ++wrong;
  if (report->blobs["step"].bytes != "7") ++wrong;
  // Sums over ranks: tensor bytes handed to Save, bytes landed in the load targets, mismatches.
  double totals[3] = {double((w.size() + emb.size()) * sizeof(float)),
                      double((w_back.size() + emb_back.size()) * sizeof(float)), double(wrong)};
  if (auto s = comm->AllReduceSumDouble(totals, 3); !s.ok()) return Fail("reduce", s);
  if (rank == 0) {
    std::printf("saved %.0f bytes from %d ranks into %s\n", totals[0], size, saved->path.c_str());
    std::printf("loaded %.0f bytes resharded, %s\n", totals[1],
                totals[2] == 0 ? "every value as saved" : "VALUES DIFFER");
  }
  return totals[2] == 0 ? 0 : 1;
}
