// shardckpt-train: the demo training job. A fully sharded MLP (see fsdp_mlp.h) trained on a
// deterministic synthetic stream under mpirun, checkpointing its whole training state with
// shardckpt and resuming from it, at the same world size bit for bit, or at another one.
//
//   mpirun -np 4 build/bin/shardckpt-train --ckpt /tmp/run --steps 30 --save-every 10
//   mpirun -np 2 build/bin/shardckpt-train --ckpt /tmp/run --steps 40 --resume
//
// What a checkpoint holds: the flat-sharded parameters and AdamW moments, the optimizer step,
// the scheduler state, the step and data position (global blob "trainer"), the dropout stream
// (global blob "rng.dropout": identical on every rank, see fsdp_mlp.h), each rank's own torch
// default generator (per-rank blob "rng": what per-rank user code such as augmentation draws
// from), and the run's configuration (global blob "config").
//
// RNG policy across world sizes: the dropout stream is world-size independent and always
// restored. A per-rank generator belongs to a rank of the saving job: when the world size
// changes those blobs come back unavailable (never invented, never reassigned: rank 3's stream
// of a 4-rank job has no owner in a 2-rank job), and every rank of the new job seeds its own from
// (seed, rank, resumed step), deterministically, and says so.
//
// Preemption: SIGTERM or SIGUSR1 (from the scheduler, or launch/mpirun.sh forwarding them) only
// sets a flag; after every step the ranks agree on it (collectives/preemption.h), so all of them
// stop after the same step, wait for an async persist in flight, save that step synchronously
// if it can finish within --preempt-grace-s, and exit with the status listed in --help.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <torch/torch.h>

#include <boost/program_options.hpp>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "shardckpt/collectives/mpi_communicator.h"
#include "shardckpt/collectives/preemption.h"
#ifdef SHARDCKPT_HAVE_NCCL
#include "shardckpt/collectives/nccl_communicator.h"
#endif
#include "shardckpt/engine/core/async_save.h"
#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/commit.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/save.h"
#include "shardckpt/engine/core/save_plan_cache.h"
#include "shardckpt/engine/torch/torch_adapter.h"
#include "shardckpt/io/failpoint.h"
#include "shardckpt/io/fs.h"
#include "launch/train/fsdp_mlp.h"

using namespace shardckpt;
using namespace shardckpt::train;
namespace po = boost::program_options;

namespace {

// Exit statuses (also in --help and the README). 75 is sysexits' EX_TEMPFAIL: "try again later".
constexpr int kExitOk = 0;              // all steps done, or stopped on request with a final checkpoint
constexpr int kExitError = 1;           // a step, save or load failed (the message names rank and cause)
constexpr int kExitPreemptedUnsaved = 75;  // stopped on request without a final checkpoint
constexpr char kExitStatusHelp[] =
    "Exit status (the same on every rank):\n"
    "   0  all steps done; or stopped on SIGTERM/SIGUSR1 after a final checkpoint of the step every\n"
    "      rank stopped at (resume with --resume)\n"
    "   1  an error: a step, save or load failed (the message names the rank and cause)\n"
    "   2  bad command line, or --device cannot run here\n"
    "   3  a collective timed out (SHARDCKPT_COLLECTIVE_TIMEOUT_S) and the job was aborted\n"
    "  75  stopped on SIGTERM/SIGUSR1 without a final checkpoint: a save could not finish within\n"
    "      --preempt-grace-s (or there is no --ckpt); --resume continues from the last committed\n"
    "      checkpoint, which the log names\n";

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Config {
  std::string ckpt;
  int64_t steps = 30, save_every = 0, global_batch = 48, features = 128, hidden = 1024, classes = 16;
  uint64_t seed = 1234;
  double dropout = 0.1;
  double preempt_grace_s = 60;
  int keep_last = 3, keep_best = 0;
  bool resume = false, resume_weights_only = false, async_save = false, copy_while_training = false;
  std::string device = "cpu";
  std::string dump_params;
  std::string resume_from;  // a checkpoint folder or root to resume from instead of --ckpt
  AdamWConfig adamw;

  SaveOptions SaveOptionsFor() const {
    SaveOptions options;
    options.keep_last = keep_last;
    options.keep_best = keep_best;
    options.best_metric = "loss";
    options.torch_version = TorchVersion();
    options.user_metadata["job"] = "shardckpt-train";  // sync and async saves alike
    return options;
  }

  nlohmann::json ToJson() const {
    return {{"global_batch", global_batch}, {"features", features}, {"hidden", hidden}, {"classes", classes},
            {"seed", seed}, {"dropout", dropout}, {"peak_lr", adamw.peak_lr}, {"warmup_steps", adamw.warmup_steps},
            {"horizon_steps", adamw.horizon_steps}};
  }
};

// Every flag's range, checked before training starts: out of range, libtorch aborted the ranks
// (a negative width, a dropout above 1), a zero batch trained on NaN, and a bad retention count
// or a --ckpt that is a file failed only at the first save.
Status ValidateConfig(const Config& c) {
  auto at_least = [](const char* flag, double value, double least) {
    return value >= least ? Status::Ok()
                          : InvalidArgument(std::string(flag) + " must be at least " + std::to_string(static_cast<int64_t>(least)) +
                                            ", not " + std::to_string(static_cast<int64_t>(value)));
  };
  SC_RETURN_IF_ERROR(at_least("--steps", static_cast<double>(c.steps), 0));
  SC_RETURN_IF_ERROR(at_least("--save-every", static_cast<double>(c.save_every), 0));
  SC_RETURN_IF_ERROR(at_least("--keep-last", c.keep_last, 0));
  SC_RETURN_IF_ERROR(at_least("--keep-best", c.keep_best, 0));
  SC_RETURN_IF_ERROR(at_least("--global-batch", static_cast<double>(c.global_batch), 1));
  SC_RETURN_IF_ERROR(at_least("--hidden", static_cast<double>(c.hidden), 1));
  auto text = [](double value) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", value);
    return std::string(buf);
  };
  if (!(c.dropout >= 0 && c.dropout < 1)) return InvalidArgument("--dropout must be a probability in [0, 1), not " + text(c.dropout));
  if (!(c.preempt_grace_s >= 0)) return InvalidArgument("--preempt-grace-s must be seconds >= 0, not " + text(c.preempt_grace_s));
  if (c.copy_while_training && !c.async_save) return InvalidArgument("--copy-while-training needs --async-save");
  if (!c.ckpt.empty() && PathExists(c.ckpt) && !IsDirectory(c.ckpt)) {
    return InvalidArgument("--ckpt " + c.ckpt + " is a file, not a folder to save checkpoints in");
  }
  return Status::Ok();
}

