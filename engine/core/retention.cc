#include "shardckpt/engine/core/retention.h"

#include <sys/stat.h>

#include <algorithm>
#include <set>

#include "shardckpt/engine/core/checkpoint_dir.h"
#include "shardckpt/engine/core/load.h"
#include "shardckpt/engine/core/manifest_summary.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {

namespace {
// Why PlanRetention keeps a checkpoint it cannot read; one kept for this reason alone is named
// by ApplyRetention as left on purpose.
constexpr const char* kKeptUnreadable = "unreadable, not known to be damaged";
}  // namespace

Status ValidatePolicy(const RetentionPolicy& p) {
  if (p.keep_last < 0 || p.keep_best < 0) return InvalidArgument("keep_last and keep_best must not be negative");
  if (p.keep_best > 0 && p.metric.empty()) return InvalidArgument("keep_best needs the name of a metric to rank by");
  return Status::Ok();
}

Status CheckMetricRecorded(const RetentionPolicy& policy, const std::string& root, const std::vector<CheckpointInfo>& all,
                           MetricsNoneYet none_yet) {
  if (!policy.RanksByMetric()) return Status::Ok();
  std::set<std::string> recorded;
  for (const CheckpointInfo& c : all) {
    for (const auto& [name, value] : c.metrics) recorded.insert(name);
  }
  if (recorded.count(policy.metric)) return Status::Ok();
  if (recorded.empty() && none_yet == MetricsNoneYet::kApplyTheRest) return Status::Ok();
  std::string names;
  for (const std::string& name : recorded) names += (names.empty() ? "" : ", ") + name;
  return InvalidArgument("no checkpoint in " + root + " records the metric '" + policy.metric + "' (recorded: " +
                         (names.empty() ? "none" : names) + "): keep-best by it would keep none of them, so the rule is refused");
}

std::string NewestCommitted(const std::vector<CheckpointInfo>& all) {
  const CheckpointInfo* newest = nullptr;
  for (const CheckpointInfo& c : all) {
    if (c.committed && (newest == nullptr || c.step > newest->step)) newest = &c;
  }
  return newest != nullptr ? newest->name : std::string();
}

void PlanRetention(const RetentionPolicy& policy, const std::string& latest, std::vector<CheckpointInfo>* all) {
  std::vector<CheckpointInfo*> committed;
  for (CheckpointInfo& c : *all) {
    c.keep = false;
    c.why.clear();
    if (c.committed) committed.push_back(&c);
  }
  std::sort(committed.begin(), committed.end(), [](const CheckpointInfo* a, const CheckpointInfo* b) { return a->step < b->step; });
  auto keep = [](CheckpointInfo* c, const std::string& why) {
    c->keep = true;
    c->why += (c->why.empty() ? "" : ", ") + why;
  };
  if (policy.KeepsEverything()) {
    for (CheckpointInfo* c : committed) keep(c, "kept (no retention)");
    return;
  }
  for (CheckpointInfo* c : committed) {
    if (c->name == latest) keep(c, "latest");
    if (c->unreadable) keep(c, kKeptUnreadable);
  }
  if (!committed.empty() && committed.back()->name != latest) keep(committed.back(), "newest");
  // keep_last counts the checkpoints that are not damaged: a damaged newest one (kept above, to
  // be looked at) must not leave the root with nothing that loads.
  std::vector<CheckpointInfo*> sound;
  for (CheckpointInfo* c : committed) {
    if (c->problem.empty()) sound.push_back(c);
  }
  const size_t last = std::min<size_t>(sound.size(), static_cast<size_t>(policy.keep_last));
  for (size_t i = sound.size() - last; i < sound.size(); ++i) keep(sound[i], "last " + std::to_string(policy.keep_last));
  std::vector<CheckpointInfo*> ranked;
  for (CheckpointInfo* c : committed) {
    // A damaged checkpoint shows its metrics but is never kept as one of the best.
    if (c->problem.empty() && c->metrics.count(policy.metric)) ranked.push_back(c);
  }
  // Best first; among equal values the newer checkpoint wins.
  std::stable_sort(ranked.begin(), ranked.end(), [&](const CheckpointInfo* a, const CheckpointInfo* b) {
    double x = a->metrics.at(policy.metric), y = b->metrics.at(policy.metric);
    if (x != y) return policy.higher_is_better ? x > y : x < y;
    return a->step > b->step;
  });
  const size_t best = std::min<size_t>(ranked.size(), static_cast<size_t>(policy.keep_best));
  for (size_t i = 0; i < best; ++i) {
    keep(ranked[i], "best " + std::to_string(policy.keep_best) + " by " + policy.metric + " (" +
                        (policy.higher_is_better ? "max" : "min") + ")");
  }
}

