#!/usr/bin/env bash
# Splits the flat engine/ folder into one folder, and one library, per layer
# (docs/architecture.md):
#   engine/model/    shardckpt_model    dtypes, layouts, regions, coverage, manifest, state, planners
#   engine/formats/  shardckpt_formats  zip, pickle, safetensors, the checksummed output file
#   engine/core/     shardckpt_engine   save, load, async, shard writer, extent reader, verify,
#                                       consolidate, import/convert, offline writer, commit, ...
#   engine/torch/    shardckpt_torch    the libtorch adapter
# with git mv (history follows), every include and every path mention (sources, CMake, docs,
# scripts) rewritten, and the folders' CMakeLists.txt written. The targets and what they link
# are those engine/CMakeLists.txt already defines; only the folders change.
#
# Run it at the repository root on a clean tree, after merging the branches that edit engine/:
#   bash cmake/restructure_engine.sh            # check, move, rewrite; then build, test, commit
#   bash cmake/restructure_engine.sh --check    # only the checks: classification and layering
#
# Files not named below are classified by name (pickle/zip/safetensors/dcp/gguf: formats) or go to
# core. Before touching anything it refuses, naming the files, when:
# - a model file includes a formats or core header, or a formats file a core header (the layers
#   would not link; move the file by editing the lists below);
# - engine/CMakeLists.txt compiles a file this script does not know how to place, misses one of
#   engine/'s sources, or holds commands other than the three libraries and the adapter (port
#   them to the new CMakeLists.txt by hand, then rerun with --force).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mode=move
force=0
for arg in "$@"; do
  case "$arg" in
    --check) mode=check ;;
    --force) force=1 ;;
    *) echo "usage: $0 [--check] [--force]" >&2; exit 2 ;;
  esac
done
[ -d engine/model ] && { echo "engine/model exists: already restructured" >&2; exit 1; }
if [ "$mode" = move ] && [ -n "$(git status --porcelain)" ]; then
  echo "the working tree has changes; commit or stash them first" >&2
  git status --short >&2
  exit 1
fi
# Includes first take the installed form ("shardckpt/engine/..."), which the rewrite below expects.
if [ "$mode" = move ]; then
  python3 cmake/rewrite_includes.py > /dev/null
fi

SHARDCKPT_MODE=$mode SHARDCKPT_FORCE=$force python3 - <<'PY'
import os
import pathlib
import re
import subprocess
import sys

MODEL = ["dtype", "layout", "region_index", "coverage", "manifest", "state", "save_plan",
         "read_plan", "float_convert", "wire"]
FORMATS = ["zip_writer", "zip_reader", "torch_pickle", "torch_file", "safetensors", "output_file"]
TORCH = ["torch_adapter"]
FORMAT_WORDS = ("pickle", "zip", "safetensors", "dcp", "gguf")

mode = os.environ["SHARDCKPT_MODE"]
force = os.environ["SHARDCKPT_FORCE"] == "1"
engine = pathlib.Path("engine")
units = sorted({p.stem for p in engine.iterdir() if p.suffix in (".h", ".cc", ".cu")})


def layer(stem):
    if stem in MODEL:
        return "model"
    if stem in FORMATS or any(w in stem for w in FORMAT_WORDS):
        return "formats"
    if stem in TORCH:
        return "torch"
    return "core"


place = {stem: layer(stem) for stem in units}
for sub in ("model", "formats", "core", "torch"):
    print(f"engine/{sub}: " + " ".join(s for s in units if place[s] == sub))

problems = []
# Layering: a layer includes only itself and the layers below it.
below = {"model": {"model"}, "formats": {"model", "formats"}, "core": {"model", "formats", "core"},
         "torch": {"model", "formats", "core", "torch"}}
include = re.compile(r'^\s*#\s*include\s+"(?:shardckpt/)?engine/(\w+)\.h"', re.MULTILINE)
for path in sorted(engine.iterdir()):
    if path.suffix not in (".h", ".cc", ".cu"):
        continue
    mine = place[path.stem]
    for used in include.findall(path.read_text()):
        if used in place and place[used] not in below[mine]:
            problems.append(f"{path} ({mine}) includes engine/{used}.h ({place[used]})")

# engine/CMakeLists.txt: the sources it compiles are exactly engine/'s, and nothing else is there.
cmake_text = (engine / "CMakeLists.txt").read_text()
listed = set(re.findall(r"\b(\w+)\.(?:cc|cu)\b", cmake_text))
present = {p.stem for p in engine.iterdir() if p.suffix in (".cc", ".cu")}
for stem in sorted(present - listed):
    problems.append(f"engine/{stem}.cc is not compiled by engine/CMakeLists.txt: place it by hand")
for stem in sorted(listed - present):
    problems.append(f"engine/CMakeLists.txt compiles {stem} which is not in engine/")
known = {"add_library", "target_link_libraries", "if", "endif", "find_package"}
commands = set(re.findall(r"^\s*(\w+)\s*\(", re.sub(r"#.*", "", cmake_text), re.MULTILINE))
for command in sorted(commands - known):
    message = f"engine/CMakeLists.txt uses {command}(): port it to the new CMakeLists.txt by hand"
    if force:
        print("warning: " + message + " (--force: going on)")
    else:
        problems.append(message + ", then rerun with --force")
