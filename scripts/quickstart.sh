#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a running server: installs the dependencies and the default
# model (SmolLM2-135M-Instruct), builds, and serves it on port 8000 (extra arguments go to `serve`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec build/sparse-engine serve --model default "$@"
