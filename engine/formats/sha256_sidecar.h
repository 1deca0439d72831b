// FILE.sha256 beside a file an export wrote (`sha256sum -c` form: OutputFile writes one beside
// each .pt, .safetensors and DCP data file). `verify` checks them, and so does every tool that
// reads such a file whole into something new (import, reshard, consolidate, export): a file
// changed since it was written must be refused there, not carried into a checkpoint that gets
// fresh checksums and verifies clean.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "shardckpt/io/status.h"

namespace shardckpt {

struct SidecarCheck {
  bool had_sidecar = false;  // PATH.sha256 exists (and was checked)
  uint64_t bytes_hashed = 0;
  std::string problem;       // "" when the sum matches; else why not, without PATH
};

// had_sidecar false where PATH.sha256 does not exist; the read's error where either file cannot
// be read.
Result<SidecarCheck> CheckSha256Sidecar(const std::string& path);

// The same as one status: DataLoss "PATH: <problem>" where the sum does not match.
Status RequireSidecarMatch(const std::string& path);

// What PATH.sha256 holds for a file of that SHA-256 (hex): `sha256sum -c`'s line.
std::string SidecarText(const std::string& path, const std::string& sha256_hex);
// Writes PATH.sha256 for a file of that SHA-256 (hex), atomically.
Status WriteSidecar(const std::string& path, const std::string& sha256_hex);

// The SHA-256 of `bytes`, in hex (a small file written whole, such as an index).
std::string Sha256Hex(std::string_view bytes);

}  // namespace shardckpt
