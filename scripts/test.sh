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
  # Stop at the first report (ASan and UBSan do; TSan would otherwise go on and only change the exit code). libgomp is not built with
  # TSan, so its barriers read as races: under TSan the CPU kernels run on one OpenMP thread and the threads TSan
  # checks are the engine's, the server's and the tests' own.
  export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
  if [[ $2 == thread ]]; then export OMP_NUM_THREADS=1; fi
  shift 2
else
  scripts/build.sh
fi
# The tests run in parallel and most use every core through OpenMP: spinning idle workers (libgomp's default) take
# the cores another test is computing on, and a pair of model tests ran 6x slower than with sleeping workers.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
ctest --test-dir "$build_dir" --output-on-failure -LE cuda -j"$(nproc)" "$@"
