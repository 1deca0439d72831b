#!/usr/bin/env bash
# Installs the build into a fresh prefix and uses it as a project outside this tree would:
# examples/cpp built through find_package(shardckpt) (shared and static) and through pkg-config,
# each run under mpirun, saving and loading back a resharded checkpoint.
#   install_case.sh BUILD_DIR WORK_DIR SOURCE_DIR
set -euo pipefail
build=$(realpath "$1"); work=$2; src=$(realpath "$3")
rm -rf "$work"; mkdir -p "$work"; work=$(realpath "$work")
prefix=$work/prefix
fail() { echo "FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" > "$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }
libdir=""
for d in "$prefix"/lib "$prefix"/lib64 "$prefix"/lib/*-linux-gnu; do
  if [ -z "$libdir" ] && [ -e "$d/libshardckpt_engine.a" ]; then libdir=$d; fi
done
[ -n "$libdir" ] || fail "no libshardckpt_engine.a under $prefix"

# What is installed: versioned shared libraries with their SONAME, static ones, headers under
# include/shardckpt/<folder>/, the CMake package, the .pc file, the CLI, the docs.
for lib in io communicator collectives model formats engine; do
  [ -f "$libdir/libshardckpt_$lib.a" ] || fail "missing libshardckpt_$lib.a"
  [ -L "$libdir/libshardckpt_$lib.so" ] || fail "missing libshardckpt_$lib.so"
  soname=$(readelf -d "$libdir/libshardckpt_$lib.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
  [ "$soname" = "libshardckpt_$lib.so.0" ] || fail "libshardckpt_$lib.so has SONAME '$soname'"
  [ -e "$libdir/$soname" ] || fail "missing $soname"
done
for f in include/shardckpt/engine/core/load.h include/shardckpt/io/status.h \
         include/shardckpt/collectives/mpi_communicator.h bin/shardckpt; do
  [ -e "$prefix/$f" ] || fail "missing $f"
done
[ -f "$libdir/cmake/shardckpt/shardckptConfig.cmake" ] || fail "missing the CMake package"
[ -f "$libdir/pkgconfig/shardckpt.pc" ] || fail "missing shardckpt.pc"
ls "$prefix"/share/doc/shardckpt/format.md "$prefix"/share/doc/shardckpt/architecture.md > /dev/null \
  || fail "docs not installed"

# Installed headers name each other with the shardckpt/ prefix only.
if grep -rnE '#\s*include\s+"(io|engine|collectives)/' "$prefix/include"; then
  fail "installed headers include without the shardckpt/ prefix (python3 cmake/rewrite_includes.py)"
fi

# Single-process programs need no MPI; the pure model needs no MPI, OpenSSL or libdeflate.
needed() { readelf -d "$1" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p'; }
needed "$prefix/bin/shardckpt" | grep -E '^libmpi' && fail "the shardckpt CLI links MPI"
needed "$libdir/libshardckpt_engine.so" | grep -E '^libmpi' && fail "libshardckpt_engine links MPI"
needed "$libdir/libshardckpt_model.so" | grep -E '^(libmpi|libcrypto|libdeflate)' \
  && fail "libshardckpt_model links MPI, OpenSSL or libdeflate"

export PKG_CONFIG_PATH=$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
# Every installed header compiles on its own with only the package's flags.
cflags=$(pkg-config --cflags shardckpt) || fail "pkg-config --cflags shardckpt"
(cd "$prefix/include" && find shardckpt -name '*.h' ! -name torch_adapter.h ! -name cuda_device_scope.h \
   ! -name nccl_communicator.h) | sort > "$work/headers"
[ "$(wc -l < "$work/headers")" -gt 30 ] || fail "only $(wc -l < "$work/headers") headers installed"
# shellcheck disable=SC2086
xargs -P2 -I{} sh -c "echo '#include <{}>' | c++ -std=c++17 -fsyntax-only $cflags -x c++ - \
  || { echo 'FAIL: {} does not compile alone'; exit 255; }" < "$work/headers"

mpi=(mpirun --oversubscribe --mca btl self,vader,tcp)
[ "$(id -u)" -eq 0 ] && mpi+=(--allow-run-as-root)
check_run() {  # check_run NAME NP PROGRAM: runs it, checks bytes loaded == bytes saved
  local name=$1 np=$2 program=$3 out
  out=$("${mpi[@]}" -np "$np" "$program" "$work/ckpt-$name" 2>&1) || { echo "$out"; fail "$name: exit status"; }
  echo "$name: $out"
  local saved loaded
  saved=$(echo "$out" | sed -n 's/^saved \([0-9]*\) bytes from '"$np"' ranks.*/\1/p')
  loaded=$(echo "$out" | sed -n 's/^loaded \([0-9]*\) bytes resharded, every value as saved$/\1/p')
  [ -n "$saved" ] && [ "$saved" = "$loaded" ] || fail "$name: saved '$saved' bytes, loaded '$loaded'"
  # 96x40 + 50x24 float32
  [ "$saved" = 20160 ] || fail "$name: saved $saved bytes, expected 20160"
  "$prefix/bin/shardckpt" verify "$work/ckpt-$name" > "$work/verify-$name.log" 2>&1 \
    || { cat "$work/verify-$name.log"; fail "$name: the installed CLI does not verify the checkpoint"; }
}

