"""The update's LM head with full logits against the chunked head, at several vocabulary sizes (docs/PERFORMANCE.md).

    python tools/bench/bench_head.py [--vocabs 128,512,2048,8192,32768,151936] [--rows 8] [--tokens 128]
                               [--hidden 896] [--chunk 512] [--threads 2] [--repeats 3]

What `use_fused_head_and_loss_fn`'s default (config.head_chunk_size_for) was chosen from: for each vocabulary V, one
fresh process per head mode runs `policy.lm_head.head_logprobs` (the function every log-prob path calls) on random
`[rows, tokens, hidden]` hidden states and a random `[hidden, V]` head, forward and backward (log-probs with the
entropy detached, as the update computes them when entropy_coeff is 0), and reports the median seconds of
`--repeats` calls after one warm-up (wall and process CPU time: on a loaded machine the CPU time is the steadier
measure of the work), and the process's peak RSS increase over its RSS before the first call
(VmHWM, Linux). Prints a markdown table and one JSON line. Timings on a shared machine are disturbed: the JSON line
records the load average.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]


def _hwm_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure(vocab: int, rows: int, tokens: int, hidden: int, chunk: int | None, repeats: int) -> dict:
    """One mode at one vocabulary, in this process: {"seconds": median, "peak_increase_mb": ...}."""
    import paddle

    import paddlenlp.peft.lora.lora_layers  # noqa: F401  (lm_head_of imports it: ~240 MB, loaded in any real run)

    from paddle_grpo import cpu_tuning
    from paddle_grpo.policy.lm_head import head_logprobs

    cpu_tuning.apply()
    paddle.seed(0)
    head = paddle.nn.Linear(hidden, vocab, bias_attr=False)
    hidden_states = paddle.randn([rows, tokens, hidden])
    hidden_states.stop_gradient = False
    labels = paddle.randint(0, vocab, [rows, tokens])

    def call():
        logp, _ = head_logprobs(hidden_states, head, labels, with_entropy="detached", chunk_size=chunk)
        logp.sum().backward()
        hidden_states.clear_gradient()
        head.weight.clear_gradient()

    before = _rss_mb()
    call()  # warm-up (allocator, kernels)
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        call()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"seconds": statistics.median(times), "cpu_seconds": statistics.median(cpu),
            "peak_increase_mb": _hwm_mb() - before}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--vocabs", default="128,512,2048,8192,32768,151936")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--chunk", type=int, default=512, help="the chunked head's positions per chunk")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one", metavar="V:CHUNK", help=argparse.SUPPRESS)  # a child process: one measurement
    args = ap.parse_args(argv)
    if args.one:
        vocab, chunk = args.one.split(":")
        sys.path.insert(0, str(REPO))
        result = measure(int(vocab), args.rows, args.tokens, args.hidden, int(chunk) or None, args.repeats)
        print(json.dumps(result))
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    rows = []
    for vocab in [int(v) for v in args.vocabs.split(",")]:
        row = {"vocab": vocab}
        for name, chunk in (("full", 0), ("chunked", args.chunk)):
            cmd = [sys.executable, os.path.abspath(__file__), "--one", f"{vocab}:{chunk}", "--rows", str(args.rows),
                   "--tokens", str(args.tokens), "--hidden", str(args.hidden), "--repeats", str(args.repeats)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            row[name] = json.loads(out.strip().splitlines()[-1])
        rows.append(row)
        print(f"V={vocab}: {row}", file=sys.stderr, flush=True)
    print("| vocab | full logits s (CPU s) | chunked s (CPU s) | chunked / full, CPU | full peak MB "
          "| chunked peak MB |")
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        f, c = r["full"], r["chunked"]
        print(f"| {r['vocab']} | {f['seconds']:.3f} ({f['cpu_seconds']:.3f}) | {c['seconds']:.3f} "
              f"({c['cpu_seconds']:.3f}) | {c['cpu_seconds'] / f['cpu_seconds']:.2f} | {f['peak_increase_mb']:.0f} | "
              f"{c['peak_increase_mb']:.0f} |")
    print(json.dumps({"rows": args.rows, "tokens": args.tokens, "hidden": args.hidden, "chunk": args.chunk,
                      "threads": args.threads, "load_average": list(os.getloadavg()), "results": rows}))


if __name__ == "__main__":
    main()