namespace {

// As ReadManifest checks a checkpoint, but with the manifest decoded once per process
// (manifest_summary.h): every save with keep_best ranks every checkpoint kept.
void ReadManifestInto(const std::string& dir, CheckpointInfo* c) {
  c->examined = true;
  Result<ManifestSummary> summary = ReadManifestSummary(dir);
  const Status files = summary.ok() ? CheckDataFilesIn(dir, summary->files) : summary.status();
  // A data file that is a link to nothing (rank files linked from an archive not mounted now) is
  // "missing" to its size check, but not known to be gone.
  bool linked_away = false;
  if (files.code() == Code::kNotFound && summary.ok()) {
    for (const FileRecord& f : summary->files) linked_away = linked_away || IsDanglingLink(JoinPath(dir, f.name));
  }
  if (summary.ok()) {  // shown even when a data file is missing: which run and step it was
    c->time = summary->time;
    c->world_size = summary->world_size;
    c->metrics = summary->metrics;
  }
  if (!files.ok()) {
    c->problem = files.ToString();
    // Damage is a manifest or file that reads wrong (DataLoss) or is not there (NotFound); a
    // read refused (EACCES) or failed (EIO, ESTALE) says nothing of the bytes. Removing such a
    // checkpoint deleted intact data the moment someone changed a permission.
    c->unreadable = linked_away || (files.code() != Code::kDataLoss && files.code() != Code::kNotFound);
  }
}

}  // namespace

Result<std::vector<CheckpointInfo>> ListCheckpoints(const std::string& root, bool with_manifests, bool with_bytes) {
  SC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(root));
  std::vector<CheckpointInfo> out;
  for (const std::string& name : names) {
    CheckpointInfo c;
    c.name = name;
    const bool retired = IsRetiredDirName(name);
    c.temp = IsTempDirName(name) || retired;
    const bool step_dir = ParseStepDirName(name, &c.step);
    if (!step_dir && !c.temp) continue;
    if (c.temp) ParseLeftoverStepDirName(name, &c.step);
    const std::string dir = JoinPath(root, name);
    struct stat st;
    const bool listed = ::lstat(dir.c_str(), &st) == 0;
    c.symlink = listed && S_ISLNK(st.st_mode);
    // IsPlainNonFolder, from the lstat in hand (a link's target looked at only for links).
    const bool plain_file = listed && !S_ISDIR(st.st_mode) && (!S_ISLNK(st.st_mode) || IsPlainNonFolder(dir));
    if (Result<std::vector<std::string>> files = with_bytes ? ListDir(dir) : std::vector<std::string>{}; files.ok()) {
      for (const std::string& f : *files) {
        Result<uint64_t> size = FileSize(JoinPath(dir, f));
        if (size.ok()) c.bytes += *size;
      }
    }
    c.committed = step_dir && PathExists(JoinPath(dir, kManifestName));
    if (plain_file) {  // as RemoveStaleTempDirs leaves it
      c.foreign = name;
      c.problem = "a file, not a folder a save writes: left for you to move or remove";
    } else if (retired) {
      c.problem = "retired by retention: its files are being deleted, or were left by a process that ended first; the next save removes it";
    } else if (c.temp) {
      c.problem = "save in progress, or left by one that did not finish";
    } else if (c.unreachable = c.committed ? "" : UnreachableStepFolder(dir); !c.unreachable.empty()) {
      c.problem = LeftUnreachable(root, name, c.unreachable).message();
    } else if (!c.committed) {
      c.foreign = FirstEntryNoSaveWrites(dir);
      c.problem = c.foreign.empty() ? "no manifest (a deletion or commit cut short); the next save removes it"
                                    : "no manifest, and holds " + c.foreign + ", which no save writes: left for you to move or remove";
    }
    if (c.committed && with_manifests) ReadManifestInto(dir, &c);
    out.push_back(std::move(c));
  }
  std::sort(out.begin(), out.end(), [](const CheckpointInfo& a, const CheckpointInfo& b) {
    return a.step != b.step ? a.step < b.step : a.name < b.name;
  });
  return out;
}

