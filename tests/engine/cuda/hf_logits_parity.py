"""Logits parity of the GPU engine with HF transformers on random bf16 checkpoints of real shapes.

Writes a checkpoint of CONFIG's shape (depth cut to --layers) with HF's own initialization and a fixed seed as
config.json + safetensors, runs the same token-id prompts greedily through HF (SDPA, bf16, its dynamic cache) and
through the engine (engine_logprobs_tool: paged KV, CUDA graphs), and compares, per prompt, our top-K logprobs at every
step with HF's teacher-forced along our tokens, and the two greedy continuations. Random weights make the next-token
distribution flat, so bf16 rounding alone can swap the top two: a divergence counts as a near-tie when HF's own top
two logits lie within two bf16 ulps. Exit status 1 when a continuation parts away from a near-tie or a logprob
differs by more than --max-logprob-err.

usage: hf_logits_parity.py --config CONFIG.json --tool BUNDLE/engine_logprobs_tool --workdir DIR [--layers N]
"""
import argparse
import json
import math
import pathlib
import subprocess
import sys

import torch
import transformers


def write_checkpoint(config_path, layers, workdir, seed):
    config = transformers.AutoConfig.from_pretrained(config_path)
    config.num_hidden_layers = layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:layers]
    torch.manual_seed(seed)
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(workdir, safe_serialization=True)
    return model.eval()


def hf_greedy(model, prompt, steps):
    """HF's greedy continuation and the raw logits of each of its steps."""
    ids = torch.tensor([prompt], device="cuda")
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=steps,
                         min_new_tokens=steps, output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences[0, len(prompt):].tolist(), [step[0].float() for step in out.logits]


def hf_logprobs_along(model, prompt, tokens):
    """HF's log-softmax before each of `tokens`, teacher-forced along prompt + tokens (one forward)."""
    ids = torch.tensor([prompt + tokens[:-1]], device="cuda")
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:].float()
    return torch.log_softmax(logits, dim=-1)


def bf16_ulp(x):
    """The spacing of bf16 numbers at |x| (8 significant bits)."""
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--tool", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-logprob-err", type=float, default=0.25)
    args = parser.parse_args()
    workdir = pathlib.Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    model = write_checkpoint(args.config, args.layers, workdir, args.seed)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(args.seed + 1)
    lengths = [16, 64, 200, 511, 1024, 1500, 2000, 3000][: args.prompts]
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    hf = [hf_greedy(model, p, args.steps) for p in prompts]

    request = workdir / "request.json"
    request.write_text(json.dumps({"prompts": prompts, "max_tokens": args.steps, "logprobs": args.top}))
    result = workdir / "ours.json"
    subprocess.run([args.tool, str(workdir), str(request), str(result)], check=True)
    ours = json.loads(result.read_text())

    failed = False
    name = pathlib.Path(args.config).parent.name
    for prompt, (hf_tokens, hf_logits), mine in zip(prompts, hf, ours):
        # Logits: our top-K logprobs at every step against HF's along our own tokens.
        reference = hf_logprobs_along(model, prompt, mine["tokens"])
        max_err = max(abs(logprob - reference[step][token].item())
                      for step in range(args.steps) for token, logprob in mine["top"][step])
        # Greedy tokens: where the two continuations part, HF's own top two must lie within bf16 rounding of each
        # other (its logits are bf16: two ulps of the top logit).
        same = 0
        while same < args.steps and mine["tokens"][same] == hf_tokens[same]:
            same += 1
        verdict = "identical"
        if same < args.steps:
            top2 = torch.topk(hf_logits[same], 2).values.tolist()
            ulps = (top2[0] - top2[1]) / bf16_ulp(top2[0])
            verdict = f"part at step {same}, HF's top two {ulps:.1f} bf16 ulps apart"
            if ulps > 2:
                verdict += " (not a near-tie)"
                failed = True
        if max_err > args.max_logprob_err:
            failed = True
        print(f"PARITY hf {name} layers {args.layers} prompt {len(prompt):5d}: {same}/{args.steps} greedy tokens "
              f"equal, {verdict}; max |logprob diff| over top-{args.top} x {args.steps} steps {max_err:.4f}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