# find_package(shardckpt), shared libraries: they must come from the prefix, not the build tree.
for variant in shared static; do
  static=OFF; [ $variant = static ] && static=ON
  cmake -S "$src/examples/cpp" -B "$work/cmake-$variant" -DCMAKE_PREFIX_PATH="$prefix" \
        -DEXAMPLE_STATIC=$static > "$work/cmake-$variant.log" 2>&1 \
    && cmake --build "$work/cmake-$variant" >> "$work/cmake-$variant.log" 2>&1 \
    || { cat "$work/cmake-$variant.log"; fail "find_package consumer ($variant)"; }
done
# (ldd's output is taken whole: grep -q ending a pipe early would fail it under pipefail)
libs=$(ldd "$work/cmake-shared/save_load")
grep -q "$libdir/libshardckpt_engine.so.0" <<< "$libs" \
  || { echo "$libs"; fail "the shared consumer does not load the installed library"; }
libs=$(ldd "$work/cmake-static/save_load")
grep -q libshardckpt <<< "$libs" && fail "the static consumer loads a shared shardckpt"
check_run cmake-shared 2 "$work/cmake-shared/save_load"
check_run cmake-static 3 "$work/cmake-static/save_load"

# The libtorch adapter, where it was built: the package finds Torch for the consumer (configure only).
if [ -e "$libdir/libshardckpt_torch.so" ]; then
  mkdir -p "$work/torch-consumer"
  cat > "$work/torch-consumer/CMakeLists.txt" <<'CMAKE'
cmake_minimum_required(VERSION 3.18)
project(torch_consumer CXX)
find_package(shardckpt CONFIG REQUIRED COMPONENTS torch)
foreach(target shardckpt::torch shardckpt::torch_static torch)
  if(NOT TARGET ${target})
    message(FATAL_ERROR "no ${target}")
  endif()
endforeach()
CMAKE
  cmake -S "$work/torch-consumer" -B "$work/torch-consumer/build" -DCMAKE_PREFIX_PATH="$prefix" \
        > "$work/torch-consumer.log" 2>&1 || { cat "$work/torch-consumer.log"; fail "find_package(shardckpt COMPONENTS torch)"; }
  # Without Torch, the component's absence is explained, not only "NOT FOUND".
  if cmake -S "$work/torch-consumer" -B "$work/torch-consumer/build-no-torch" -DCMAKE_PREFIX_PATH="$prefix" \
        -DCMAKE_DISABLE_FIND_PACKAGE_Torch=ON > "$work/no-torch.log" 2>&1; then
    fail "find_package(shardckpt COMPONENTS torch) succeeded without Torch"
  fi
  # (cmake wraps the reason at spaces: compared with the whitespace folded)
  tr -s ' \n' '  ' < "$work/no-torch.log" | grep -qF "shardckpt::torch needs Torch, which find_package(Torch) did not find: install libtorch-dev (Debian) or set Torch_DIR" ||
    { cat "$work/no-torch.log"; fail "no reason given for the missing torch component"; }
fi

# pkg-config.
mkdir -p "$work/pc"
make -C "$work/pc" -f "$src/examples/cpp/Makefile" > "$work/pc.log" 2>&1 || { cat "$work/pc.log"; fail "pkg-config consumer"; }
check_run pkg-config 3 "$work/pc/save_load_pc"
echo "install case: ok"
