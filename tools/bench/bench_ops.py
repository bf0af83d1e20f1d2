"""Time every op on the rollout's decode step and the update's LM head at a given vocabulary.

    python tools/bench/bench_ops.py --vocab 151936 --rows 8 --threads 2 [--hidden 896] [--tokens 128] [--chunks 512]

Paddle's CPU kernels have traps that only show at a real vocabulary (docs/platform.md: `F.log_softmax` is
superlinear in V), so each op of the hot paths is timed alone on its real shape:
- decode, on `[rows, V]` logits: the ops of the old step (`F.log_softmax`, the float64 inverse CDF, the full-sort
  top-p filter, the `[rows, V]` masks of the repetition penalty and of min-length EOS) beside the ones that replace
  them (`rollout.single_turn._exp_and_logsumexp`, `sampling.sample_with_uniforms`, `sampling.candidates`,
  `rollout.single_turn._penalize`, `put_along_axis` on the EOS columns, `take_along_axis` without its O(rows x V)
  default broadcast), plus the LM-head GEMV of one decode step;
- update, on `rows * tokens` positions: the LM-head matmul `[rows*T, H] x [H, V]`, logsumexp, take_along_axis and exp
  of the full logits, and the chunked head (`kernels/chunked_head.py`) forward and forward + backward per chunk size,
  each with the numpy kernels and with paddle ops (`kernels/chunk_kernels.py`), and one chunk's GEMM and statistics.

Prints a markdown table (op, shape, median ms over the runs, runs) and one JSON line. An op whose first call takes
longer than `--slow` seconds is run once (`F.log_softmax` at V = 151,936 takes tens of seconds). Timings on a machine
shared with other work are disturbed: the JSON line records the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Callable, Iterator, List, Tuple

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def _runs(fn: Callable[[], object], repeats: int, slow_s: float) -> List[float]:
    """Seconds per call: the first call alone if it is slow, else `repeats` calls after it (the warm-up)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first > slow_s:
        return [first]
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def _old_inverse_cdf(probs, u):
    """The sampler before the chunked head (for comparison): a float64 cumsum, compare and flip + argmax over [n, V]."""
    import paddle

    cdf = paddle.cumsum(probs.astype("float64"), axis=-1)
    target = paddle.to_tensor(u).unsqueeze(-1) * cdf[:, -1:]
    idx = paddle.sum((cdf <= target).astype("int64"), axis=-1)
    last = probs.shape[-1] - 1 - paddle.argmax(paddle.flip((probs > 0).astype("int64"), axis=[-1]), axis=-1)
    return paddle.minimum(idx, last)


Op = Tuple[str, str, Callable[[], object]]


