#!/usr/bin/env bash
# Builds SparseEngine and runs the whole CPU test suite (every CTest label except `cuda`, which needs the GPU).
#   scripts/test.sh [--sanitize address|undefined|thread] [CTEST ARGS...]
# With --sanitize, the sanitizer build (scripts/build.sh --sanitize) runs the tests instead; any report fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=build
if [[ ${1:-} == --sanitize ]]; then
  scripts/build.sh --sanitize "${2:?"--sanitize needs address, undefined or thread"}"
  build_dir=build-$2
  shift 2
else
  scripts/build.sh
fi
# The tests run in parallel and most use every core through OpenMP: spinning idle workers (libgomp's default) take
# the cores another test is computing on, and a pair of model tests ran 6x slower than with sleeping workers.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
ctest --test-dir "$build_dir" --output-on-failure -LE cuda -j"$(nproc)" "$@"
