#!/usr/bin/env bash
# Configures and builds SparseEngine into build/ (CUDA objects too where nvcc exists).
#   scripts/build.sh [--sanitize address|undefined|thread] [TARGET...]
# With --sanitize the build goes to its own folder, build-<kind> (address also turns on undefined), CPU only.
# TARGETs: build only those (default: everything).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build
cmake_args=(-DCMAKE_BUILD_TYPE=RelWithDebInfo)
if [[ ${1:-} == --sanitize ]]; then
  kind=${2:?"--sanitize needs address, undefined or thread"}
  case $kind in
    address) sanitizers=address,undefined ;;
    undefined | thread) sanitizers=$kind ;;
    *) echo "scripts/build.sh: unknown sanitizer '$kind' (address, undefined, thread)" >&2; exit 2 ;;
  esac
  build_dir=build-$kind
  cmake_args+=(-DSE_SANITIZE="$sanitizers" -DSE_CUDA=OFF)
  shift 2
fi
# Hash paths relative to the checkout, so a fresh clone elsewhere (CI) reuses the compiler cache.
export CCACHE_BASEDIR="$PWD"
# The build carries debug info, for which ccache would also hash the build directory: another checkout would then
# miss every object. Only the debug info's compile directory differs between checkouts, so leave it out.
export CCACHE_NOHASHDIR=true
cmake -S . -B "$build_dir" -G Ninja "${cmake_args[@]}" >/dev/null
ninja -C "$build_dir" -j"$(nproc)" "$@"
