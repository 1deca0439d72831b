// shardckpt._core: the engine as Python sees it. Deliberately thin and torch-free: a piece is a
// tuple (name, dtype name, global shape, layout, data pointer) built in Python from a tensor's
// data_ptr(), and every call returns (code name, message, value) instead of throwing, so that
// python/shardckpt/errors.py alone decides which exception class a Status becomes.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "shardckpt/collectives/communicator.h"
#include "shardckpt/collectives/mpi_communicator.h"
#include "shardckpt/collectives/mpi_deadline.h"
#include "shardckpt/collectives/preemption.h"
#include "shardckpt/engine/core/async_save.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/consolidate.h"
#include "shardckpt/engine/core/convert.h"
#include "shardckpt/engine/core/dcp_export.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/core/save_plan_cache.h"
#include "shardckpt/engine/core/staging_cache.h"
#include "shardckpt/engine/core/verify.h"
#include "shardckpt/engine/formats/dcp_read.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/log.h"

namespace py = pybind11;

namespace shardckpt {
namespace {

// (name, dtype, global shape, layout kind, a, b, data pointer); layout "replicated" ignores a and
// b, "flat" is the element range [a, b), "box" has a = offsets and b = sizes.
using PieceTuple = std::tuple<std::string, std::string, Shape, std::string, py::object, py::object,
                              uintptr_t>;
// (name, bytes, per_rank)
using BlobTuple = std::tuple<std::string, py::bytes, bool>;

// A failure Python found describing this rank's state: (code name, message), ("OK", "") if none.
using LocalError = std::pair<std::string, std::string>;

Status FromPython(const LocalError& error) {
  if (error.first == "OK") return Status::Ok();
  for (int c = 1; c <= static_cast<int>(Code::kDeadlineExceeded); ++c) {
    if (error.first == CodeName(static_cast<Code>(c))) return Status(static_cast<Code>(c), error.second);
  }
  return Status(Code::kInvalidArgument, error.second);
}

// Paths are bytes to the engine; they come back as os.fsdecode gives them (undecodable bytes
// as surrogates), so a path that is not UTF-8 can be passed back in and is no error of its own.
py::str PathText(const std::string& path) {
  PyObject* decoded = PyUnicode_DecodeFSDefaultAndSize(path.data(), static_cast<Py_ssize_t>(path.size()));
  if (decoded == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(decoded);
}

py::list PathTexts(const std::vector<std::string>& paths) {
  py::list out;
  for (const std::string& path : paths) out.append(PathText(path));
  return out;
}

// Messages are UTF-8 (tensor names) around paths' bytes: bytes that are not UTF-8 come back as
// surrogates, as os.fsdecode gives them in a UTF-8 locale.
py::str MessageText(const std::string& text) {
  PyObject* decoded = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "surrogateescape");
  if (decoded == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(decoded);
}

py::tuple Reply(const Status& status, py::object value = py::none()) {
  return py::make_tuple(CodeName(status.code()), MessageText(status.message()), std::move(value));
}

Result<Layout> ParseLayout(const std::string& kind, const py::object& a, const py::object& b) {
  if (kind == "replicated") return Layout::Whole();
  if (kind == "flat") return Layout::FlatRange(a.cast<int64_t>(), b.cast<int64_t>());
  if (kind == "box") return Layout::Box(a.cast<std::vector<int64_t>>(), b.cast<std::vector<int64_t>>());
  return InvalidArgument("unknown layout kind '" + kind + "'");
}

Status BuildState(const std::vector<PieceTuple>& pieces, const std::vector<BlobTuple>& blobs,
                  ShardedState* state) {
  for (const auto& [name, dtype_name, shape, kind, a, b, pointer] : pieces) {
    Result<DType> dtype = ParseDType(dtype_name);
    if (!dtype.ok()) return dtype.status().WithContext("tensor '" + name + "'");
    SC_ASSIGN_OR_RETURN(Layout layout, ParseLayout(kind, a, b));
    SC_RETURN_IF_ERROR(state->AddTensor(name, *dtype, shape, layout, reinterpret_cast<void*>(pointer)));
  }
  for (const auto& [name, bytes, per_rank] : blobs) {
    SC_RETURN_IF_ERROR(state->AddBlob(name, std::string(bytes),
                                      per_rank ? BlobScope::kPerRank : BlobScope::kGlobal));
  }
  return Status::Ok();
}

// The process's MPI session: made on the first world() under a launcher, finalized by
// finalize() (registered with atexit in Python), never twice.
std::mutex g_mpi_mutex;
std::unique_ptr<MpiSession> g_mpi_session;
bool g_mpi_finalized = false;

class Comm {
 public:
  explicit Comm(std::unique_ptr<Communicator> comm) : comm_(std::move(comm)) {}
  int rank() const { return comm_->rank(); }
  int size() const { return comm_->size(); }
  std::string name() const { return comm_->name(); }
  Communicator& get() { return *comm_; }
  // Kept with the communicator (which _comm.py keeps per group): a training loop's repeated
  // save() of an unchanged state description skips the gather and planning.
  SavePlanCache& plan_cache() { return plan_cache_; }

 private:
  std::unique_ptr<Communicator> comm_;
  SavePlanCache plan_cache_;
};

// A communicator whose collectives are a Python object's methods (shardckpt/_torch_comm.py:
// torch.distributed over a gloo group, for jobs launched by torchrun). The engine calls it with
// the GIL released, so each call takes it back; a Python exception becomes an Aborted status.
class PyCommunicator : public Communicator {
 public:
  explicit PyCommunicator(py::object impl) : impl_(std::move(impl)) {
    rank_ = impl_.attr("rank").cast<int>();
    size_ = impl_.attr("size").cast<int>();
    SetProcessRank(rank_);  // as the MPI communicator does: log lines and failpoints `@rank`
  }
  ~PyCommunicator() override {
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* name() const override { return "torch.distributed"; }
  // Each call takes the GIL, and Duplicate() makes a gloo group of its own, so an async save's
  // persist thread runs its collectives on that group beside the training thread's.
  bool thread_safe() const override { return true; }

  Status Barrier() override {
    return Call("barrier", [&](py::object f) { f(); });
  }
  Status Broadcast(void* data, size_t bytes, int root) override {
    return Call("broadcast", [&](py::object f) {
      f(py::memoryview::from_memory(data, static_cast<ssize_t>(bytes), false), root);
    });
  }
  Status Gather(const std::string& mine, std::vector<std::string>* all, int root) override {
    return Call("gather", [&](py::object f) {
      py::list got = f(py::bytes(mine), root);
      all->clear();
      for (py::handle item : got) all->push_back(item.cast<std::string>());
    });
  }
  Status AllGather(const std::string& mine, std::vector<std::string>* all) override {
    return Call("allgather", [&](py::object f) {
      py::list got = f(py::bytes(mine));
      all->clear();
      for (py::handle item : got) all->push_back(item.cast<std::string>());
    });
  }
  // In place: the Python side reduces a tensor over this memory (no list of Python floats each
  // way: a 20,000-tensor load's coverage check reduces 40,000 values).
  Status AllReduceMaxInt64(int64_t* values, size_t count) override {
    return Call("allreduce_max_int64", [&](py::object f) {
      f(py::memoryview::from_memory(values, static_cast<ssize_t>(count * sizeof(int64_t)), false));
    });
  }
  Status AllReduceSumDouble(double* values, size_t count) override {
    return Call("allreduce_sum_double", [&](py::object f) {
      f(py::memoryview::from_memory(values, static_cast<ssize_t>(count * sizeof(double)), false));
    });
  }
  Status AllGatherFloat(const float*, size_t, float*) override {
    return Status(Code::kUnimplemented, "AllGatherFloat over torch.distributed");
  }
  Status ReduceScatterSumFloat(const float*, float*, size_t) override {
    return Status(Code::kUnimplemented, "ReduceScatterSumFloat over torch.distributed");
  }
  Result<std::unique_ptr<Communicator>> Duplicate() override {
    std::unique_ptr<Communicator> copy;
    Status status = Call("duplicate", [&](py::object f) {
      copy = std::make_unique<PyCommunicator>(f());
    });
    if (!status.ok()) return status;
    return copy;
  }

 private:
  template <typename F>
  Status Call(const char* method, F&& body) {
    py::gil_scoped_acquire gil;
    try {
      body(impl_.attr(method));
      return Status::Ok();
    } catch (py::error_already_set& error) {
      // A shardckpt error (a collective's deadline) keeps its kind and message.
      if (py::hasattr(error.value(), "code") && py::hasattr(error.value(), "message")) {
        return FromPython({py::str(error.value().attr("code")), py::str(error.value().attr("message"))});
      }
      // The exception's type and text: what() adds Python's traceback, which named shardckpt's
      // own frames inside the error a rank reports.
      const std::string type = py::str(py::type::handle_of(error.value()).attr("__name__"));
      return Status(Code::kAborted, std::string("torch.distributed ") + method + ": " + type + ": " +
                                        std::string(py::str(error.value())));
    } catch (const std::exception& error) {
      return Status(Code::kAborted, std::string("torch.distributed ") + method + ": " + error.what());
    }
  }

  py::object impl_;
  int rank_ = 0;
  int size_ = 1;
};

// MPI initialized (at MPI_THREAD_MULTIPLE, unless the program or mpi4py did it already) and not
// finalized. Called with g_mpi_mutex held.
Status EnsureMpiSession() {
  if (g_mpi_finalized) return FailedPrecondition("MPI was finalized already");
  if (g_mpi_session) return Status::Ok();
  Result<std::unique_ptr<MpiSession>> session = MpiSession::Init(nullptr, nullptr);
  if (!session.ok()) return session.status();
  g_mpi_session = std::move(session).value();
  return Status::Ok();
}

py::tuple MpiWorld() {
  std::lock_guard<std::mutex> lock(g_mpi_mutex);
  Status ready = EnsureMpiSession();
  if (!ready.ok()) return Reply(ready);
  Result<std::unique_ptr<Communicator>> comm = CreateMpiCommunicator(MPI_COMM_WORLD);
  if (!comm.ok()) return Reply(comm.status());
  return Reply(Status::Ok(), py::cast(std::make_unique<Comm>(std::move(comm).value())));
}

// A communicator over an MPI_Comm the program made (an mpi4py communicator: its Fortran handle,
// which MPI_Comm_f2c maps back whatever MPI_Comm is in this MPI). MPI is initialized at
// MPI_THREAD_MULTIPLE here when nobody did yet; when mpi4py did, its thread level stands and
// async_save says plainly if it is too low.
py::tuple MpiComm(int64_t fortran_handle) {
  std::lock_guard<std::mutex> lock(g_mpi_mutex);
  Status ready = EnsureMpiSession();
  if (!ready.ok()) return Reply(ready);
  MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(fortran_handle));
  if (comm == MPI_COMM_NULL) return Reply(InvalidArgument("the MPI communicator is MPI_COMM_NULL"));
  Result<std::unique_ptr<Communicator>> made = CreateMpiCommunicator(comm);
  if (!made.ok()) return Reply(made.status());
  return Reply(Status::Ok(), py::cast(std::make_unique<Comm>(std::move(made).value())));
}

int MpiThreadLevel() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) return -1;
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided == MPI_THREAD_MULTIPLE ? 3 : provided == MPI_THREAD_SERIALIZED ? 2
         : provided == MPI_THREAD_FUNNELED ? 1 : 0;
}

void MpiFinalize() {
  std::lock_guard<std::mutex> lock(g_mpi_mutex);
  g_mpi_session.reset();
  g_mpi_finalized = true;
}

// {phase: seconds}, in the engine's order (Python dicts keep it).
py::dict PhaseDict(const std::vector<PhaseTime>& phases) {
  py::dict out;
  for (const PhaseTime& phase : phases) out[py::str(phase.name)] = phase.seconds;
  return out;
}

// Retention and provenance, as save() and async_save() take them.
SaveOptions SaveOptionsFrom(int keep_last, int keep_best, const std::string& best_metric,
                            bool best_higher_is_better,
                            const std::map<std::string, std::string>& user_metadata,
                            const std::string& state_paths, const std::string& torch_version) {
  SaveOptions options;
  options.state_paths = state_paths;
  options.keep_last = keep_last;
  options.keep_best = keep_best;
  options.best_metric = best_metric;
  options.best_higher_is_better = best_higher_is_better;
  options.user_metadata = user_metadata;
  options.torch_version = torch_version;
  return options;
}

py::tuple SaveCall(Comm& comm, const std::string& root, int64_t step,
                   const std::vector<PieceTuple>& pieces, const std::vector<BlobTuple>& blobs,
                   int keep_last, int keep_best, const std::string& best_metric,
                   bool best_higher_is_better, const std::map<std::string, double>& metrics,
                   const std::map<std::string, std::string>& user_metadata, const std::string& state_paths,
                   const std::string& torch_version, const LocalError& error) {
  ShardedState state;
  Status built = FromPython(error);
  if (built.ok()) built = BuildState(pieces, blobs, &state);
  SaveOptions options = SaveOptionsFrom(keep_last, keep_best, best_metric, best_higher_is_better,
                                        user_metadata, state_paths, torch_version);
  options.metrics = metrics;
  options.plan_cache = &comm.plan_cache();
  const uint64_t reused_before = comm.plan_cache().plans_reused;
  Result<SaveResult> saved = Status(Code::kInternal, "not run");
  {
    py::gil_scoped_release release;
    // A piece one rank cannot describe fails the save on every rank, not at the deadline.
    Status agreed = AgreeOnStatus(comm.get(), built);
    saved = agreed.ok() ? Save(comm.get(), root, step, state, options) : Result<SaveResult>(agreed);
  }
  if (!saved.ok()) return Reply(saved.status());
  py::dict out;
  out["path"] = PathText(saved->path);
  out["bytes_written"] = saved->bytes_written;
  out["total_bytes"] = saved->total_bytes;
  out["plan_reused"] = comm.plan_cache().plans_reused > reused_before;
  out["phases"] = PhaseDict(saved->phases);
  return Reply(Status::Ok(), out);
}

py::tuple LoadCall(Comm& comm, const std::string& path, const std::vector<PieceTuple>& pieces,
                   bool strict, const std::string& strip_prefix, bool verify_checksums,
                   const LocalError& error, const std::vector<std::string>& wanted_values,
                   const std::vector<std::vector<std::string>>& wanted_value_leaves,
                   const std::string& replicated_reads, const std::string& manifest_sharing,
                   std::optional<uint64_t> read_ahead_max_bytes,
                   const std::vector<std::string>& wanted_values_dcp_stores_nothing_of) {
  ShardedState state;
  LoadOptions options;
  Status built = FromPython(error);
  if (built.ok()) {  // a bad choice is refused on every rank, like any other bad argument
    Result<ReplicatedReads> replicated = ParseReplicatedReads(replicated_reads);
    Result<ManifestSharing> sharing = ParseManifestSharing(manifest_sharing);
    built = !replicated.ok() ? replicated.status() : sharing.status();
    if (built.ok()) {
      options.replicated_reads = *replicated;
      options.manifest_sharing = *sharing;
    }
  }
  if (read_ahead_max_bytes.has_value()) options.read_ahead_max_bytes = *read_ahead_max_bytes;
  if (built.ok()) built = BuildState(pieces, {}, &state);
  options.strict = strict;
  options.wanted_values = wanted_values;
  options.wanted_value_leaves = wanted_value_leaves;
  options.wanted_values_dcp_stores_nothing_of = wanted_values_dcp_stores_nothing_of;
  options.verify_checksums = verify_checksums;
  if (!strip_prefix.empty()) options.rename = StripPrefix(strip_prefix);
  Result<LoadReport> loaded = Status(Code::kInternal, "not run");
  {
    py::gil_scoped_release release;
    Status agreed = AgreeOnStatus(comm.get(), built);
    loaded = agreed.ok() ? Load(comm.get(), path, state, options) : Result<LoadReport>(agreed);
  }
  if (!loaded.ok()) return Reply(loaded.status());
  const LoadReport& report = *loaded;
  py::dict out;
  out["path"] = PathText(report.path);
  out["step"] = report.step;
  out["saved_world_size"] = report.saved_world_size;
  out["missing"] = report.missing;
  out["unexpected"] = report.unexpected;
  out["values_loaded_elsewhere"] = report.values_loaded_elsewhere;
  out["loaded_in_part"] = report.loaded_in_part;
  py::dict blobs;
  for (const auto& [name, blob] : report.blobs) {
    // A DCP byte item's bytes object, tagged as the package tags bytes: untagged bytes that
    // began with another tag would be read as that.
    py::bytes data = blob.python_bytes ? py::bytes(std::string("\0B", 2) + blob.bytes) : py::bytes(blob.bytes);
    blobs[py::str(name)] = py::make_tuple(blob.available, data, blob.reason);
  }
  out["blobs"] = blobs;
  out["bytes_wanted"] = report.bytes_wanted;
  out["bytes_read"] = report.stats.data_bytes_read;
  out["bytes_received"] = report.bytes_received;
  out["bytes_read_ahead"] = report.stats.bytes_read_ahead;
  out["every_rank_parsed_manifest"] = report.every_rank_parsed_manifest;
  out["phases"] = PhaseDict(report.phases);
  return Reply(Status::Ok(), out);
}

py::tuple AgreeCall(Comm& comm, const std::string& code, const std::string& message) {
  Status local = FromPython({code, message});
  Status agreed;
  {
    py::gil_scoped_release release;
    agreed = AgreeOnStatus(comm.get(), local);
  }
  return Reply(agreed);
}

// ---- Preemption (collectives/preemption.h): the signals only set a flag; every rank asks, once
// per step, whether any rank was asked to stop, and all get the same answer.
struct Watcher {
  std::unique_ptr<PreemptionWatcher> watcher;
};

py::tuple InstallWatcherCall(const std::vector<int>& signals) {
  Result<std::unique_ptr<PreemptionWatcher>> installed = PreemptionWatcher::Install(signals);
  if (!installed.ok()) return Reply(installed.status());
  auto out = std::make_unique<Watcher>();
  out->watcher = std::move(installed).value();
  return Reply(Status::Ok(), py::cast(std::move(out)));
}

// (requested, signal name or "", first rank, seconds since the first reception).
py::tuple ShouldStopCall(Watcher& w, Comm& comm) {
  if (!w.watcher) return Reply(FailedPrecondition("the preemption watcher was closed"));
  Result<StopRequest> stop = Status(Code::kInternal, "not run");
  {
    py::gil_scoped_release release;  // over torch.distributed the all-reduce calls back into Python
    stop = w.watcher->ShouldStop(comm.get());
  }
  if (!stop.ok()) return Reply(stop.status());
  return Reply(Status::Ok(), py::make_tuple(stop->requested, stop->requested ? SignalName(stop->signal) : std::string(),
                                            stop->first_rank, stop->seconds_since));
}

// ---- Async save: one AsyncSaver per communicator (Python keeps it on the Comm), so staging is
// reused by every later save. The pieces' memory is only read during Save (the snapshot).
class Saver {
 public:
  // Ending the saver waits for its persist in flight, whose collectives over a torch.distributed
  // group call back into Python: holding the GIL here (Python drops the saver at exit, or after
  // an exception left the save unwaited) deadlocked the process. The saver ends before
  // `started`, which its copy may still read.
  ~Saver() { Close(); }
  void Close() {
    if (saver == nullptr) return;
    py::gil_scoped_release release;
    saver.reset();
  }
  // StartSave's state: its copy reads it in the background, so it lives here until the next
  // StartSave (which waits for that copy first). The tensors it points to are kept alive by the
  // Python handle until fence().
  ShardedState started;
  std::unique_ptr<AsyncSaver> saver;
};

class Handle {
 public:
  std::shared_ptr<SaveHandle> handle;
  py::tuple Wait() {
    Status s;
    {
      py::gil_scoped_release release;
      s = handle->Wait();
    }
    return Reply(s);
  }
  bool Done() const { return handle->Done(); }
  int64_t step() const { return handle->step(); }
};

// Retention and provenance are the saver's (every save it runs applies them).
py::tuple CreateSaverCall(Comm& comm, int keep_last, int keep_best, const std::string& best_metric,
                          bool best_higher_is_better,
                          const std::map<std::string, std::string>& user_metadata,
                          const std::string& state_paths, const std::string& torch_version) {
  SaveOptions options = SaveOptionsFrom(keep_last, keep_best, best_metric, best_higher_is_better,
                                        user_metadata, state_paths, torch_version);
  Result<std::unique_ptr<AsyncSaver>> made = Status(Code::kInternal, "not run");
  {
    py::gil_scoped_release release;
    made = AsyncSaver::Create(comm.get(), options);
  }
  if (!made.ok()) return Reply(made.status());
  auto saver = std::make_unique<Saver>();
  saver->saver = std::move(made).value();
  return Reply(Status::Ok(), py::cast(std::move(saver)));
}

py::tuple AsyncSaveCall(Comm& comm, Saver& saver, const std::string& root, int64_t step,
                        const std::vector<PieceTuple>& pieces, const std::vector<BlobTuple>& blobs,
                        const std::map<std::string, double>& metrics, const LocalError& error) {
  ShardedState state;
  Status built = FromPython(error);
  if (built.ok()) built = BuildState(pieces, blobs, &state);
  Result<std::shared_ptr<SaveHandle>> handle = Status(Code::kInternal, "not run");
  {
    py::gil_scoped_release release;
    Status agreed = AgreeOnStatus(comm.get(), built);
    handle = agreed.ok() ? saver.saver->Save(root, step, state, metrics)
                         : Result<std::shared_ptr<SaveHandle>>(agreed);
  }
  if (!handle.ok()) return Reply(handle.status());
  auto out = std::make_unique<Handle>();
  out->handle = std::move(handle).value();
  return Reply(Status::Ok(), py::cast(std::move(out)));
}

// Copy while training: returns before the snapshot copy; saver_fence waits for it.
py::tuple StartSaveCall(Comm& comm, Saver& saver, const std::string& root, int64_t step,
                        const std::vector<PieceTuple>& pieces, const std::vector<BlobTuple>& blobs,
                        const std::map<std::string, double>& metrics, const LocalError& error) {
  {
    py::gil_scoped_release release;
    saver.saver->Wait().IgnoreError();  // the previous copy may still read `started`
  }
  saver.started = ShardedState();
  Status built = FromPython(error);
  if (built.ok()) built = BuildState(pieces, blobs, &saver.started);
  Result<std::shared_ptr<SaveHandle>> handle = Status(Code::kInternal, "not run");
  {
    py::gil_scoped_release release;
    Status agreed = AgreeOnStatus(comm.get(), built);
    handle = agreed.ok() ? saver.saver->StartSave(root, step, saver.started, metrics)
                         : Result<std::shared_ptr<SaveHandle>>(agreed);
  }
  if (!handle.ok()) return Reply(handle.status());
  auto out = std::make_unique<Handle>();
  out->handle = std::move(handle).value();
  return Reply(Status::Ok(), py::cast(std::move(out)));
}

// ---- The command line's verbs (tools/shardckpt_main.cc), single process.
py::tuple InspectCall(const std::string& path) {
  Result<CheckpointHold> hold = HoldCheckpoint(path);
  if (!hold.ok()) return Reply(hold.status());
  Result<Manifest> m = ReadManifest(hold->dir());
  if (!m.ok()) return Reply(m.status());
  py::list entries;
  uint64_t total = 0;
  for (const EntryRecord& e : m->entries) {
    uint64_t bytes = static_cast<uint64_t>(NumBytes(e.shape, DTypeSize(e.dtype)).value());
    total += bytes;
    py::dict d;
    d["name"] = e.name;
    d["dtype"] = DTypeName(e.dtype);
    d["shape"] = e.shape;
    d["bytes"] = bytes;
    d["chunks"] = e.chunks.size();
    entries.append(d);
  }
  // A DCP folder's byte items say whether they hold plain values, as `inspect --json` does.
  const bool dcp = BuiltFromDcpFolder(*m);
  Result<std::map<std::string, std::string>> opaque = DcpOpaqueByteItems(hold->dir(), *m);
  if (!opaque.ok()) return Reply(opaque.status());
  py::list blobs;
  for (const BlobRecord& b : m->blobs) {
    py::dict d;
    d["name"] = b.name;
    d["scope"] = b.scope == BlobScope::kGlobal ? "global" : "per_rank";
    d["rank"] = b.rank;
    d["bytes"] = b.bytes;
    if (dcp) d["plain"] = !opaque->count(b.name);
    if (auto why = opaque->find(b.name); why != opaque->end()) d["not_plain_because"] = why->second;
    blobs.append(d);
  }
  uint64_t file_bytes = 0;
  for (const FileRecord& f : m->files) file_bytes += f.size;
  py::dict out;
  out["checkpoint"] = PathText(hold->dir());
  out["format_version"] = std::to_string(m->format_major) + "." + std::to_string(m->format_minor);
  out["step"] = m->step;
  out["world_size"] = m->world_size;
  py::dict created;
  created["time"] = m->created.time;
  created["shardckpt_version"] = m->created.shardckpt_version;
  created["torch_version"] = m->created.torch_version;
  created["hosts"] = m->created.hosts;
  created["git_commit"] = m->created.git_commit;
  created["user"] = m->created.user;
  out["created"] = created;
  out["metrics"] = m->metrics;
  out["entries"] = entries;
  out["blobs"] = blobs;
  out["tensor_bytes"] = total;
  out["files"] = m->files.size();
  out["file_bytes"] = file_bytes;
  return Reply(Status::Ok(), out);
}

py::tuple VerifyCall(const std::string& path) {
  Result<VerifyReport> r = Status(Code::kInternal, "not run");
  {
    py::gil_scoped_release release;
    r = VerifyCheckpoint(path);
  }
  if (!r.ok()) return Reply(r.status());
  py::list problems;
  for (const VerifyProblem& p : r->problems) {
    problems.append(
        py::make_tuple(PathText(p.file), p.offset, p.entries, p.blobs, MessageText(p.what), HoldersText(p), p.unreadable));
  }
  py::dict out;
  out["checkpoint"] = PathText(r->checkpoint);
  out["files"] = r->files;
  out["bytes_checked"] = r->bytes_checked;
  out["blocks_checked"] = r->blocks_checked;
  out["problems"] = problems;
  out["checksums"] = r->checksums;  // false for a DCP folder: structure only, `note` says so
  out["note"] = r->note;
  return Reply(Status::Ok(), out);
}

// Every output format of consolidate (.pt, safetensors, GGUF) reports the same way.
py::tuple RunConsolidate(const std::string& path, const std::string& out_file, const ConsolidateOptions& options) {
  Result<ConsolidateReport> r = Status(Code::kInternal, "not run");
  {
    py::gil_scoped_release release;
    r = Consolidate(path, out_file, options);
  }
  if (!r.ok()) return Reply(r.status());
  py::dict out;
  out["checkpoint"] = PathText(r->checkpoint);
  out["files"] = PathTexts(r->files);
  out["sha256"] = r->sha256;
  out["entries"] = r->entries;
  out["tensor_bytes"] = r->tensor_bytes;
  out["bytes_read"] = r->bytes_read;
  out["aliases"] = r->aliases;
  out["values"] = r->values;
  out["skipped"] = r->skipped;
  return Reply(Status::Ok(), out);
}

py::tuple ConsolidateCall(const std::string& path, const std::string& out_file, const std::string& format,
                          const std::vector<std::string>& include, const std::vector<std::string>& exclude,
                          const std::string& strip_prefix, const std::string& dtype, uint64_t max_shard_bytes) {
  ConsolidateOptions options;
  if (format.empty()) {
    Result<ExportFormat> f = FormatFromPath(out_file);
    if (!f.ok()) return Reply(f.status());
    options.format = *f;
  } else if (format == "torch" || format == "safetensors") {
    options.format = format == "torch" ? ExportFormat::kTorch : ExportFormat::kSafetensors;
  } else {
    return Reply(InvalidArgument("format must be 'torch', 'safetensors' or 'gguf', not '" + format + "'"));
  }
  options.include = include;
  options.exclude = exclude;
  options.strip_prefix = strip_prefix;
  if (!dtype.empty()) {
    Result<DType> cast = ParseCastDType(dtype);
    if (!cast.ok()) return Reply(cast.status());
    options.cast = *cast;
  }
  if (max_shard_bytes != 0) {
    if (options.format != ExportFormat::kSafetensors) {
      return Reply(InvalidArgument("max_shard_bytes applies to safetensors output"));
    }
    options.max_shard_bytes = max_shard_bytes;
  }
  return RunConsolidate(path, out_file, options);
}

py::tuple ConvertCall(bool import, const std::string& input, const std::string& root, int world_size,
                      const std::string& layout) {
  if (world_size < 1) return Reply(InvalidArgument("world_size must be at least 1"));
  ConvertOptions options;
  options.world_size = world_size;
  options.layout = layout;
  Result<ConvertReport> r = Status(Code::kInternal, "not run");
  {
    py::gil_scoped_release release;
    r = import ? ImportFile(input, root, options) : Reshard(input, root, options);
  }
  if (!r.ok()) return Reply(r.status());
  // The keys of `shardckpt import|reshard --json` ("path" and "bytes" as before): a script moves
  // between the two without renaming them.
  py::dict out;
  out["path"] = PathText(r->path);
  out["checkpoint"] = PathText(r->path);
  out["out"] = PathText(r->path);
  out["source"] = PathText(input);
  int64_t step = 0;
  out["step"] = ParseStepDirName(BaseName(r->path), &step) ? py::object(py::int_(step)) : py::object(py::none());
  out["tensors"] = r->tensors;
  out["bytes"] = r->bytes;
  out["tensor_bytes"] = r->bytes;
  out["world_size"] = world_size;
  out["layout"] = layout;
  out["values"] = r->values;
  out["skipped"] = r->skipped;
  return Reply(Status::Ok(), out);
}

}  // namespace
}  // namespace shardckpt

