#include "shardckpt/engine/formats/sha256_sidecar.h"

#include <openssl/evp.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "shardckpt/engine/formats/byte_text.h"
#include "shardckpt/engine/formats/zip_reader.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {

Result<SidecarCheck> CheckSha256Sidecar(const std::string& path) {
  SidecarCheck check;
  const std::string sum_path = path + ".sha256";
  if (!PathExists(sum_path)) return check;
  check.had_sidecar = true;
  Result<std::string> line = ReadFileLimited(sum_path, 4096);
  if (!line.ok()) return line.status().WithContext("reading " + sum_path);
  // sha256sum's two forms: "<hex>  NAME" (written here) and, with --tag, "SHA256 (NAME) = <hex>";
  // hex of either case.
  std::string text = *line;
  if (text.compare(0, 8, "SHA256 (") == 0 && text.find(") = ") != std::string::npos) {
    text = text.substr(text.find(") = ") + 4);
  }
  const bool hex64 = text.size() >= 64 && std::all_of(text.begin(), text.begin() + 64, [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  });
  if (!hex64) {
    check.problem = BaseName(sum_path) + " holds no SHA-256 in sha256sum's form (\"<hex>  NAME\" or, with --tag, "
                    "\"SHA256 (NAME) = <hex>\"): write a new one, or delete it";
    return check;
  }
  std::transform(text.begin(), text.begin() + 64, text.begin(), [](char c) { return c >= 'A' && c <= 'F' ? c - 'A' + 'a' : c; });
  SC_ASSIGN_OR_RETURN(ByteSource file, ByteSource::OpenFile(path));
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) != 1) return Internal("SHA-256 unavailable");
  std::vector<unsigned char> buf(8u << 20);
  for (uint64_t at = 0; at < file.size(); at += buf.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), file.size() - at));
    SC_RETURN_IF_ERROR(file.ReadAt(at, buf.data(), n));
    EVP_DigestUpdate(ctx.get(), buf.data(), n);
  }
  unsigned char digest[32];
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &length);
  const std::string hex = HexEncode(std::string_view(reinterpret_cast<const char*>(digest), length));
  check.bytes_hashed = file.size();
  if (text.compare(0, 64, hex) != 0) {
    check.problem = "SHA-256 " + hex + " does not match " + BaseName(sum_path) + " (" + text.substr(0, 64) +
                    "): the file changed since it was written (changed on purpose? then write a new " +
                    BaseName(sum_path) + ", e.g. with sha256sum, or delete it)";
  }
  return check;
}

Status RequireSidecarMatch(const std::string& path) {
  SC_ASSIGN_OR_RETURN(SidecarCheck check, CheckSha256Sidecar(path));
  if (!check.problem.empty()) return DataLoss(path + ": " + check.problem);
  return Status::Ok();
}

std::string SidecarText(const std::string& path, const std::string& sha256_hex) {
  return sha256_hex + "  " + BaseName(path) + "\n";
}

Status WriteSidecar(const std::string& path, const std::string& sha256_hex) {
  return WriteFileAtomic(path + ".sha256", SidecarText(path, sha256_hex), "export.sha256");
}

std::string Sha256Hex(std::string_view bytes) {
  unsigned char digest[32];
  unsigned int length = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr);
  return HexEncode(std::string_view(reinterpret_cast<const char*>(digest), length));
}

}  // namespace shardckpt
