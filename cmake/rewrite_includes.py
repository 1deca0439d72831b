#!/usr/bin/env python3
"""Rewrites `#include "io/...", "engine/...", "collectives/..."` to `#include "shardckpt/io/..."`
etc. in every file git knows of (tracked, or untracked and not ignored) under the repository:
C++ sources and headers, and the code blocks of Markdown pages.

The installed headers live under <prefix>/include/shardckpt/, so they must name each other with
that prefix; the build tree resolves the same paths (cmake/IncludeRoot.cmake). Idempotent: an
include that already starts with shardckpt/ is left alone, so it can be run again after merging
branches that added old-style includes.

Usage: python3 cmake/rewrite_includes.py [--check] [REPO_ROOT]
  --check  change nothing; list the includes still to rewrite and exit 1 if there are any.
"""
import pathlib
import re
import subprocess
import sys

FOLDERS = ("io", "engine", "collectives")
SUFFIXES = {".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".md"}
PATTERN = re.compile(r'^(\s*#\s*include\s+[<"])(%s)/' % "|".join(FOLDERS), re.MULTILINE)


def files(root):
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], check=True, capture_output=True).stdout
    for name in sorted(set(listed.decode().split("\0"))):
        path = root / name
        if name and path.suffix in SUFFIXES and path.is_file() and not path.is_symlink():
            yield path


def main(argv):
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    root = pathlib.Path(args[0] if args else ".").resolve()
    changed = 0
    for path in files(root):
        text = path.read_text(encoding="utf-8")
        new, count = PATTERN.subn(r"\1shardckpt/\2/", text)
        if count == 0:
            continue
        changed += 1
        rel = path.relative_to(root)
        if check:
            for line in text.splitlines():
                if PATTERN.match(line):
                    print(f"{rel}: {line.strip()}")
        else:
            path.write_text(new, encoding="utf-8")
            print(f"{rel}: {count} include(s)")
    if check and changed:
        print(f"{changed} file(s) still include without the shardckpt/ prefix; run "
              f"python3 cmake/rewrite_includes.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
