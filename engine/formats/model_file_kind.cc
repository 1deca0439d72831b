#include "shardckpt/engine/formats/model_file_kind.h"

#include <algorithm>
#include <cstring>

#include "shardckpt/engine/formats/torch_file.h"
#include "shardckpt/engine/formats/zip_reader.h"
#include "shardckpt/engine/model/manifest.h"
#include "shardckpt/io/fs.h"

namespace shardckpt {

bool IsImportableFileName(const std::string& path) {
  for (const char* suffix : {".pt", ".pth", ".bin", ".safetensors", ".safetensors.index.json"}) {
    if (EndsWith(path, suffix)) return true;
  }
  return false;
}

Result<ModelFileKind> ModelFileKindOf(const std::string& file) {
  if (EndsWith(file, ".safetensors.index.json")) return ModelFileKind::kSafetensorsIndex;
  if (EndsWith(file, ".bin.index.json")) return ModelFileKind::kTorchIndex;
  if (EndsWith(file, ".safetensors")) return ModelFileKind::kSafetensors;
  if (IsImportableFileName(file)) return ModelFileKind::kTorch;
  auto refused = [&](const std::string& why) {
    return InvalidArgument("cannot import '" + file + "': " + why +
                           "; expected a torch.save file (a zip or the legacy format, under any name), a .safetensors "
                           "file, a *.safetensors.index.json or *.bin.index.json, or a folder holding one");
  };
  if (IsDirectory(file)) return refused("it is a folder");
  SC_ASSIGN_OR_RETURN(ByteSource source, ByteSource::OpenFile(file));
  unsigned char head[9] = {};
  if (source.size() >= sizeof(head)) SC_RETURN_IF_ERROR(source.ReadAt(0, head, sizeof(head)));
  if (std::memcmp(head, "PK\x03\x04", 4) == 0) {
    // torch.save writes ARCHIVE/data.pkl first: told by the first local header, so that a file
    // cut short (its directory at the end lost) is still read as torch.save's, and called damaged.
    unsigned char local[30];
    std::string first;
    if (source.size() >= sizeof(local) && source.ReadAt(0, local, sizeof(local)).ok()) {
      const size_t length = local[26] | local[27] << 8;
      first.resize(std::min<uint64_t>(length, source.size() - sizeof(local)));
      if (!source.ReadAt(sizeof(local), first.data(), first.size()).ok()) first.clear();
    }
    if (first == "data.pkl" || EndsWith(first, "/data.pkl")) return ModelFileKind::kTorch;
    return refused("it is a zip but not a torch.save archive (its first record is '" + WithNulsShown(first) +
                   "', torch.save's is ARCHIVE/data.pkl)");
  }
  if (IsLegacyTorchFile(source)) return ModelFileKind::kTorch;
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = header << 8 | head[i];
  if (head[8] == '{' && header >= 2 && header <= source.size() - 8) return ModelFileKind::kSafetensors;
  return refused(source.size() < sizeof(head) ? "it is " + std::to_string(source.size()) + " bytes long"
                                              : "its first bytes are none of those formats'");
}

Result<std::string> ResolveModelFile(const std::string& input) {
  if (!IsDirectory(input)) return input;
  // safetensors first, as transformers' from_pretrained prefers it when a folder holds both.
  for (const char* name : {"model.safetensors.index.json", "model.safetensors"}) {
    if (PathExists(JoinPath(input, name))) return JoinPath(input, name);
  }
  SC_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDir(input));
  std::vector<std::string> indexes, torch_indexes;
  for (const std::string& n : names) {
    if (EndsWith(n, ".safetensors.index.json")) indexes.push_back(n);
    if (EndsWith(n, ".bin.index.json")) torch_indexes.push_back(n);
  }
  if (indexes.size() == 1) return JoinPath(input, indexes[0]);
  if (indexes.empty() && PathExists(JoinPath(input, "pytorch_model.bin.index.json"))) {
    return JoinPath(input, "pytorch_model.bin.index.json");
  }
  if (indexes.empty() && torch_indexes.size() == 1) return JoinPath(input, torch_indexes[0]);
  if (indexes.empty() && torch_indexes.empty() && PathExists(JoinPath(input, "pytorch_model.bin"))) {
    return JoinPath(input, "pytorch_model.bin");
  }
  const size_t many = indexes.empty() ? torch_indexes.size() : indexes.size();
  return InvalidArgument("cannot import the folder '" + input + "': it holds " +
                         (many == 0 ? std::string("no model.safetensors, *.safetensors.index.json, pytorch_model.bin "
                                                  "or *.bin.index.json")
                                    : std::to_string(many) + (indexes.empty() ? " *.bin.index.json" : " *.safetensors.index.json") +
                                          " files; name one"));
}

}  // namespace shardckpt