std::string GeneratorState(at::Generator& gen) {
  at::Tensor state = gen.get_state();
  return std::string(static_cast<const char*>(state.data_ptr()), state.numel());
}

Status SetGeneratorState(at::Generator& gen, const BlobResult& blob, const std::string& name) {
  if (!blob.available) return NotFound(blob.reason.empty() ? "the checkpoint holds no '" + name + "' blob" : blob.reason);
  at::Tensor state = at::empty({static_cast<int64_t>(blob.bytes.size())}, at::kByte);
  std::memcpy(state.data_ptr(), blob.bytes.data(), blob.bytes.size());
  try {
    gen.set_state(state);
  } catch (const std::exception& e) {  // c10::Error: not a generator's state of this libtorch
    return DataLoss("blob '" + name + "' is not a CPU generator's state (" + std::to_string(blob.bytes.size()) + " bytes)");
  }
  return Status::Ok();
}

// The blob of that name, or one that is unavailable with no reason when the checkpoint has none.
const BlobResult& BlobNamed(const LoadReport& report, const std::string& name) {
  static const BlobResult kAbsent{};
  auto it = report.blobs.find(name);
  return it == report.blobs.end() ? kAbsent : it->second;
}

// The trainer's own blobs, checked before use: a checkpoint another program wrote (a DCP
// folder from dcp.save, a `shardckpt reshard` output) may lack them or hold something else.
// The same on every rank: they are global blobs, and the per-rank one falls back to a seed.
Result<int64_t> RestoreTrainerBlobs(const LoadReport& report, at::Generator& dropout) {
  const BlobResult& trainer = BlobNamed(report, "trainer");
  if (!trainer.available) {
    return NotFound("no 'trainer' blob (the step and data position shardckpt-train saves)" +
                    (trainer.reason.empty() ? std::string() : " (" + trainer.reason + ")") +
                    ": resume from a checkpoint shardckpt-train wrote, or with --resume-weights-only");
  }
  const nlohmann::json state = nlohmann::json::parse(trainer.bytes, nullptr, false);
  if (!state.is_object() || !state.contains("step") || !state["step"].is_number_integer() || state["step"].get<int64_t>() < 0) {
    return DataLoss("blob 'trainer' is not shardckpt-train's state (a JSON object with a whole 'step')");
  }
  SC_RETURN_IF_ERROR(SetGeneratorState(dropout, BlobNamed(report, "rng.dropout"), "rng.dropout"));
  return state["step"].get<int64_t>();
}

