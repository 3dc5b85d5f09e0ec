#!/usr/bin/env bash
# Configures and builds SparseEngine into build/ (CUDA objects too where nvcc exists).
set -euo pipefail
cd "$(dirname "$0")/.."
# Hash paths relative to the checkout, so a fresh clone elsewhere (CI) reuses the compiler cache.
export CCACHE_BASEDIR="$PWD"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build -j"$(nproc)"
