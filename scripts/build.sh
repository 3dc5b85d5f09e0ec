#!/usr/bin/env bash
# Configures and builds SparseEngine into build/ (CUDA objects too where nvcc exists).
set -euo pipefail
cd "$(dirname "$0")/.."
# Hash paths relative to the checkout, so a fresh clone elsewhere (CI) reuses the compiler cache.
export CCACHE_BASEDIR="$PWD"
# The build carries debug info, for which ccache would also hash the build directory: another checkout would then
# miss every object. Only the debug info's compile directory differs between checkouts, so leave it out.
export CCACHE_NOHASHDIR=true
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build -j"$(nproc)"