// A run that does not resume saves into a root with no checkpoint: one holding another run's
// (or this run's, with --resume forgotten) trained until its first save and failed there, or
// with a later step mixed a new run into the old one and retention deleted the old checkpoints.
Status CheckFreshRoot(const std::string& root) {
  SC_RETURN_IF_ERROR(RefuseCheckpointAsRoot(root, "save into"));
  // Listed, not resolved: a root whose resolution fails (a newer step folder that cannot be
  // reached) still holds checkpoints, and retention would delete them.
  // One listing: its committed folders, or a step folder that cannot be reached now.
  std::vector<std::pair<int64_t, std::string>> without_manifest;
  Result<std::vector<std::pair<int64_t, std::string>>> committed = ListCommitted(root, &without_manifest);
  if (!committed.ok()) return Status::Ok();  // no root yet
  const std::string newest = !committed->empty() ? committed->back().second
                                                 : UnreachableNewerThan(root, without_manifest, INT64_MIN).first;
  if (newest.empty()) return Status::Ok();  // nothing committed
  return Status(Code::kAlreadyExists, root + " already holds checkpoints (the newest " + newest +
                                          "): add --resume to continue from it, or give a new --ckpt for a new run");
}

// Found before training, not at the first save: a read-only or foreign root.
Status CheckWritable(const std::string& root) {
  SC_RETURN_IF_ERROR(RefuseOutputInCheckpoints(root));  // before making it inside a checkpoint
  SC_RETURN_IF_ERROR(MakeDirs(root));
  if (::access(root.c_str(), W_OK) != 0) return ErrnoStatus(errno, "write into " + root);
  return CheckLatestIsNoFolder(root);  // else the first save fails, a save interval of training later
}

