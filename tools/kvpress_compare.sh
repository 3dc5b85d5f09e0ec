#!/usr/bin/env bash
# The kvpress comparison of docs/fidelity.md, end to end. Two halves:
#
#   here (no GPU, no torch):   bash tools/kvpress_compare.sh prepare [DIR]
#     builds method_model_tool, writes the random checkpoint and the plan into DIR (default .kvcmp, git-excluded),
#     runs our methods on it (ours.json), bundles our tool (DIR/bundle) and copies the kvpress wheel (DIR/whl;
#     download it first: pip download --no-deps -d /tmp/wheels kvpress==0.5.5)
#   on the GPU machine:        bash tools/kvpress_compare.sh device [DIR] [OUT]
#     installs the wheel (no dependencies: the machine's torch and transformers are used), runs our tool on that
#     machine's CPU (a cross-check that ours.json does not depend on the machine), every press in fp32 and fp64 on
#     the GPU, and the comparison; everything lands in OUT (default $OUT)
#
# SE_BUILD_DIR picks the build directory of the prepare step (default build); KVCMP_DEVICE=cpu runs the device
# step's presses on the CPU (a dry run of the script where torch is installed without a GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
step=${1:?usage: $0 prepare|device [DIR] [OUT]}
dir=$(realpath -m "${2:-.kvcmp}")

if [ "$step" = prepare ]; then
  set -e
  build=${SE_BUILD_DIR:-build}
  py=${PYTHON:-.venv/bin/python}
  ninja -C "$build" method_model_tool
  mkdir -p "$dir/whl"
  "$py" tools/kvpress_compare.py checkpoint "$dir/ckpt"
  "$py" tools/kvpress_compare.py plan "$dir/ckpt" "$dir/plan.json"
  "$build/tests/sparse/method_model_tool" "$dir/ckpt" "$dir/plan.json" "$dir/ours.json"
  rm -rf "$dir/bundle"
  ../shared/tools/device-bundle "$dir/bundle" "$build/tests/sparse/method_model_tool"
  strip "$dir/bundle/method_model_tool"
  cp /tmp/wheels/kvpress-0.5.5-py3-none-any.whl "$dir/whl/"
  exit 0
fi

[ "$step" = device ] || { echo "unknown step $step" >&2; exit 2; }
out=${3:-${OUT:?set OUT or pass the output folder}}
mkdir -p "$out"
log="$out/run.log"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$dir"/whl/*.whl \
  || exit 1
export PYTHONPATH=/tmp/site
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "cpus: $(nproc)  $(grep -m1 'model name' /proc/cpuinfo)"
  python3 -c 'import sys, torch, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "transformers", transformers.__version__)'
} >>"$log" 2>&1

ours_pid=
if [ -x "$dir/bundle/method_model_tool" ]; then
  ( start=$(date +%s)
    LD_LIBRARY_PATH="$dir/bundle/lib" timeout 500 "$dir/bundle/method_model_tool" "$dir/ckpt" "$dir/plan.json" \
      "$out/ours_device.json"
    echo "ours on the device CPU: rc=$? in $(( $(date +%s) - start )) s" ) >>"$out/ours_device.log" 2>&1 &
  ours_pid=$!
fi
for dtype in float32 float64; do
  start=$(date +%s)
  python3 tools/kvpress_compare.py kvpress "$dir/ckpt" "$dir/plan.json" "$out/kvpress_$dtype.json" \
    --device "${KVCMP_DEVICE:-cuda}" --dtype "$dtype" 2>&1 | grep -v -e 'KVzipPress requires' -e 'Loading weights' >>"$log"
  echo "kvpress $dtype: $(( $(date +%s) - start )) s" >>"$log"
done
if [ -n "$ours_pid" ]; then
  wait "$ours_pid"
  cat "$out/ours_device.log" >>"$log"
  python3 - "$dir/ours.json" "$out/ours_device.json" >>"$log" 2>&1 <<'EOF'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
same = [x["kept"] == y["kept"] for x, y in zip(a["runs"], b["runs"])]
print(f"ours here vs ours on the device CPU: {sum(same)}/{len(same)} runs identical, {len(a['runs'])} vs {len(b['runs'])} runs")
EOF
fi
python3 tools/kvpress_compare.py compare "$dir/plan.json" "$dir/ours.json" "$out/kvpress_float32.json" \
  --reference "$out/kvpress_float64.json" --markdown "$out/table.md" --json "$out/compare.json" >>"$log" 2>&1
rm -f "$out/ours_device.log"
cat "$log"
