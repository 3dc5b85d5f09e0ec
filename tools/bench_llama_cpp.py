"""llama.cpp side of `sparse-engine bench generate`: prompt-processing and decode tokens/s through
llama-cpp-python on a GGUF, with random prompt ids, greedy decoding and EOS ignored. Prints one JSON line."""
import argparse
import json
import os
import statistics
import time

import numpy as np
import llama_cpp


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    a = p.parse_args()

    llm = llama_cpp.Llama(model_path=a.model, n_ctx=a.prompt_len + a.gen_len + 16, n_batch=512,
                          n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    rng = np.random.default_rng(1234)
    prompt = rng.integers(100, min(llm.n_vocab(), 30000), size=a.prompt_len).tolist()

    def last_logits():
        return np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(llm.n_vocab(),))

    def run(ids, gen):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        tok = int(np.argmax(last_logits()))
        t1 = time.perf_counter()
        for _ in range(gen - 1):
            llm.eval([tok])
            tok = int(np.argmax(last_logits()))
        t2 = time.perf_counter()
        return len(ids) / (t1 - t0), (gen - 1) / (t2 - t1)

    run(prompt[:16], 4)  # warm-up
    rates = [run(prompt, a.gen_len) for _ in range(a.repeats)]
    print(json.dumps({"prompt_tok_s": statistics.median(r[0] for r in rates),
                      "decode_tok_s": statistics.median(r[1] for r in rates)}))


if __name__ == "__main__":
    main()
