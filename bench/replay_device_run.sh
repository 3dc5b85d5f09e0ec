#!/bin/bash
# The multi-turn agent replay (docs/benchmarks.md) on the GPU machine: Llama-3.1-8B-shaped random weights
# (--load-format dummy) with SmolLM2's tokenizer and chat template, so the chat routes work (the vocabulary is
# cut to the tokenizer's 49,152). One fresh server per configuration, the same trace for each.
#   bench/replay_device_run.sh BUNDLE TOKENIZER_DIR OUT CONFIGS [TRACE OPTIONS...]
# BUNDLE holds sparse-engine (tools/device-bundle); TOKENIZER_DIR holds tokenizer.json and tokenizer_config.json;
# CONFIGS names the configurations to run, comma-separated (vanilla, vanilla-prune, snapkv-chain, snapkv-nochain,
# h2o-chain); vanilla-prune prunes each tool result to 64 tokens one turn after it entered.
# Each replay stops after REPLAY_LIMIT seconds (default 240), its JSON then missing; MAX_MODEL_LEN (default 65536)
# bounds the servers' context.
set -u
bundle=$1 tokenizer_dir=$2 out=$3 configs=,$4,
shift 4
trace=("$@")
export LD_LIBRARY_PATH=$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
model=$(mktemp -d)
python3 - "$model" <<'PY'
import json, pathlib, sys
config = json.loads(pathlib.Path("bench/models/llama-3.1-8b/config.json").read_text())
config.update(vocab_size=49152, bos_token_id=1, eos_token_id=2)
pathlib.Path(sys.argv[1], "config.json").write_text(json.dumps(config))
PY
cp "$tokenizer_dir"/tokenizer.json "$tokenizer_dir"/tokenizer_config.json "$model"/
port=8391
run() {
  local name=$1 server_args=$2
  shift 2
  [[ $configs == *,$name,* ]] || return 0
  "$bundle"/sparse-engine serve --model "$model" --load-format dummy --device cuda --port $port \
    --max-model-len ${MAX_MODEL_LEN:-65536} $server_args > "$out/replay-$name.server.log" 2>&1 &
  local pid=$! started=$SECONDS
  for _ in $(seq 1 300); do
    curl -sf http://127.0.0.1:$port/health > /dev/null && break
    kill -0 $pid 2> /dev/null || { echo "$name: the server exited" >> "$out/replay-times.txt"; return 1; }
    sleep 1
  done
  echo "$name: server up after $((SECONDS - started)) s" >> "$out/replay-times.txt"
  timeout "${REPLAY_LIMIT:-240}" stdbuf -oL "$bundle"/sparse-engine bench replay --base-url http://127.0.0.1:$port \
    "${trace[@]}" "$@" --result-json "$out/replay-$name.json" > "$out/replay-$name.log" 2>&1
  echo "$name: replay exit $? after $((SECONDS - started)) s" >> "$out/replay-times.txt"
  kill $pid
  wait $pid
}
run vanilla ""
run vanilla-prune "" --prune-tool-results-lag 1
run snapkv-chain "--sparse-method snapkv --sparse-config {\"budget\":8192}" --chain
run snapkv-nochain "--sparse-method snapkv --sparse-config {\"budget\":8192} --prefix-cache-mode off"
run h2o-chain "--sparse-method h2o --sparse-config {\"budget\":8192}" --chain