Result<RetentionReport> ApplyRetention(const std::string& root, const RetentionPolicy& policy,
                                       const std::string& just_committed, bool dry_run, Removal when,
                                       const std::string& kept_for_latest) {
  SC_RETURN_IF_ERROR(ValidatePolicy(policy));
  RetentionReport report;
  if (policy.KeepsEverything()) return report;
  // No byte counts: a save applies this, and on a parallel file system each stat is a round trip.
  SC_ASSIGN_OR_RETURN(std::vector<CheckpointInfo> all, ListCheckpoints(root, policy.RanksByMetric(), /*with_bytes=*/false));
  if (!policy.RanksByMetric() && policy.keep_last > 0) {
    // keep_last counts undamaged checkpoints (PlanRetention): without a metric to rank by, only
    // the newest are checked, until keep_last sound ones are found (a save's own, and those of
    // its earlier saves, are remembered: nothing is decoded again).
    int sound = 0;
    for (auto c = all.rbegin(); c != all.rend() && sound < policy.keep_last; ++c) {
      if (!c->committed) continue;
      if (c->name == just_committed) {  // checked as it was committed, just now
        ++sound;
        continue;
      }
      ReadManifestInto(JoinPath(root, c->name), &*c);
      if (c->problem.empty()) ++sound;
    }
  }
  SC_RETURN_IF_ERROR(CheckMetricRecorded(policy, root, all, MetricsNoneYet::kApplyTheRest));
  // From the listing in hand: no second read of the root on every save.
  PlanRetention(policy, NewestCommitted(all), &all);
  // An unreadable checkpoint the rule would have removed is named as left on purpose (prune
  // --json: left_alone), as well as logged.
  auto kept_unreadable = [&](const CheckpointInfo& c) {
    const std::string why = JoinPath(root, c.name) + " is kept: " + c.problem + " (" + kKeptUnreadable + ")";
    SC_LOG(kWarn) << "retention: " << why;
    report.failed.push_back(RemovalFailure{c.name, FailedPrecondition(why), /*on_purpose=*/true});
  };
  for (CheckpointInfo& c : all) {
    if (c.committed && c.keep && c.why == kKeptUnreadable) kept_unreadable(c);
    if (!c.committed || c.keep || c.name == just_committed) continue;
    if (c.name == kept_for_latest) {
      const std::string why = JoinPath(root, c.name) + " is kept for now: `latest` names it and could not be rewritten "
                              "(no space); prune again once it names the newest checkpoint";
      SC_LOG(kWarn) << "retention: " << why;
      report.failed.push_back(RemovalFailure{c.name, FailedPrecondition(why), /*on_purpose=*/true});
      continue;
    }
    // Never removed unexamined: an unreadable checkpoint older than the newest keep_last sound
    // ones (which were all keep_last needed to read) is kept as PlanRetention keeps one it read.
    if (!c.examined) {
      ReadManifestInto(JoinPath(root, c.name), &c);
      if (c.unreadable) {
        kept_unreadable(c);
        continue;
      }
    }
    if (dry_run) {  // what the removal would do now: a folder a reader holds is left
      (HeldByReader(root, c.name) ? report.deferred : report.removed).push_back(c.name);
      continue;
    }
    SC_LOG(kInfo) << "retention: removing " << JoinPath(root, c.name);
    Result<bool> removal = RemoveCheckpointDir(root, c.name, when);
    if (!removal.ok()) {  // one folder that cannot go must not keep every other one on the disk
      report.failed.push_back(RemovalFailure{c.name, removal.status()});
      continue;
    }
    const bool removed = *removal;
    if (removed) ForgetManifestSummary(JoinPath(root, c.name));
    (removed ? report.removed : report.deferred).push_back(c.name);
    if (!removed) SC_LOG(kInfo) << "retention: " << JoinPath(root, c.name) << " is being read; a later save removes it";
  }
  return report;
}

}  // namespace shardckpt