// ---- export (engine/core/dcp_export.h)
namespace shardckpt {
namespace {

py::tuple ExportCall(const std::string& path, const std::string& out, const std::string& format, uint64_t window_bytes) {
  if (format != "dcp") return Reply(InvalidArgument("format must be 'dcp', not '" + format + "'"));
  if (window_bytes == 0) return Reply(InvalidArgument("window_bytes must be at least 1"));
  DcpExportOptions options;
  options.window_bytes = window_bytes;
  Result<DcpExportReport> r = Status(Code::kInternal, "not run");
  {
    py::gil_scoped_release release;
    r = ExportDcp(path, out, options);
  }
  if (!r.ok()) return Reply(r.status());
  py::dict d;
  d["checkpoint"] = PathText(r->checkpoint);
  d["out"] = PathText(r->out);
  d["files"] = PathTexts(r->files);
  d["tensors"] = r->tensors;
  d["chunks"] = r->chunks;
  d["byte_items"] = r->byte_items;
  d["tensor_bytes"] = r->tensor_bytes;
  d["bytes_read"] = r->bytes_read;
  d["skipped"] = r->skipped;
  return Reply(Status::Ok(), d);
}

// GGUF output (engine/formats/gguf_writer.h): `metadata_json` is a JSON object of the other keys.
py::tuple ConsolidateGgufCall(const std::string& path, const std::string& out, const std::string& architecture,
                              const std::string& name, const std::string& metadata_json,
                              const std::vector<std::string>& include, const std::vector<std::string>& exclude,
                              const std::string& strip_prefix, const std::string& dtype) {
  Result<std::vector<GgufKeyValue>> others = ParseGgufMetadataJson(metadata_json, "metadata");
  if (!others.ok()) return Reply(others.status());
  ConsolidateOptions options;
  options.format = ExportFormat::kGguf;
  options.gguf_metadata = GgufMetadataWith(architecture, name, *others);
  options.include = include;
  options.exclude = exclude;
  options.strip_prefix = strip_prefix;
  if (!dtype.empty()) {
    Result<DType> cast = ParseCastDType(dtype);
    if (!cast.ok()) return Reply(cast.status());
    options.cast = *cast;
  }
  return RunConsolidate(path, out, options);
}

}  // namespace
}  // namespace shardckpt