int Run(Communicator& comm, Communicator& data_comm, at::Device device, const Config& config,
        PreemptionWatcher& watcher) {
  const int rank = comm.rank(), world = comm.size();
  FsdpMlp model(&comm, &data_comm, device, config.features, config.hidden, config.classes, config.dropout, config.seed);
  at::Generator own_rng = at::detail::getDefaultCPUGenerator();
  own_rng.set_current_seed(config.seed * 31 + static_cast<uint64_t>(rank));
  SyntheticData data(config.seed, config.features, config.classes);
  int64_t step = 0;  // steps done (= data position in batches)
  auto say = [&](const std::string& line) {
    if (rank == 0) std::printf("%s\n", line.c_str());  // stdout is line-buffered (main)
  };
  std::string last_committed;  // what a restart would resume from
  double last_save_s = -1;     // how long the last save took, for the final save's estimate
  int64_t params = 0;
  for (const ParamSpec& p : model.params()) params += p.numel;
  say("shardckpt-train: " + std::to_string(world) + " ranks, " + std::to_string(params) + " parameters, flat-sharded");

  // The model's part of the state. Every caller agrees on its status before the next collective:
  // a rank that failed here alone would leave the others waiting in Load or Save for the deadline.
  auto model_state = [&](ShardedState& state, bool model_only) -> Status {
    SC_RETURN_IF_ERROR(Failpoint("train.state", "rank " + std::to_string(rank) + "'s model state"));
    return model.AddToState(state, model_only);
  };
  // A root with a committed checkpoint, whether or not `latest` was written (checkpoint_dir.h).
  // Every rank takes the same branch: one that saw no checkpoint (a stale network-filesystem
  // view) would start training while the others wait in Load. Rank 0 resolves the root in Load.
  // --resume-from names its checkpoint: there must be one (Load says why not). With --resume, a
  // --ckpt that holds a checkpoint wins: a requeued job continues from its own newest step, not
  // from where its first attempt started. 2: from --ckpt; 1: from --resume-from.
  const bool ckpt_holds_one = (config.resume || config.resume_weights_only) && !config.ckpt.empty() &&
                              (PathExists(JoinPath(config.ckpt, "latest")) || HoldsCheckpoints(config.ckpt));
  int64_t resume = ckpt_holds_one ? 2 : !config.resume_from.empty() ? 1 : 0;
  Status decided = comm.AllReduceMaxInt64(&resume, 1);
  if (!decided.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, decided.ToString().c_str());
    return kExitError;
  }
  if (resume) {
    ShardedState targets;
    Status added = AgreeOnStatus(comm, model_state(targets, config.resume_weights_only));
    if (!added.ok()) {
      std::fprintf(stderr, "rank %d: resume failed: %s\n", rank, added.ToString().c_str());
      return 1;
    }
    LoadOptions options;
    options.strict = !config.resume_weights_only;
    auto t0 = std::chrono::steady_clock::now();
    const std::string from = resume == 2 || config.resume_from.empty() ? config.ckpt : config.resume_from;
    if (rank == 0 && resume == 2 && !config.resume_from.empty()) {
      std::printf("--ckpt %s holds a checkpoint: resuming from it (--resume), not from --resume-from %s\n",
                  config.ckpt.c_str(), config.resume_from.c_str());
    }
    Result<LoadReport> report = Load(comm, from, targets, options);
    if (!report.ok()) {
      std::fprintf(stderr, "rank %d: resume failed: %s\n", rank, report.status().ToString().c_str());
      // --resume takes the newest committed checkpoint, whatever `latest` says.
      // NotFound is also a strict load's verdict on a checkpoint of another model: the advice
      // says when it applies.
      const Code code = report.status().code();
      // An I/O error reading the checkpoint's files (a file made unreadable, EACCES; a broken
      // mount, EIO) gets it too; not one of MPI's or a device's, which are IoError as well.
      const bool unreadable =
          code == Code::kIoError && report.status().message().find(config.ckpt + "/") != std::string::npos;
      const char* when = code == Code::kNotFound ? "if files of the checkpoint are missing, "
                         : unreadable ? "its files cannot be read (a permission, a broken mount?): fix that; or, "
                                      : "";
      if (rank == 0 && (code == Code::kDataLoss || code == Code::kNotFound || unreadable) &&
          (resume == 2 || config.resume_from.empty())) {
        std::fprintf(stderr, "%sto resume from an earlier checkpoint: --resume-from %s/step-NNNNNNNNN (its folder) with --ckpt a new "
                             "root, or move the damaged folder out of %s (`shardckpt list %s` shows them, "
                             "`shardckpt verify FOLDER` checks one)\n",
                     when, config.ckpt.c_str(), config.ckpt.c_str(), config.ckpt.c_str());
      }
      return 1;
    }
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    step = report->step;
    last_committed = report->path;
    if (config.resume_weights_only) {
      model.ResetOptimizer();
      say("resumed weights only from " + report->path + " (step " + std::to_string(step) +
          "): fresh optimizer, scheduler and RNG");
    } else {
      model.AfterLoad();
      Result<int64_t> restored = RestoreTrainerBlobs(*report, model.dropout_generator());
      if (!restored.ok()) {
        std::fprintf(stderr, "rank %d: resume failed: %s\n", rank, restored.status().WithContext(report->path).ToString().c_str());
        return 1;
      }
      step = *restored;
      at::Generator own = at::detail::getDefaultCPUGenerator();
      Status rng = SetGeneratorState(own, BlobNamed(*report, "rng"), "rng");
      if (!rng.ok()) {
        own.set_current_seed(config.seed * 7919 + 1000003ull * static_cast<uint64_t>(step) + static_cast<uint64_t>(rank));
        say("per-rank RNG states not restored (" + rng.message() + "); reseeded each rank from (seed, rank, step)");
      }
      // Settings that change the run's course (not the shapes: the load refuses those): said,
      // since the run goes on, but no longer bit for bit as the saved one would have.
      const BlobResult& saved_config = BlobNamed(*report, "config");
      const nlohmann::json saved = saved_config.available ? nlohmann::json::parse(saved_config.bytes, nullptr, false)
                                                          : nlohmann::json();
      if (saved.is_object()) {
        const nlohmann::json current = config.ToJson();
        for (const auto& [key, now] : current.items()) {
          if (saved.contains(key) && saved[key] != now) {
            say("note: " + key + " was " + saved[key].dump() + " in the checkpoint and is " + now.dump() +
                " now: the run does not continue as the saved one would have");
          }
        }
      }
      char line[256];
      std::snprintf(line, sizeof(line), "resumed from %s at step %lld (saved by %d ranks) in %.2fs", report->path.c_str(),
                    static_cast<long long>(step), report->saved_world_size, seconds);
      say(line);
    }
  }
  // Where the run saves, checked before training rather than at its first save: a checkpoint
  // folder given for the root, or (resumed) a root holding a later step than the run's.
  if (!config.ckpt.empty()) {
    Status root_ok = Status::Ok();
    if (rank == 0) root_ok = resume ? CheckNoLaterStep(config.ckpt, step) : CheckFreshRoot(config.ckpt);
    if (rank == 0 && root_ok.ok()) root_ok = CheckWritable(config.ckpt);
    if (rank == 0 && root_ok.ok()) {  // a folder in the way of a later save, found now rather than when it is reached
      root_ok = CheckPlannedStepFolders(config.ckpt, [&](int64_t s) {
        return config.save_every > 0 && s > step && s <= config.steps && (s % config.save_every == 0 || s == config.steps);
      });
    }
    root_ok = AgreeOnStatus(comm, root_ok);
    if (!root_ok.ok()) {
      std::fprintf(stderr, "rank %d: cannot save into --ckpt %s: %s%s\n", rank, config.ckpt.c_str(),
                   root_ok.message().c_str(),
                   config.resume_from.empty() ? ""
                                              : " (with --resume-from OLD, pass --ckpt NEW_ROOT; add --resume to go on "
                                                "from --ckpt's newest instead)");
      return 1;
    }
    // Saving is asked for (--save-every 0, the default, saves only when preempted): a resumed
    // run copied without it trained on and committed nothing.
    if (config.save_every == 0 && step < config.steps) {
      say("note: --save-every is 0: this run saves no periodic checkpoint into --ckpt " + config.ckpt +
          " (only a final one if it is preempted; give --save-every K to save every K steps and the last)");
    }
  }

  // --copy-while-training: the state the copy reads until the next step's Fence, and whether
  // that Fence is still due. Declared before the saver, so that it outlives it: a run that
  // returns early (a failed step) ends the saver, which waits for a copy still reading it.
  ShardedState started;
  std::unique_ptr<AsyncSaver> saver;
  bool fence_due = false;
  std::shared_ptr<SaveHandle> pending;
  Clock::time_point pending_started;
  bool pending_timed = false;
  // A persist's duration, taken at the first step boundary that finds it done. It shares the
  // cores with training, so it overstates a synchronous save of the same state: a safe estimate.
  auto time_pending = [&]() {
    if (pending && !pending_timed && pending->Done()) {
      last_save_s = SecondsSince(pending_started);
      pending_timed = true;
    }
  };
  auto finish_pending = [&]() -> bool {
    if (!pending) return true;
    Status status = pending->Wait();
    if (!status.ok()) {
      std::fprintf(stderr, "rank %d: checkpoint of step %lld failed: %s\n", rank, static_cast<long long>(pending->step()),
                   status.ToString().c_str());
      return false;
    }
    time_pending();
    last_committed = JoinPath(config.ckpt, StepDirName(pending->step()));
    say("checkpoint committed: step " + std::to_string(pending->step()) + " (async)");
    pending.reset();
    return true;
  };
  if (config.async_save) {
    SaveOptions options = config.SaveOptionsFor();
    Result<std::unique_ptr<AsyncSaver>> created = AsyncSaver::Create(comm, options);
    if (!created.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, created.status().ToString().c_str());
      return 1;
    }
    saver = std::move(created).value();
  }
  double last_loss = std::nan("");  // of the last step trained, recorded with each checkpoint
  auto loss_metric = [&]() -> std::map<std::string, double> {
    // A diverged step (NaN, inf) is no metric: left out here, quietly (a save would leave it out
    // with a warning), and the run still checkpoints so that it can be inspected.
    if (!std::isfinite(last_loss)) return {};
    return {{"loss", last_loss}};
  };
  // The whole training state at `step`.
  auto training_state = [&](ShardedState& state) -> Status {
    SC_RETURN_IF_ERROR(model_state(state, false));
    nlohmann::json trainer = {{"step", step}, {"data_position_samples", step * config.global_batch},
                              {"scheduler", {{"last_step", step}, {"lr", LearningRate(config.adamw, step)}}}};
    SC_RETURN_IF_ERROR(state.AddBlob("trainer", trainer.dump()));
    SC_RETURN_IF_ERROR(state.AddBlob("config", config.ToJson().dump()));
    SC_RETURN_IF_ERROR(state.AddBlob("rng.dropout", GeneratorState(model.dropout_generator())));
    at::Generator own = at::detail::getDefaultCPUGenerator();
    return state.AddBlob("rng", GeneratorState(own), BlobScope::kPerRank);
  };
  SavePlanCache plan_cache;  // a repeat save of an unchanged description skips gather and planning
  auto save_sync = [&]() -> bool {
    ShardedState state;
    Status added = AgreeOnStatus(comm, training_state(state));
    SaveOptions options = config.SaveOptionsFor();
    options.metrics = loss_metric();  // keep-best ranks by it
    options.plan_cache = &plan_cache;
    auto t0 = Clock::now();
    Result<SaveResult> saved = added.ok() ? Save(comm, config.ckpt, step, state, options) : Result<SaveResult>(added);
    if (!saved.ok()) {
      std::fprintf(stderr, "rank %d: checkpoint failed: %s\n", rank, saved.status().ToString().c_str());
      return false;
    }
    last_save_s = SecondsSince(t0);
    last_committed = saved->path;
    char msg[512];
    std::snprintf(msg, sizeof(msg), "checkpoint committed: step %lld at %s (%.1f MiB in %.2fs)",
                  static_cast<long long>(step), saved->path.c_str(), saved->total_bytes / 1048576.0, last_save_s);
    say(msg);
    return true;
  };
  auto save_async = [&]() -> bool {
    ShardedState state;
    Status added = AgreeOnStatus(comm, training_state(state));
    if (!added.ok()) std::fprintf(stderr, "rank %d: checkpoint failed: %s\n", rank, added.ToString().c_str());
    if (!added.ok() || !finish_pending()) return false;
    pending_started = Clock::now();
    if (config.copy_while_training) started = std::move(state);  // read by the copy until Fence
    Result<std::shared_ptr<SaveHandle>> handle =
        config.copy_while_training ? saver->StartSave(config.ckpt, step, started, loss_metric())
                                   : saver->Save(config.ckpt, step, state, loss_metric());
    if (!handle.ok()) {
      std::fprintf(stderr, "rank %d: checkpoint snapshot failed: %s\n", rank, handle.status().ToString().c_str());
      return false;
    }
    pending = *handle;
    pending_timed = false;
    if (config.copy_while_training) {
      fence_due = true;
      say("checkpoint copy started: step " + std::to_string(step) + " (copied while the next step trains)");
      return true;
    }
    char msg[256];
    std::snprintf(msg, sizeof(msg), "checkpoint snapshot: step %lld (training blocked %.3fs; persisting in the background)",
                  static_cast<long long>(step), saver->last_snapshot_seconds());
    say(msg);
    return true;
  };
  // Every rank runs this after the same step (ShouldStop agreed on it) and returns the same status.
  auto stop_for_preemption = [&](const StopRequest& stop) -> int {
    const auto seen = Clock::now();
    const double remaining_at_seen = config.preempt_grace_s - stop.seconds_since;
    const std::string at_step = "step " + std::to_string(step);
    LocalStop mine = watcher.Local();
    char line[512];
    if (mine.requested) {
      std::snprintf(line, sizeof(line), "rank %d: stopping after %s (%s received here %.2fs ago)", rank,
                    at_step.c_str(), SignalName(mine.signal).c_str(), mine.seconds_since);
    } else {
      std::snprintf(line, sizeof(line), "rank %d: stopping after %s (asked by rank %d)", rank, at_step.c_str(),
                    stop.first_rank);
    }
    std::printf("%s\n", line);
    std::snprintf(line, sizeof(line), "preemption: %s received by rank %d %.2fs ago; every rank stops after %s; "
                  "grace period %gs", SignalName(stop.signal).c_str(), stop.first_rank, stop.seconds_since,
                  at_step.c_str(), config.preempt_grace_s);
    say(line);
    auto resume_from = [&]() -> std::string {
      return last_committed.empty() ? "the start (no checkpoint was committed)" : last_committed;
    };
    // Every rank sees the same failure (saves agree on their status), so rank 0's line holds.
    auto failed = [&](const std::string& what) {
      say("preempted after " + at_step + ": " + what + " failed (the error is above); resume from " + resume_from() +
          " (exit status 1)");
      return kExitError;
    };
    if (pending) {
      const std::string what = "the checkpoint of step " + std::to_string(pending->step());
      say("preemption: waiting for " + what + " still being written");
      if (!finish_pending()) return failed(what);
    }
    if (config.ckpt.empty()) {
      say("preempted after " + at_step + " without a final checkpoint: no --ckpt (exit status 75)");
      return kExitPreemptedUnsaved;
    }
    FinalSaveDecision decision = DecideFinalSave(remaining_at_seen - SecondsSince(seen), last_save_s);
    int64_t skip = decision.save ? 0 : 1;  // one rank's "cannot finish" is everyone's
    Status agreed = comm.AllReduceMaxInt64(&skip, 1);
    if (!agreed.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, agreed.ToString().c_str());
      return kExitError;
    }
    if (skip) {
      if (decision.save) decision.reason = "another rank estimated that a save would not finish in time";
      say("preempted after " + at_step + " without a final checkpoint: not saving " + at_step + ": " +
          decision.reason + "; no save was started, so nothing is half-written; resume from " + resume_from() +
          " (exit status 75)");
      return kExitPreemptedUnsaved;
    }
    say("preemption: final checkpoint of " + at_step + " (" + decision.reason + ")");
    if (!save_sync()) return failed("the final checkpoint of " + at_step);
    std::snprintf(line, sizeof(line), "preempted after %s: final checkpoint committed at %s, %.2fs into the %gs grace "
                  "period; resume with --resume (exit status 0)", at_step.c_str(), last_committed.c_str(),
                  stop.seconds_since + SecondsSince(seen), config.preempt_grace_s);
    say(line);
    return kExitOk;
  };
  if (step >= config.steps) {
    say("nothing to train: the run is at step " + std::to_string(step) + " and --steps is " +
        std::to_string(config.steps) + " (it trains until that global step)");
  }
  while (step < config.steps) {
    Status paced = Failpoint("train.step", "step " + std::to_string(step + 1));  // tests pace steps with sleep:MS
    if (!paced.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, paced.ToString().c_str());
      return kExitError;
    }
    Batch batch = data.Get(step + 1, config.global_batch, world, rank);
    // After a copy-while-training save, the update waits for what is left of the copy.
    auto fence = [&]() -> Status {
      fence_due = false;
      SC_RETURN_IF_ERROR(saver->Fence());
      char msg[256];
      std::snprintf(msg, sizeof(msg), "checkpoint snapshot: step %lld (training blocked %.6fs at the fence, "
                    "copy %.3fs; persisting in the background)", static_cast<long long>(step),
                    saver->last_fence_seconds(), saver->last_snapshot_seconds());
      say(msg);
      return Status::Ok();
    };
    Result<float> loss = model.TrainStep(batch, config.global_batch, step + 1, config.adamw,
                                         fence_due ? std::function<Status()>(fence) : nullptr);
    if (!loss.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, loss.status().ToString().c_str());
      return 1;
    }
    ++step;
    char line[64];
    std::snprintf(line, sizeof(line), "step %lld loss %.9g", static_cast<long long>(step), *loss);
    say(line);
    last_loss = *loss;
    time_pending();
    // Before the periodic save: a stop at a save step makes that save the final one, under the
    // grace-period rules.
    Result<StopRequest> stop = watcher.ShouldStop(comm);
    if (!stop.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", rank, stop.status().ToString().c_str());
      return kExitError;
    }
    if (stop->requested) return stop_for_preemption(*stop);
    // The last step is saved too, whatever --save-every: a run that ends between two saves would
    // leave its final state to be trained again by every --resume.
    if (!config.ckpt.empty() && config.save_every > 0 && (step % config.save_every == 0 || step == config.steps)) {
      if (!(saver ? save_async() : save_sync())) return kExitError;
    }
  }
  if (!finish_pending()) return 1;
  if (!config.dump_params.empty()) {
    // The trained parameters as the job sees them, for checking a consolidated export.
    Result<std::vector<at::Tensor>> full = model.GatherParameters();
    if (!full.ok()) return 1;
    if (rank == 0) {
      std::ofstream out(config.dump_params, std::ios::binary);
      for (size_t i = 0; i < full->size(); ++i) {
        const at::Tensor t = (*full)[i].cpu();
        std::string header = "model." + model.params()[i].name + " " + std::to_string(t.numel()) + "\n";
        out << header;
        out.write(static_cast<const char*>(t.contiguous().data_ptr()), t.numel() * 4);
      }
    }
  }
  return 0;
}

