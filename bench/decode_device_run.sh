#!/usr/bin/env bash
# The long-context decode benchmark on the device machine, from a bundle built here with shared/tools/device-bundle
# (sparse-engine plus the CUDA test binaries):
#   bench/decode_device_run.sh BUNDLE_DIR OUT_DIR tests         CUDA parity of the sparse methods' kernels, every
#                                                               method on the GPU engine, graph vs eager decode
#   bench/decode_device_run.sh BUNDLE_DIR OUT_DIR sweep CONTEXTS DENSE_BATCHES SPARSE_BATCHES METHODS
#                                                               `bench decode` over methods (decode_sweep.py), CSV
#                                                               under OUT_DIR
#   bench/decode_device_run.sh BUNDLE_DIR OUT_DIR longgen OUTPUT_LEN BUDGET CONCURRENCIES METHODS [KV_MEMORY]
#                                                               the long-generation benchmark of decode-time
#                                                               compression (long_generation_sweep.py): 1,024-token
#                                                               prompts, OUTPUT_LEN tokens each, one KV pool of
#                                                               KV_MEMORY (default 64G: an H200) for every method,
#                                                               REQUESTS_PER_SLOT x C requests (default 1),
#                                                               ADMISSION (--admission, default optimistic), CSV
#                                                               and report under OUT_DIR
#   bench/decode_device_run.sh BUNDLE_DIR OUT_DIR hf CONTEXT BATCHES   HF transformers dense decode, same shape
#   bench/decode_device_run.sh BUNDLE_DIR OUT_DIR profile CONTEXT BATCH [ARGS...]
#                                                               ncu kernel times of eager decode steps, the timed
#                                                               window only (profile_decode.py), extra bench
#                                                               decode ARGS;
#                                                               NCU_CONTROL=none keeps the real clocks and warm
#                                                               caches (ncu's default locks base clocks and
#                                                               flushes the caches before every kernel)
# The model is bench/models/llama-3.1-8b (dummy bf16 weights), or the folder DECODE_MODEL names.
set -uo pipefail
bundle=$1
out=$2
stage=$3
export LD_LIBRARY_PATH=$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
model=${DECODE_MODEL:-bench/models/llama-3.1-8b}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv,noheader >> "$out/gpu.txt"
case $stage in
  tests)
    for suite in 'CudaEvictionOps*' 'CudaSelectedAttentionTest.*' 'CudaPageKeyBoundsTest.*' \
                 'CudaAttentionLogitsMaxOverHeadsTest.*' 'CudaPagedAttentionTest.*:CudaOpsTest.*' \
                 'CudaArgmaxTest.*:CudaSampleRowsTest.*:CudaConstrainedSamplingTest.*' 'CudaMoeTest.*' \
                 'CudaDecodeScoringOpsTest.*' 'CudaFp8KvStoreTest.*'; do
      timeout 300 "$bundle/backend_cuda_test" --gtest_filter="$suite" >> "$out/kernels.log" 2>&1
      echo "backend_cuda_test $suite exit $?"
    done
    timeout 400 "$bundle/engine_cuda_test" \
      --gtest_filter='GpuEngineTest.*:GpuModelTest.Tiny*:GpuModelTest.Fp8Dummy*:GpuModelTest.StreamedMoe*' \
      > "$out/engine.log" 2>&1
    echo "engine_cuda_test exit $?"
    grep -hE "^\[ +(FAILED|PASSED) |Failure|Check failed|what\(\)" "$out/kernels.log" "$out/engine.log" | head -40
    grep -h "PARITY method" "$out/engine.log"
    ;;
  sweep)
    python3 bench/decode_sweep.py --binary "$bundle/sparse-engine" --model $model --contexts "$4" \
      --batches "$5" --sparse-batches "$6" --methods "$7" --csv "$out/decode.csv" \
      -- --gpu-memory-utilization 0.92 --max-num-batched-tokens 16384 2>&1 | tee -a "$out/sweep.log" \
      | grep -vE "^\s*$"
    ;;
  longgen)
    python3 bench/long_generation_sweep.py --binary "$bundle/sparse-engine" --model $model --input-len 1024 \
      --output-len "$4" --budget "$5" --concurrencies "$6" --methods "$7" --csv "$out/long_generation.csv" \
      --requests-per-slot "${REQUESTS_PER_SLOT:-1}" \
      -- --kv-cache-memory "${8:-64G}" --max-num-batched-tokens 16384 --admission "${ADMISSION:-optimistic}" 2>&1 \
      | tee -a "$out/longgen.log" \
      | grep -vE "^\s*$"
    ;;
  profile)
    control=${NCU_CONTROL:-all}
    [[ $control == none ]] && control_flags=(--cache-control none --clock-control none) || control_flags=()
    ncu --csv --page raw --metrics gpu__time_duration.sum --profile-from-start off "${control_flags[@]}" \
      "$bundle/sparse-engine" bench decode --model $model/config.json --load-format dummy --device cuda --input-len "$4" \
      --batch "$5" --warmup-steps 1 --steps 5 --enforce-eager --gpu-memory-utilization 0.92 "${@:6}" \
      > "$out/ncu_$4_$5.csv" 2> "$out/ncu_$4_$5.log"
    echo "ncu exit $?"
    python3 bench/profile_decode.py "$out/ncu_$4_$5.csv" --steps 3 | tee "$out/profile_$4_$5.md" | head -30
    ;;
  hf)
    PYTHONUNBUFFERED=1 python3 -W ignore bench/hf_decode_peer.py --config $model/config.json --input-len "$4" \
      --batch "$5" --csv "$out/decode.csv" 2>&1 | tail -8
    ;;
esac