if problems:
    print("\n".join(["refused:"] + problems), file=sys.stderr)
    sys.exit(1)
if mode == "check":
    print("checks passed")
    sys.exit(0)

# Move.
for sub in ("model", "formats", "core", "torch"):
    (engine / sub).mkdir()
for path in sorted(engine.iterdir()):
    if path.is_file() and path.suffix in (".h", ".cc", ".cu"):
        subprocess.run(["git", "mv", str(path), str(engine / place[path.stem] / path.name)], check=True)

# Rewrite includes ("shardckpt/engine/x.h") and path mentions ("engine/x.h", "engine/x.*",
# "engine/x.cc") everywhere git knows of.
stems = "|".join(sorted(place, key=len, reverse=True))
# "engine/x.h" as a path of its own or after "shardckpt/" (includes, installed paths), not inside
# another path ("tests/engine/x.h").
mention = re.compile(r"(?:(?<=shardckpt/)|(?<![\w/.-]))engine/(%s)(?=\.(?:h\b|cc\b|cu\b|\*))" % stems)
tracked = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                        check=True, capture_output=True).stdout.decode().split("\0")
text_suffixes = {".h", ".hpp", ".cc", ".cpp", ".cu", ".md", ".txt", ".cmake", ".sh", ".py", ".in", ".json"}
for name in sorted(set(tracked)):
    path = pathlib.Path(name)
    if not name or not path.is_file() or path.suffix not in text_suffixes:
        continue
    if name == "cmake/restructure_engine.sh":
        continue
    text = path.read_text(encoding="utf-8")
    new = mention.sub(lambda m: f"engine/{place[m.group(1)]}/{m.group(1)}", text)
    if new != text:
        path.write_text(new, encoding="utf-8")
        print(f"rewrote {name}")


def sources(sub, exclude=()):
    names = sorted(p.name for p in (engine / sub).iterdir()
                   if p.suffix in (".cc", ".cu") and p.stem not in exclude)
    lines, line = [], " "
    for n in names:
        if len(line) + len(n) + 1 > 98:
            lines.append(line)
            line = " "
        line += " " + n
    lines.append(line)
    return "\n".join(lines)


(engine / "CMakeLists.txt").write_text("""\
# The engine, one folder and one library per layer (docs/architecture.md); each links only the
# layers below it and what it uses itself.
add_subdirectory(model)
add_subdirectory(formats)
add_subdirectory(core)
if(SHARDCKPT_WITH_TORCH)
  add_subdirectory(torch)
endif()
""")
(engine / "model" / "CMakeLists.txt").write_text(f"""\
# The pure model: dtypes, layouts and their region geometry, coverage, the manifest schema and
# validation, the save and read planners. No I/O, no MPI, no OpenSSL, no zlib; tested by tables.
add_library(shardckpt_model
{sources("model")})
target_link_libraries(shardckpt_model PUBLIC shardckpt_io nlohmann_json::nlohmann_json)
""")
(engine / "formats" / "CMakeLists.txt").write_text(f"""\
# File-format codecs: zip, the restricted pickle reader and writer, safetensors, and the
# checksummed output file they write through (OpenSSL for SHA-256, zlib for CRC-32).
add_library(shardckpt_formats
{sources("formats")})
target_link_libraries(shardckpt_formats PUBLIC shardckpt_model OpenSSL::Crypto PRIVATE ZLIB::ZLIB)
""")
(engine / "core" / "CMakeLists.txt").write_text(f"""\
# The engine proper: save, load, async save, the shard writer and extent reader, the commit
# protocol, verify, consolidate, import. Talks to other ranks only through the Communicator
# interface, so it needs no MPI itself.
add_library(shardckpt_engine
{sources("core")})
target_link_libraries(shardckpt_engine PUBLIC shardckpt_model shardckpt_formats shardckpt_communicator)
""")
(engine / "torch" / "CMakeLists.txt").write_text(f"""\
# The thin libtorch adapter (at::Tensor to and from the engine's plain buffers).
add_library(shardckpt_torch
{sources("torch")})
target_link_libraries(shardckpt_torch PUBLIC shardckpt_engine torch)
""")
subprocess.run(["git", "add", "engine"], check=True)

# Anything else that names engine sources by path (other CMakeLists, scripts) is listed for review.
left = subprocess.run(["git", "grep", "-nE", r"(^|[^/\w])engine/(%s)\.(h|cc)" % stems],
                      capture_output=True, text=True).stdout
if left.strip():
    print("still naming the old paths (review):\n" + left)
PY

if [ "$mode" = move ]; then
  python3 cmake/rewrite_includes.py --check
  cat <<'EOF'

engine/ restructured. Next:
  bash launch/build.sh && ctest --test-dir build -L unit --output-on-failure
  git add -A && git commit -m "Split engine/ into model, formats, core and torch folders (cmake/restructure_engine.sh)"
EOF
fi