// Where the parameters live and which communicator moves them: the MPI one on the CPU, NCCL
// over the rank's local GPU with --device cuda.
struct DataPlane {
  at::Device device = at::kCPU;
  std::unique_ptr<Communicator> comm;  // null: the control communicator serves
};

Result<DataPlane> MakeDataPlane(Communicator& comm, const std::string& device) {
  DataPlane plane;
  if (device == "cpu") return plane;
  if (device != "cuda") return InvalidArgument("--device must be cpu or cuda, not '" + device + "'");
  if (!at::hasCUDA()) {
    return Status(Code::kFailedPrecondition,
                  "--device cuda needs a CUDA build of libtorch; this one has no CUDA (Debian's libtorch-dev is CPU-only)");
  }
#ifdef SHARDCKPT_HAVE_NCCL
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  int gpus = static_cast<int>(at::detail::getCUDAHooks().getNumGPUs());
  int index = (local ? std::atoi(local) : comm.rank()) % std::max(1, gpus);
  plane.device = at::Device(at::kCUDA, static_cast<at::DeviceIndex>(index));
  SC_ASSIGN_OR_RETURN(plane.comm, CreateNcclCommunicator(comm, index));
  return plane;
#else
  return Status(Code::kFailedPrecondition, "--device cuda needs NCCL; this shardckpt was built without it");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  // Progress lines reach a log file or pipe as they happen, not when a 4 KiB buffer fills (a
  // person tailing the log would see stale progress, and a kill would lose its end).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  // Past a file-size limit (ulimit -f) a checkpoint write fails with EFBIG on this rank, agreed
  // on by every rank, the last checkpoint kept; the signal's default action killed the rank.
  std::signal(SIGXFSZ, SIG_IGN);
  // Before MPI_Init and the (possibly long) resume: a stop request that arrives while the job
  // starts is acted on at the first step instead of killing the rank with the signal's default
  // action (a launcher forwards SIGUSR1 as soon as the ranks exist; the job would end without
  // the exit status a requeueing script looks for). What remains is the time before main
  // (loading libtorch: under a second), when a stop signal still ends the rank.
  Result<std::unique_ptr<PreemptionWatcher>> watcher = PreemptionWatcher::Install();
  if (!watcher.ok()) {
    std::fprintf(stderr, "shardckpt-train: %s\n", watcher.status().ToString().c_str());
    return kExitError;
  }
  auto session = MpiSession::Init(&argc, &argv);
  if (!session.ok()) {
    std::fprintf(stderr, "%s\n", session.status().ToString().c_str());
    return 2;
  }
  Config config;
  po::options_description flags("shardckpt-train: a fully sharded training run that checkpoints and resumes");
  flags.add_options()("help", "this text")
      ("ckpt", po::value(&config.ckpt), "checkpoint root")
      ("steps", po::value(&config.steps)->default_value(30), "train until this global step")
      ("save-every", po::value(&config.save_every)->default_value(0), "save every K steps and the last (0: never)")
      ("keep-last", po::value(&config.keep_last)->default_value(3), "newest checkpoints to keep")
      ("keep-best", po::value(&config.keep_best)->default_value(0), "and the K with the lowest recorded loss")
      ("resume", po::bool_switch(&config.resume), "continue from `latest` in --ckpt when there is one")
      ("resume-from", po::value(&config.resume_from),
       "continue from this checkpoint folder (or this root's newest) instead; saves still go to --ckpt, "
       "which must not hold later steps; with --resume, only while --ckpt holds no checkpoint (a requeued "
       "job goes on from its own newest)")
      ("resume-weights-only", po::bool_switch(&config.resume_weights_only),
       "load only the model weights; fresh optimizer, scheduler and RNG")
      ("async-save", po::bool_switch(&config.async_save), "snapshot and persist checkpoints in the background")
      ("copy-while-training", po::bool_switch(&config.copy_while_training),
       "with --async-save: the snapshot copy runs during the next step's forward and backward "
       "passes, fenced before its optimizer update")
      ("preempt-grace-s", po::value(&config.preempt_grace_s)->default_value(60),
       "on SIGTERM/SIGUSR1 every rank stops after the same step and saves it if the save can finish "
       "within this many seconds of the signal (see the exit status below)")
      ("seed", po::value(&config.seed)->default_value(1234), "seed of data, init and dropout")
      ("global-batch", po::value(&config.global_batch)->default_value(48), "samples per step over all ranks")
      ("hidden", po::value(&config.hidden)->default_value(1024), "hidden width")
      ("dropout", po::value(&config.dropout)->default_value(0.1, "0.1"), "dropout probability")
      ("dump-params", po::value(&config.dump_params), "write the final gathered parameters here (rank 0)")
      ("device", po::value(&config.device)->default_value("cpu"),
       "cpu | cuda: where parameters, moments and compute live (cuda: a CUDA libtorch and NCCL)");
  po::variables_map vm;
  std::string usage_error;
  try {
    po::store(po::parse_command_line(argc, argv, flags), vm);
    po::notify(vm);
    if (Status valid = ValidateConfig(config); !valid.ok() && !vm.count("help")) usage_error = valid.message();
    // `--ckpt "$CKPT_DIR"` with the variable unset: trained to the end and saved nothing.
    if (vm.count("ckpt") && config.ckpt.empty() && usage_error.empty()) {
      usage_error = "--ckpt is empty (an unset variable?): give the checkpoint root, or leave --ckpt out to train "
                    "without checkpoints";
    }
  } catch (const std::exception& e) {
    usage_error = e.what();
  }
  int code;
  {
    auto comm = CreateMpiCommunicator().value();
    if (!usage_error.empty()) {
      std::fprintf(stderr, "shardckpt-train: %s\n", usage_error.c_str());
      // Every rank has printed before any exits: mpirun ends the job at the first nonzero exit,
      // and a rank still starting would be killed before naming the flag.
      AgreeOnStatus(*comm, InvalidArgument(usage_error)).IgnoreError();
      return 2;
    }
    if (vm.count("help")) {
      if (comm->rank() == 0) std::cout << flags << "\n" << kExitStatusHelp;
      return 0;
    }
    at::set_num_threads(1);  // ranks share the cores; deterministic kernels
    Result<DataPlane> plane = MakeDataPlane(*comm, config.device);
    Status ready = AgreeOnStatus(*comm, plane.status());
    if (!ready.ok()) {
      if (comm->rank() == 0) std::fprintf(stderr, "shardckpt-train: %s\n", ready.ToString().c_str());
      return 2;
    }
    code = Run(*comm, plane->comm ? *plane->comm : *comm, plane->device, config, **watcher);
    int64_t worst = code;
    comm->AllReduceMaxInt64(&worst, 1).IgnoreError();
    code = static_cast<int>(worst);
    // Nothing is left to stop: a stop forwarded while MPI finalizes must not kill the rank.
    (*watcher)->IgnoreLateSignals();
  }
  return code;
}