PYBIND11_MODULE(_core, m) {
  using namespace shardckpt;
  m.doc() = "shardckpt engine bindings (internal: use the shardckpt package)";
  py::class_<Comm>(m, "Comm")
      .def_property_readonly("rank", &Comm::rank)
      .def_property_readonly("size", &Comm::size)
      .def_property_readonly("name", &Comm::name)
      .def("agree", &AgreeCall, py::arg("code"), py::arg("message"),
           "Collective: every rank gets (code, message, None) naming every failing rank.");
  m.def("single", [] { return std::make_unique<Comm>(CreateSingleProcessCommunicator()); });
  m.def("mpi_world", &MpiWorld);
  m.def("python_comm", [](py::object impl) {
    return std::make_unique<Comm>(std::make_unique<PyCommunicator>(std::move(impl)));
  });
  m.def("mpi_comm", &MpiComm, "A Comm over an MPI communicator given by its Fortran handle.");
  m.def("mpi_thread_level", &MpiThreadLevel,
        "-1 before MPI_Init, else 0 single, 1 funneled, 2 serialized, 3 multiple.");
  m.def("mpi_finalize", &MpiFinalize);
  m.def("save", &SaveCall);
  m.def("load", &LoadCall);
  m.def("log_error", [](const std::string& message) { LogMessage(LogLevel::kError, message); },
        "Logs an error through the library's logger (SHARDCKPT_LOG).");
  m.def("collective_timeout_s", [] { return CollectiveDeadline::FromEnvironment().timeout_s; },
        "SHARDCKPT_COLLECTIVE_TIMEOUT_S as the MPI path reads it (a value it ignores is logged once).");
  m.def("release_staging", [] { ReleaseSpareStaging(); },
        "Frees the staging memory kept between saves and loads of this process.");
  py::class_<Saver>(m, "AsyncSaver");
  py::class_<Handle>(m, "SaveHandle")
      .def("wait", &Handle::Wait)
      .def("done", &Handle::Done)
      .def_property_readonly("step", &Handle::step);
  py::class_<Watcher>(m, "PreemptionWatcher");
  m.def("install_watcher", &InstallWatcherCall);
  m.def("watcher_should_stop", &ShouldStopCall);
  m.def("watcher_request_stop", [](Watcher& w, int signal) {
    if (w.watcher) w.watcher->RequestStop(signal);
  });
  m.def("watcher_close", [](Watcher& w, bool ignore_late_signals) {
    if (w.watcher && ignore_late_signals) w.watcher->IgnoreLateSignals();
    w.watcher.reset();  // the previous handlers come back, or SIG_IGN stays
  });
  m.def("create_saver", &CreateSaverCall);
  m.def("saver_wait", [](Saver& saver) {
    Status s;
    {
      py::gil_scoped_release release;
      s = saver.saver->Wait();
    }
    return Reply(s);
  });
  m.def("saver_set_options", [](Saver& saver, int keep_last, int keep_best, const std::string& best_metric,
                                 bool best_higher_is_better, const std::map<std::string, std::string>& user_metadata,
                                 const std::string& state_paths) {
    saver.saver->SetRetentionAndMetadata(
        SaveOptionsFrom(keep_last, keep_best, best_metric, best_higher_is_better, user_metadata, state_paths, ""));
  });
  m.def("async_save", &AsyncSaveCall);
  m.def("start_save", &StartSaveCall);
  m.def("saver_fence", [](Saver& saver) {
    Status s;
    {
      py::gil_scoped_release release;
      s = saver.saver->Fence();
    }
    return Reply(s, py::float_(saver.saver->last_fence_seconds()));
  });
  m.def("inspect", &InspectCall);
  m.def("verify", &VerifyCall);
  m.def("consolidate", &ConsolidateCall);
  m.def("convert", &ConvertCall);
  // Tests: arms io/failpoint.h's failpoints in this process ("" disarms them all).
  m.def("set_failpoints", [](const std::string& spec) { return Reply(SetFailpoints(spec)); });
  m.def("dtypes", [] {
    std::vector<std::string> names;
    for (int d = 0; d < kNumDTypes; ++d) names.push_back(DTypeName(static_cast<DType>(d)));
    return names;
  });
  m.def("export", &ExportCall);
  m.def("consolidate_gguf", &ConsolidateGgufCall);
  // A training script's check of its save root before it makes the folder and trains: refused
  // where a save would refuse it (inside a checkpoint, named as a root's checkpoint folder).
  m.def("check_save_root", [](const std::string& root) {
    Status refused = RefuseOutputInCheckpoints(root);
    return Reply(refused.ok() ? CheckLatestIsNoFolder(root) : refused);
  });
  // A trainer's saves after step `after` up to `last`, every `every` steps and the last: a step
  // folder in their way (someone's files), found before training (CheckPlannedStepFolders).
  m.def("check_planned_step_folders", [](const std::string& root, int64_t after, int64_t last, int64_t every) {
    return Reply(CheckPlannedStepFolders(root, [&](int64_t s) {
      return every > 0 && s > after && s <= last && (s % every == 0 || s == last);
    }));
  });
}