def decode_ops(V: int, rows: int, hidden: int, seed: int = 0) -> Iterator[Op]:
    """(op name, shape text, thunk) for each op of one decode step at vocabulary V."""
    import numpy as np
    import paddle
    import paddle.nn.functional as F

    from paddle_grpo.rollout.single_turn import _exp_and_logsumexp, _penalize, top_p_filter
    from paddle_grpo.algorithms import gather_last
    from paddle_grpo.rollout.sampling import candidates, row_keys, sample_with_uniforms, uniforms

    paddle.seed(seed)
    z = 3.0 * paddle.randn([rows, V])  # ~6,500 tokens hold 90% of the mass (top-p needs a second, larger topk)
    e, _ = _exp_and_logsumexp(z)
    probs = F.softmax(z, axis=-1)
    peaked = F.softmax(8.0 * paddle.randn([rows, V]), axis=-1)  # a top-p 0.9 set of 1 to ~30 tokens
    u = uniforms(row_keys(seed, 0, np.arange(rows)), 0)
    token = paddle.argmax(z, axis=-1)
    eos_mask = paddle.to_tensor(np.isin(np.arange(V), [V - 1])[None, :])
    eos_cols = paddle.full([rows, 1], V - 1, dtype="int64")
    seen_ids = paddle.randint(0, V, [rows, 640])          # a 512-token prompt + 128 generated tokens
    seen_mask = paddle.zeros([rows, V], dtype="float32")
    seen_mask = paddle.put_along_axis(seen_mask, seen_ids, 1.0, axis=1) > 0
    h = paddle.randn([rows, hidden])
    w = paddle.randn([hidden, V]) * 0.02
    s, sv, sh = f"[{rows}, {V}]", f"[{rows}, 640] of [{rows}, {V}]", f"[{rows}, {hidden}] x [{hidden}, {V}]"
    ops = {
        "lm-head GEMV (one decode step)": (sh, lambda: paddle.matmul(h, w)),
        "old: F.log_softmax": (s, lambda: F.log_softmax(z, axis=-1)),
        "paddle.logsumexp": (s, lambda: paddle.logsumexp(z, axis=-1)),
        "x - logsumexp(x)": (s, lambda: z - paddle.logsumexp(z, axis=-1, keepdim=True)),
        "new: max / exp / sum (exp and logsumexp)": (s, lambda: _exp_and_logsumexp(z)),
        "new: max / exp / sum, paddle ops": (s, _with_kernels("0", lambda: _exp_and_logsumexp(z))),
        "softmax": (s, lambda: F.softmax(z, axis=-1)),
        "exp": (s, lambda: paddle.exp(z)),
        "divide by temperature": (s, lambda: z / 0.7),
        "argmax (greedy)": (s, lambda: paddle.argmax(z, axis=-1)),
        "take_along_axis, broadcast=True (token logit)": (s, lambda: paddle.take_along_axis(z, token.unsqueeze(-1),
                                                                                            axis=-1)),
        "new: gather_last (take_along_axis, broadcast=False)": (s, lambda: gather_last(z, token.unsqueeze(-1))),
        "topk k=50": (s, lambda: paddle.topk(probs, 50, axis=-1)),
        "topk k=1024": (s, lambda: paddle.topk(probs, 1024, axis=-1)),
        "sort (descending)": (s, lambda: paddle.sort(probs, axis=-1, descending=True)),
        "cumsum float32": (s, lambda: paddle.cumsum(probs, axis=-1)),
        "cast + cumsum float64": (s, lambda: paddle.cumsum(probs.astype("float64"), axis=-1)),
        "flip + argmax": (s, lambda: paddle.argmax(paddle.flip((probs > 0).astype("int64"), axis=[-1]), axis=-1)),
        "old: sampler (float64 cumsum, flip, argmax)": (s, lambda: _old_inverse_cdf(probs, u)),
        "new: sampler (two-level, block 512)": (s, lambda: sample_with_uniforms(e, u)),
        "paddle.multinomial (no row keys)": (s, lambda: paddle.multinomial(probs, 1)),
        "old: top_p_filter 0.9 (full sort)": (s, lambda: top_p_filter(probs, 0.9)),
        "new: candidates top_p 0.9": (s, lambda: candidates(probs, 0, 0.9)),
        "new: candidates top_p 0.9, peaked logits (8 x randn)": (s, lambda: candidates(peaked, 0, 0.9)),
        "new: candidates top_k 50": (s, lambda: candidates(probs, 50, 1.0)),
        "old: where(eos_cols) (min length)": (s, lambda: paddle.where(eos_mask, paddle.full_like(z, -float("inf")),
                                                                      z)),
        "new: put_along_axis on EOS columns": (s, lambda: paddle.put_along_axis(z, eos_cols, -float("inf"),
                                                                                axis=1)),
        "old: repetition penalty (where over [rows, V])": (s, lambda: paddle.where(
            seen_mask, paddle.where(z > 0, z / 1.1, z * 1.1), z)),
        "old: seen update (float32 [rows, V] + put_along_axis)": (s, lambda: seen_mask | (paddle.put_along_axis(
            paddle.zeros([rows, V], dtype="float32"), token.unsqueeze(-1), 1.0, axis=1) > 0)),
        "new: repetition penalty (seen columns only)": (sv, lambda: _penalize(z, seen_ids, 1.1)),
    }
    for name, (shape, fn) in ops.items():
        yield name, shape, fn


