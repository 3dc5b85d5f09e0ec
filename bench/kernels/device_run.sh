#!/usr/bin/env bash
# One device call. The default stage: CUDA parity tests (one process per suite, so a crash in one leaves the
# others' results), a memcheck pass over the short tiled-attention cases, then the decode-attention benchmark and
# its PyTorch SDPA peer. The `prefill` stage: the prefill-attention parity cases and benchmark under each prefill
# kernel (SE_PREFILL_KERNEL: hopper, tiled), and its SDPA peer. Binaries come from a bundle built
# here with shared/tools/device-bundle:
#   bench/kernels/device_run.sh BUNDLE_DIR OUT_DIR [--quick | prefill [--quick] ["KERNEL ..."]]
set -uo pipefail
bundle=$1
out=$2
stage=${3:-}
export LD_LIBRARY_PATH=$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
if [ "$stage" = prefill ]; then
  # Each kernel's parity, then its benchmark; the warp-specialized one first under the sanitizers (short cases).
  # Every step has a time limit that keeps a hung kernel from taking the call with it; KERNELS narrows the list
  # when one call cannot hold them all.
  quick=""; [ "${4:-}" = --quick ] && { quick=--quick; shift; }
  kernels=${4:-"hopper tiled"}
  short='CudaPagedAttentionTest.TiledMatchesCpuOnShortContexts'
  for kernel in $kernels; do
    export SE_PREFILL_KERNEL=$kernel
    if [ "$kernel" != tiled ] && command -v compute-sanitizer > /dev/null; then
      for tool in memcheck synccheck; do
        timeout -k 5 90 compute-sanitizer --tool $tool --error-exitcode 9 --print-limit 5 "$bundle/backend_cuda_test" \
          --gtest_filter="$short" > "$out/${tool}_$kernel.log" 2>&1
        echo "$tool $kernel exit $?: $(grep -E 'ERROR SUMMARY' "$out/${tool}_$kernel.log" | tail -1)"
      done
    fi
    timeout -k 5 150 "$bundle/backend_cuda_test" --gtest_filter='CudaPagedAttentionTest.Tiled*' \
      > "$out/parity_$kernel.log" 2>&1
    echo "parity $kernel exit $?"
    grep -E "^\[ +FAILED |Failure|Check failed" "$out/parity_$kernel.log" | head -10
    timeout -k 5 90 "$bundle/prefill_attention_bench" $quick --csv "$out/prefill_$kernel.csv" > "$out/prefill_$kernel.log" 2>&1
    echo "prefill bench $kernel exit $?"
    cat "$out/prefill_$kernel.log"
  done
  unset SE_PREFILL_KERNEL
  PYTHONUNBUFFERED=1 timeout -k 5 120 python3 -W ignore::UserWarning bench/kernels/sdpa_prefill_bench.py $quick \
    --csv "$out/sdpa_prefill.csv" > "$out/sdpa_prefill.log" 2>&1
  echo "sdpa exit $?"
  cat "$out/sdpa_prefill.log"
  exit 0
fi
quick=$stage
for suite in 'CudaOpsTest.*' 'CudaLinearTest.*' '*Simple*' '*Tiled*'; do
  "$bundle/backend_cuda_test" --gtest_filter="$suite" >> "$out/tests.log" 2>&1
  echo "suite $suite exit $?"
done
grep -E "^\[ +(FAILED|OK|PASSED) |Failure|Check failed|error" "$out/tests.log" | head -40
grep PARITY "$out/tests.log" > "$out/parity.txt"
if command -v compute-sanitizer > /dev/null; then
  timeout 120 compute-sanitizer --tool memcheck --print-limit 5 "$bundle/backend_cuda_test" \
    --gtest_filter='*TiledMatchesCpuOnShortContexts*' > "$out/memcheck.log" 2>&1
  echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
fi
"$bundle/decode_attention_bench" $quick --csv "$out/bench.csv" 2>&1 | tee "$out/bench.log"
PYTHONUNBUFFERED=1 python3 -W ignore::UserWarning bench/kernels/sdpa_decode_bench.py $quick --csv "$out/sdpa.csv" 2>&1 | tee "$out/sdpa.log"
