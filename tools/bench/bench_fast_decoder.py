"""The lean decoder path (policy/fast_decoder.py) against PaddleNLP's forward on a random Llama of
SmolLM2-135M-Instruct's shape (30 layers, hidden 576, intermediate 1536, 9 query / 3 key-value heads, tied
embeddings, rope theta 100,000, vocabulary 49,152), float32 on CPU.

    python tools/bench/bench_fast_decoder.py [--prompts 2] [--samples 4] [--prompt-len 64] [--completion-len 64]
                                       [--new-tokens 32] [--repeats 2]

Times, after one warm-up each, the three things a step does with the policy: a log-prob pass without gradients (old
and reference log-probs), a log-prob pass with its backward (the update), and greedy generation of `--new-tokens`
tokens for `--samples` samples of each prompt (the rollout). Same model object, same batch, `PADDLE_GRPO_FAST=1`
then `0`; the chunked LM head (512 positions) in both. Reports the least wall and process CPU seconds of
`--repeats` runs (on a shared machine the CPU time is the steadier measure of the work) and the load average, as
one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                                "tests"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()

    import paddle
    from batch_helpers import grouped_batch
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    from paddle_grpo import cpu_tuning
    from paddle_grpo.policy import decoder_path
    from paddle_grpo.policy.causal import completion_logprobs, generate

    cpu_tuning.apply()
    V, G = 49152, args.samples
    paddle.seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=True, dtype="float32"))
    batch = grouped_batch(V, P=args.prompts, G=G, L=args.prompt_len, T=args.completion_len)
    mask = batch[3].astype("float32")

    def logprobs():
        model.eval()
        with paddle.no_grad():
            completion_logprobs(model, *batch, chunk_size=512)

    def update():
        model.train()
        lp, _ = completion_logprobs(model, *batch, chunk_size=512)
        (lp * mask).sum().backward()
        model.clear_gradients()

    def rollout():
        model.eval()
        with paddle.no_grad():
            generate(model, batch[0][::G], batch[1][::G], num_samples=G, max_new_tokens=args.new_tokens,
                     eos_token_ids=[-1], do_sample=False)

    def timed(fn):
        fn()
        best = None
        for _ in range(args.repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            run = (time.perf_counter() - wall, time.process_time() - cpu)
            best = run if best is None else (min(best[0], run[0]), min(best[1], run[1]))
        return {"wall_s": round(best[0], 2), "cpu_s": round(best[1], 2)}

    result = {"shape": vars(args), "load_average": os.getloadavg()}
    for switch in ("1", "0"):
        os.environ["PADDLE_GRPO_FAST"] = switch
        result[decoder_path(model)] = {name: timed(fn) for name, fn in
                                       (("logprobs", logprobs), ("update", update), ("rollout", rollout))}
        print(json.dumps(result), flush=True)
    result["load_average_end"] = os.getloadavg()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
