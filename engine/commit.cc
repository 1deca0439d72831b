#include "shardckpt/engine/commit.h"

#include <ctime>

#include "shardckpt/engine/checkpoint_dir.h"
#include "shardckpt/engine/version.h"
#include "shardckpt/io/fs.h"
#include "shardckpt/io/log.h"

namespace shardckpt {

CreationInfo MakeCreationInfo(int hosts, const std::string& torch_version, const std::string& git_commit,
                              const std::map<std::string, std::string>& user) {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  return CreationInfo{buf, kVersion, torch_version, hosts, git_commit, user};
}

Status CommitCheckpoint(const std::string& root, const std::string& temp_name, const Manifest& manifest,
                        int keep_last) {
  Status valid = ValidateManifest(manifest);
  if (!valid.ok()) return Internal("the manifest built for this checkpoint is invalid (a bug): " + valid.message());
  SC_ASSIGN_OR_RETURN(std::string json, EncodeManifest(manifest));
  const std::string temp_dir = JoinPath(root, temp_name);
  const std::string final_name = StepDirName(manifest.step);
  const std::string final_dir = JoinPath(root, final_name);
  SC_RETURN_IF_ERROR(SyncDir(temp_dir, "commit.sync_tmp"));
  SC_RETURN_IF_ERROR(WriteFileAtomic(JoinPath(temp_dir, kManifestName), json, "commit.manifest"));
  SC_RETURN_IF_ERROR(Rename(temp_dir, final_dir, "commit.rename_dir"));
  Status status = SyncDir(root, "commit.sync_root");
  if (status.ok()) status = WriteFileAtomic(JoinPath(root, kLatestName), final_name + "\n", "commit.latest");
  if (!status.ok()) {
    Result<std::string> latest = ReadFileLimited(JoinPath(root, kLatestName), 4096);
    bool published = latest.ok() && latest->rfind(final_name, 0) == 0;
    if (!published) RemoveTree(final_dir).IgnoreError();  // best effort: it was never published
    return status;
  }
  Status retention = ApplyRetention(root, keep_last, final_name);
  if (!retention.ok()) SC_LOG(kWarn) << "retention after " << final_name << " failed: " << retention.ToString();
  return Status::Ok();
}

}  // namespace shardckpt
