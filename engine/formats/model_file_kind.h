// Which model file format a file is, by its name where that says and by its first bytes
// otherwise: `import` reads any of them, and a tool handed one where a checkpoint is expected
// points to `import` rather than calling it "a file".
#pragma once

#include <string>

#include "shardckpt/io/status.h"

namespace shardckpt {

enum class ModelFileKind { kTorch, kTorchIndex, kSafetensors, kSafetensorsIndex };

// Whether `path` is named as a file `import` reads: .pt, .pth, .bin, .safetensors or a
// *.safetensors.index.json (a torch.save or transformers file, or what consolidate wrote).
bool IsImportableFileName(const std::string& path);

// What `file` holds: by its name where that says (.pt, .pth, .bin, .safetensors, an index), else
// by its first bytes, so that a torch.save file under any name counts (Lightning's .ckpt, the
// classic model_best.pth.tar): a zip whose first record is ARCHIVE/data.pkl or the legacy
// format's magic number is torch.save's, an 8-byte header length followed by '{' a safetensors
// file's. Refused, saying what the file is instead: a folder, a zip of something else, anything
// else.
Result<ModelFileKind> ModelFileKindOf(const std::string& file);

// The model file `input` names: itself when it is no folder; in a folder (a Hugging Face set, or
// one model.safetensors) its index or single file, as transformers' from_pretrained would take
// (safetensors first). A folder holding none, or several indexes, is refused, saying so.
Result<std::string> ResolveModelFile(const std::string& input);

}  // namespace shardckpt
