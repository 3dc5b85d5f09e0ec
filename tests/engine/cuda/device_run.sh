#!/usr/bin/env bash
# The GPU model path on the device machine, from a bundle built here with shared/tools/device-bundle:
#   tests/engine/cuda/device_run.sh BUNDLE_DIR OUT_DIR parity      op (FP8, KIVI and latent stores included), model
#                                                                  and engine parity on dummy weights (tiny, Gemma-3-,
#                                                                  DeepSeek-V2-shaped)
#   tests/engine/cuda/device_run.sh BUNDLE_DIR OUT_DIR smollm2 GGUF  the same on SmolLM2, every method's decisions
#                                                                  included (its file, carried in parts)
#   tests/engine/cuda/device_run.sh BUNDLE_DIR OUT_DIR decode      decode tokens/s of a dummy Llama-3.1-8B at
#                                                                  batch 1 and 8 (BUNDLE_DIR/llama-3.1-8b/config.json)
#   tests/engine/cuda/device_run.sh BUNDLE_DIR OUT_DIR selfgen GGUF TEXT RESULTS SECONDS
#                                                                  docs/quality.md's 4,096-token self-generated rows
#                                                                  (Kara, R-KV and the eviction methods), the same way
#   tests/engine/cuda/device_run.sh BUNDLE_DIR OUT_DIR quality GGUF RESULTS SECONDS
#                                                                  docs/quality.md's SmolLM2 sweep on the GPU for at
#                                                                  most SECONDS, resumed from and written back to
#                                                                  RESULTS (GGUF must be named smol.gguf: cells name
#                                                                  their model by file name); OUT_DIR gets the file
#   tests/engine/cuda/device_run.sh BUNDLE_DIR OUT_DIR hf LAYERS   logits and greedy tokens against HF transformers
#                                                                  on random Llama-3.1-8B-, Qwen3-8B- and
#                                                                  Qwen3-30B-A3B-shaped checkpoints (Qwen3 also with
#                                                                  its 128K YaRN) cut to LAYERS layers
# One process per suite, so a crash in one leaves the others' results; a short table is printed last.
set -uo pipefail
bundle=$1
out=$2
stage=$3
export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
case $stage in
  parity)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$out/gpu.txt"
    "$bundle/backend_cuda_test" --gtest_filter='CudaArgmaxTest.*:CudaOpsTest.*:CudaMoeTest.*:CudaFp8KvStoreTest.*:CudaKiviKvStoreTest.*:CudaLatent*:CudaDecodeScoringOpsTest.*' \
      > "$out/ops.log" 2>&1
    echo "backend_cuda_test exit $?"
    "$bundle/engine_cuda_test" --gtest_filter='-*SmolLM2*:GpuModelTest.Gemma3MatchesCpu' \
      > "$out/model.log" 2>&1
    echo "engine_cuda_test exit $?"
    if command -v compute-sanitizer > /dev/null; then
      timeout 120 compute-sanitizer --tool memcheck --print-limit 5 "$bundle/engine_cuda_test" \
        --gtest_filter='GpuEngineTest.Tiny*' > "$out/memcheck.log" 2>&1
      echo "memcheck exit $?: $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -1)"
    fi
    grep -hE "^\[ +(FAILED|OK|PASSED|SKIPPED) |Failure|Check failed" "$out/ops.log" "$out/model.log" | head -40
    grep -h PARITY "$out/ops.log" "$out/model.log" | tee "$out/parity.txt"
    ;;
  smollm2)
    SE_TEST_SMOLLM2=$4 "$bundle/engine_cuda_test" --gtest_filter='*SmolLM2*' > "$out/smollm2.log" 2>&1
    echo "engine_cuda_test (SmolLM2) exit $?"
    grep -E "PARITY|KEPTSET smollm .* of |^\[ +(OK|FAILED) |Failure" "$out/smollm2.log"
    ;;
  quality)
    # Each cell is flushed as it finishes, so stopping the sweep at the limit loses at most the cell under way.
    timeout "$6" "$bundle/sparse-engine" eval --models "$4" --device cuda \
      --methods vanilla,snapkv,pyramidkv,adakv,chunkkv,streamingllm,h2o,quest,omnikv,kvzip --budgets 0.125,0.25,0.5 \
      --context 4096 --continuation 256 --windows 20 --task-lengths 4096 --samples 50 --no-passkey \
      --results "$5" > "$out/quality.log" 2>&1
    echo "eval exit $? (124: stopped at the limit)"
    cp "$5" "$out/"
    wc -l "$5"
    ;;
  selfgen)
    # docs/quality.md's decode-time compression rows: TEXT's first 128 tokens and the 4,096 vanilla writes from them,
    # replayed through each method at its default windows. Cells are flushed as they finish, as above.
    timeout "$7" "$bundle/sparse-engine" eval --models "$4" --device cuda --self-generated \
      --generation-temperature 0.8 --texts "$5" --windows 1 --context 128 --continuation 4096 \
      --methods vanilla,kara,rkv,streamingllm,h2o,snapkv --budgets 0.2,0.3,0.5 --no-tasks --no-passkey \
      --results "$6" > "$out/selfgen.log" 2>&1
    echo "eval exit $? (124: stopped at the limit)"
    cp "$6" "$out/"
    wc -l "$6"
    ;;
  hf)
    for config in bench/models/llama-3.1-8b/config.json bench/models/qwen3-8b/config.json \
        bench/models/qwen3-8b-yarn/config.json bench/models/qwen3-30b-a3b-fp8/config.json; do
      name=$(basename "$(dirname "$config")")
      timeout 280 python3 -W ignore tests/engine/cuda/hf_logits_parity.py --config "$config" --layers "$4" \
        --tool "$bundle/engine_logprobs_tool" --workdir "/tmp/hf-$name" > "$out/hf_$name.log" 2>&1
      echo "hf parity $name exit $?"
      grep -E "PARITY|Error|error" "$out/hf_$name.log" | tail -12
      rm -rf "/tmp/hf-$name"
    done
    ;;
  decode)
    for batch in 1 8; do
      "$bundle/sparse-engine" bench throughput --model "$bundle/llama-3.1-8b/config.json" --load-format dummy \
        --device cuda --max-model-len 4096 --num-prompts "$batch" --concurrency "$batch" --input-len 128 \
        --output-len 1024 2>&1 | tee "$out/decode_b$batch.log" | grep -E "^\||bench|error"
    done
    ;;
esac
