#!/usr/bin/env bash
# Builds SparseEngine and runs the whole CPU test suite (every CTest label except `cuda`, which needs the GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
ctest --test-dir build --output-on-failure -LE cuda -j"$(nproc)" "$@"
