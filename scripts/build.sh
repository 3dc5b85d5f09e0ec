#!/usr/bin/env bash
# Configures and builds SparseEngine into build/ (CUDA objects too where nvcc exists).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C build -j"$(nproc)"