def update_ops(V: int, rows: int, hidden: int, tokens: int, chunks: List[int], seed: int = 0) -> Iterator[Op]:
    """(op name, shape text, thunk) for each op of the update's LM head over rows * tokens positions; the full
    logits are freed before the chunked head is timed (its point is not to hold them)."""
    import paddle

    from paddle_grpo.kernels.chunk_kernels import shifted_statistics
    from paddle_grpo.kernels.chunked_head import chunked_logprobs_and_entropy
    from paddle_grpo.algorithms import gather_last

    paddle.seed(seed)
    n = rows * tokens
    h = paddle.randn([n, hidden])
    w = paddle.randn([hidden, V]) * 0.02
    full = [paddle.matmul(h, w)]  # the full logits, in a list so that they can be freed below
    labels = paddle.randint(0, V, [n, 1])
    s = f"[{n}, {V}]"
    yield "lm-head matmul", f"[{n}, {hidden}] x [{hidden}, {V}]", lambda: paddle.matmul(h, w)
    yield "logsumexp (full logits)", s, lambda: paddle.logsumexp(full[0], axis=-1)
    yield "take_along_axis, broadcast=True (labels)", s, lambda: paddle.take_along_axis(full[0], labels, axis=-1)
    yield "take_along_axis, broadcast=False (labels)", s, lambda: gather_last(full[0], labels)
    yield "exp (full logits)", s, lambda: paddle.exp(full[0])
    full.clear()  # the chunked rows' peak memory must not include them
    hidden3 = h.reshape([rows, tokens, hidden])
    labels2 = labels.reshape([rows, tokens])

    def forward(c):
        with paddle.no_grad():
            return chunked_logprobs_and_entropy(hidden3, w, labels2, chunk_size=c)

    def backward(c):
        hh, ww = hidden3.detach(), w.detach()
        hh.stop_gradient = ww.stop_gradient = False
        logp, ent = chunked_logprobs_and_entropy(hh, ww, labels2, chunk_size=c)
        (logp.sum() + ent.sum()).backward()

    def statistics(c):
        return shifted_statistics(paddle.matmul(h[:c], w), labels[:c, 0], True)

    for c in chunks:
        shape = f"[{rows}, {tokens}, {hidden}], chunk {c}"
        for kernels, flag in (("numpy kernels", "1"), ("paddle ops", "0")):
            # kernels/chunk_kernels.py's two implementations of the per-chunk elementwise work.
            yield (f"one chunk: GEMM + statistics, chunk {c}, {kernels}", f"[{c}, {hidden}] x [{hidden}, {V}]",
                   _with_kernels(flag, lambda c=c: statistics(c)))
            yield (f"chunked head forward (log-probs + entropy), chunk {c}, {kernels}", shape,
                   _with_kernels(flag, lambda c=c: forward(c)))
            yield (f"chunked head forward + backward, chunk {c}, {kernels}", shape,
                   _with_kernels(flag, lambda c=c: backward(c)))
        yield (f"one chunk: GEMM alone, chunk {c}", f"[{c}, {hidden}] x [{hidden}, {V}]",
               lambda c=c: paddle.matmul(h[:c], w))


def _with_kernels(flag: str, fn: Callable[[], object]) -> Callable[[], object]:
    """`fn` run with PADDLE_GRPO_NUMPY_KERNELS=flag (1: numpy on CPU, 0: paddle ops; kernels/numpy_kernels.py)."""
    def run():
        before = os.environ.get("PADDLE_GRPO_NUMPY_KERNELS")
        os.environ["PADDLE_GRPO_NUMPY_KERNELS"] = flag
        try:
            return fn()
        finally:
            if before is None:
                del os.environ["PADDLE_GRPO_NUMPY_KERNELS"]
            else:
                os.environ["PADDLE_GRPO_NUMPY_KERNELS"] = before
    return run


def main(argv: list[str] | None = None) -> None:
    """Parse `argv`, time the ops, print the markdown table and one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--rows", type=int, default=8, help="sequences decoded at once / rows of the update")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--tokens", type=int, default=128, help="completion tokens per row in the update ops")
    ap.add_argument("--chunks", default="512", help="chunk sizes of the chunked head, comma-separated")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--slow", type=float, default=1.0, help="an op whose first call takes longer runs once")
    ap.add_argument("--phases", default="decode,update", help="decode, update or both")
    args = ap.parse_args(argv)
    if "paddle" not in sys.modules:  # thread pools are sized when paddle loads
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    import paddle

    from paddle_grpo import cpu_tuning

    tuning = cpu_tuning.apply()
    paddle.base.core.set_num_threads(args.threads)
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    if not set(phases) <= {"decode", "update"}:
        raise SystemExit(f"--phases: unknown phase in {args.phases!r} (decode, update)")
    results = []
    with paddle.no_grad():
        for phase in phases:
            if phase == "decode":
                ops = decode_ops(args.vocab, args.rows, args.hidden)
            else:
                ops = update_ops(args.vocab, args.rows, args.hidden, args.tokens,
                                 [int(c) for c in args.chunks.split(",")])
            for name, shape, fn in ops:
                if "backward" in name:
                    with paddle.enable_grad():
                        times = _runs(fn, args.repeats, args.slow)
                else:
                    times = _runs(fn, args.repeats, args.slow)
                results.append({"phase": phase, "op": name, "shape": shape,
                                "median_ms": round(statistics.median(times) * 1e3, 3), "runs": len(times)})
                print(f"{phase}: {name} {shape}: {results[-1]['median_ms']} ms", file=sys.stderr, flush=True)
                del fn
    print("| phase | op | shape | median ms | runs |")
    print("|---|---|---|---:|---:|")
    for r in results:
        print(f"| {r['phase']} | {r['op']} | {r['shape']} | {r['median_ms']:.3f} | {r['runs']} |")
    print(json.dumps({"vocab": args.vocab, "rows": args.rows, "hidden": args.hidden, "tokens": args.tokens,
                      "threads": args.threads, "paddle_version": paddle.__version__, "cpu_tuning": tuning,
                      "kernels": cpu_tuning.kernel_report(), "load_average": list(os.getloadavg()), "ops": results}))


if __name__ == "__main__":
    main()
