// Commit of a checkpoint whose data files are written and synced in <root>/<temp_name>: steps 4
// to 9 of the protocol in save.h. Shared by the collective Save (on rank 0) and by the offline
// writers (import, reshard).
#pragma once

#include <string>

#include "shardckpt/engine/manifest.h"

namespace shardckpt {

// Validates `manifest`, writes it, renames the folder to step-N, fsyncs the root, replaces
// `latest` and applies retention. On failure the new folder is removed unless `latest` already
// names it.
Status CommitCheckpoint(const std::string& root, const std::string& temp_name, const Manifest& manifest,
                        int keep_last);

// The creation facts every manifest carries; `torch_version` and `git_commit` may be empty.
CreationInfo MakeCreationInfo(int hosts, const std::string& torch_version, const std::string& git_commit,
                              const std::map<std::string, std::string>& user);

}  // namespace shardckpt
