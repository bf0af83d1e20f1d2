"""Benchmark of full RL steps with a tiny random Qwen2 (its interface and results: docs/PERFORMANCE.md).

    python tools/bench.py --shape tools/shapes/default.json [--threads 2] [--repeat 3] [--set completion_len=128]
    python tools/bench.py --gemm --threads 2          # paddle's peak fp32 GEMM rate on this machine

Builds, in a temporary directory and without any download, a character-level tokenizer with exactly `vocab_size`
tokens and a random `Qwen2ForCausalLM` of the SHAPE.json sizes, writes `prompts_per_step * (warmup + timed)`
distinct prompts of exactly `prompt_len` tokens, and runs `warmup_steps + timed_steps` steps of the real `Trainer`
(GRPO, on-policy, one optimizer step per rollout, all sequences of a step in one micro-batch unless SHAPE.json has
`micro_batch_size`): rollout with completions forced to exactly `completion_len` tokens (min_dec_len =
max_dec_len), an in-process reward, the reference log-probs when `beta > 0` (as `kl_loss_coeff = beta`),
advantages and the update. Prints ONE JSON line: medians over the timed steps of the step time (wall and process
CPU) and of each phase, completion tokens per second (completion tokens of a step / step time), the GFLOP each
phase's matrix products execute and the rate achieved, peak RSS, the paddle version and the thread count. With
`--repeat R` the whole benchmark runs R times in fresh processes; the line then carries the median of the runs'
medians, each run's step median and the overall min/max step.

Switches for before/after measurements: `--fast off` (PaddleNLP's forward everywhere, PADDLE_GRPO_FAST=0) and
`--cpu-tuning off` (no paddle_grpo/cpu_tuning.py settings, PADDLE_GRPO_CPU_TUNING=0).

Phases: `rollout`, `reward`, `update` and `reference` are the trainer's perf/* timings; `logprob` is perf/logprob_s
(the reference pass and, off-policy only, the old-policy pass) without perf/reference_s. `other` = step - the phases (advantages, metrics, bookkeeping).
Left out: evaluation, checkpoints, logging to disk and the reward server (see tools/bench_reward_server.py).
"""
import argparse
import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "prompt_len",
        "completion_len", "prompts_per_step", "group_size", "beta", "warmup_steps", "timed_steps")
PHASES = ("rollout", "reward", "logprob", "reference", "update", "other")


def char_reward(prompts, completions, **kwargs):
    """Share of lowercase vowels in the completion: cheap, and varies between samples of a random policy."""
    return [sum(c in "aeiou" for c in text) / max(1, len(text)) for text in completions]


def load_shape(path):
    with open(path) as f:
        shape = json.load(f)
    missing = [k for k in KEYS if k not in shape]
    if missing:
        raise SystemExit(f"{path}: missing keys {missing} (a SHAPE.json needs {list(KEYS)})")
    return shape


def build(shape, workdir, seed=0):
    """Tokenizer + random model in workdir/model, prompts in workdir/train.jsonl. Returns (model_dir, data_file)."""
    import random

    from paddle_grpo.recipes.tiny import CHAR_ALPHABET, build_char_tokenizer, build_model

    model_dir = os.path.join(workdir, "model")
    tokenizer = build_char_tokenizer(model_dir, shape["vocab_size"])
    assert len(tokenizer) == shape["vocab_size"]
    build_model(model_dir, tokenizer, hidden_size=shape["hidden_size"],
                intermediate_size=shape["intermediate_size"], num_layers=shape["num_layers"],
                num_heads=shape["num_heads"], num_kv_heads=shape["num_kv_heads"],
                max_position_embeddings=shape["prompt_len"] + shape["completion_len"], seed=seed)
    # Letters and digits only: one token each, so a prompt of prompt_len characters is prompt_len tokens.
    letters = [c for c in CHAR_ALPHABET[:shape["vocab_size"] - 3] if c.isalnum()]
    rng = random.Random(seed)
    n = shape["prompts_per_step"] * (shape["warmup_steps"] + shape["timed_steps"])
    data = os.path.join(workdir, "train.jsonl")
    with open(data, "w") as f:
        for _ in range(n):
            text = "".join(rng.choice(letters) for _ in range(shape["prompt_len"]))
            f.write(json.dumps({"src": text, "tgt": ""}) + "\n")
    return model_dir, data


def make_config(shape, model_dir, data, workdir, seed=0):
    from paddle_grpo.config import config_from_dict

    n_seq = shape["prompts_per_step"] * shape["group_size"]
    micro = shape.get("micro_batch_size", n_seq)
    return config_from_dict(dict(
        actor_model_name_or_path=model_dir, use_rm_server=False, reward_funcs=f"{os.path.abspath(__file__)}:char_reward",
        train_datasets=data, output_dir=os.path.join(workdir, "out"), logging_dir=os.path.join(workdir, "vdl"),
        report_to="none", save_strategy="no", disable_tqdm=True, chat_template="none", seed=seed,
        max_prompt_len=shape["prompt_len"], max_dec_len=shape["completion_len"], min_dec_len=shape["completion_len"],
        max_length=shape["prompt_len"] + shape["completion_len"], temperature=1.0, top_p=1.0,
        global_batch_size=shape["prompts_per_step"], rollout_n=shape["group_size"], rollout_max_num_seqs=n_seq,
        per_device_train_batch_size=micro, per_device_logprob_batch_size=micro, learning_rate=1e-5,
        max_steps=shape["warmup_steps"] + shape["timed_steps"], kl_coeff=0.0, kl_loss_coeff=shape["beta"],
        entropy_coeff=0.0, rl_algorithm="grpo"))


def flops(shape, shared):
    """Floating-point operations (multiply-add = 2) the matrix products of one step execute, per phase, in GFLOP.

    Dense layers, the LM head on the positions that need it, and attention over all keys a query sees (masked ones
    included, as they are computed). `shared`: the fast path, which runs each group's prompt once and does not feed
    the last completion token; else PaddleNLP's forward over all `N x (L + T)` tokens. The update is counted as 3x
    its forward (backward = input and weight gradients). Elementwise ops and softmax are left out.
    """
    D, I, V, layers = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"], shape["num_layers"]
    H, KV = shape["num_heads"], shape["num_kv_heads"]
    d = D // H
    L, T, P, G = shape["prompt_len"], shape["completion_len"], shape["prompts_per_step"], shape["group_size"]
    N = P * G
    dense = 2 * layers * (D * (H + 2 * KV) * d + H * d * D + 3 * D * I)   # per token
    attn = 4 * layers * H * d                                             # per (query, key) pair
    head = 2 * D * V                                                      # per predicted token
    if shared:
        fwd = (P * L + N * (T - 1)) * dense + (P * L * L + N * (T - 1) * (L + T - 1)) * attn + N * T * head
    else:
        fwd = N * (L + T) * dense + N * (L + T) ** 2 * attn + N * T * head
    # Rollout: prefill the P prompts once, then T - 1 decode steps of N rows (the fast path's preallocated cache
    # attends to all L + T slots; PaddleNLP's to the L + t filled ones).
    decode_keys = (T - 1) * (L + T) if shared else sum(L + t for t in range(1, T))
    rollout = P * L * dense + P * L * L * attn + P * head + N * ((T - 1) * (dense + head) + decode_keys * attn)
    return {"rollout": rollout / 1e9, "reference": fwd / 1e9 if shape["beta"] > 0 else 0.0, "update": 3 * fwd / 1e9}


def gemm_peak(threads, repeat=20):
    """Best fp32 GEMM rate of paddle.matmul at two shapes, GFLOP/s (the hardware/library ceiling for the bench)."""
    import paddle

    from paddle_grpo import cpu_tuning

    cpu_tuning.apply()
    paddle.base.core.set_num_threads(threads)
    out = {}
    for m, k, n in ((4096, 256, 704), (2272, 256, 1408), (32, 256, 1408), (1024, 1024, 1024)):
        a, b = paddle.randn([m, k]), paddle.randn([k, n])
        paddle.matmul(a, b)
        best = float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(repeat):
                c = paddle.matmul(a, b)
            float(c[0, 0])
            best = min(best, (time.perf_counter() - t0) / repeat)
        out[f"{m}x{k}x{n}"] = 2 * m * k * n / best / 1e9
    return {"gemm_gflop_per_s": out, "threads": threads, "paddle_version": paddle.__version__,
            "cpu_tuning": cpu_tuning.apply(), "load_average": list(os.getloadavg())}


def run(shape, threads, workdir, profile_dir=None):
    """One benchmark in this process; returns the result dict."""
    import paddle

    from paddle_grpo import cpu_tuning

    cpu_tuning.apply()  # also done by load_causal_lm; here first so that building the model is tuned as well
    paddle.base.core.set_num_threads(threads)
    from paddle_grpo.trainer import Trainer

    model_dir, data = build(shape, workdir)
    trainer = Trainer(make_config(shape, model_dir, data, workdir))
    per_step = {k: [] for k in ("step", "cpu") + PHASES}
    tokens = []
    profiler = None
    for s in range(shape["warmup_steps"] + shape["timed_steps"]):
        timed = s >= shape["warmup_steps"]
        if timed and profile_dir and profiler is None:
            profiler = paddle.profiler.Profiler(targets=[paddle.profiler.ProfilerTarget.CPU],
                                                on_trace_ready=paddle.profiler.export_chrome_tracing(profile_dir))
            profiler.start()
        cpu0 = time.process_time()
        metrics = trainer.train_step()
        cpu = time.process_time() - cpu0
        if profiler is not None:
            profiler.step()
        if not timed:
            continue
        ref = metrics["perf/reference_s"]
        step = metrics["perf/step_s"]
        phases = {"rollout": metrics["perf/rollout_s"], "reward": metrics["perf/reward_s"],
                  "logprob": metrics["perf/logprob_s"] - ref, "reference": ref, "update": metrics["perf/update_s"]}
        phases["other"] = step - sum(phases.values())
        per_step["step"].append(step)
        per_step["cpu"].append(cpu)
        for k, v in phases.items():
            per_step[k].append(v)
        tokens.append(int(trainer.batch.completion_mask.numpy().sum()))
    if profiler is not None:
        profiler.stop()
        profiler.summary(sorted_by=paddle.profiler.SortedKeys.CPUTotal, op_detail=True, thread_sep=False,
                         time_unit="ms")
    step_median = statistics.median(per_step["step"])
    from paddle_grpo.policy import fast_qwen2

    fast = fast_qwen2.enabled_for(trainer.policy.model)
    gflop = flops(shape, fast)
    return {
        "step_s_median": step_median,
        "step_s_min": min(per_step["step"]), "step_s_max": max(per_step["step"]),
        "completion_tokens_per_step": statistics.median(tokens),
        "completion_tokens_per_s": statistics.median(tokens) / step_median,
        **{f"{k}_s_median": statistics.median(per_step[k]) for k in PHASES},
        "step_cpu_s_median": statistics.median(per_step["cpu"]),
        "step_s_all": per_step["step"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "paddle_version": paddle.__version__, "threads": threads,
        "gflop_per_step": gflop,
        **{f"{k}_gflop_per_s": gflop[k] / statistics.median(per_step[k]) for k in gflop if gflop[k] > 0},
        "fast_path": fast, "cpu_tuning": cpu_tuning.apply(),
        "load_average": list(os.getloadavg()), "shape": shape,
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default=str(REPO / "tools" / "shapes" / "default.json"))
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for paddle's kernels (default 2)")
    ap.add_argument("--repeat", type=int, default=1, help="run the benchmark this many times, each in a fresh process")
    ap.add_argument("--fast", choices=("auto", "off"), default="auto",
                    help="auto: the lean Qwen2 path where it applies (paddle_grpo/policy/fast_qwen2.py); off: PaddleNLP's "
                         "forward everywhere (sets PADDLE_GRPO_FAST=0)")
    ap.add_argument("--cpu-tuning", choices=("on", "off"), default="on",
                    help="off: skip paddle_grpo/cpu_tuning.py (sets PADDLE_GRPO_CPU_TUNING=0)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a SHAPE.json key (e.g. --set completion_len=128)")
    ap.add_argument("--gemm", action="store_true", help="only measure paddle's peak fp32 GEMM rate (JSON line)")
    ap.add_argument("--profile", metavar="DIR", help="paddle.profiler over the timed steps; summary to stdout "
                                                     "(before the JSON line), chrome trace to DIR")
    args = ap.parse_args(argv)
    shape = load_shape(args.shape)
    for kv in args.set:
        k, v = kv.split("=", 1)
        shape[k] = json.loads(v)
    if args.repeat > 1 and not args.gemm:
        print(json.dumps(_repeat(args, shape)), flush=True)
        return
    # Thread pools are sized when paddle loads: set the environment before the import.
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    if args.fast == "off":
        os.environ["PADDLE_GRPO_FAST"] = "0"
    if args.cpu_tuning == "off":
        os.environ["PADDLE_GRPO_CPU_TUNING"] = "0"
    sys.path.insert(0, str(REPO))
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    if args.gemm:
        print(json.dumps(gemm_peak(args.threads)), flush=True)
        return
    with tempfile.TemporaryDirectory(prefix="paddle_grpo_bench_") as workdir:
        result = run(shape, args.threads, workdir, profile_dir=args.profile)
    print(json.dumps(result), flush=True)


def _repeat(args, shape):
    """Run the benchmark `args.repeat` times in fresh processes; medians of the per-run medians and their spread."""
    runs = []
    for _ in range(args.repeat):
        cmd = [sys.executable, os.path.abspath(__file__), "--shape", args.shape, "--threads", str(args.threads),
               "--fast", args.fast, "--cpu-tuning", args.cpu_tuning] + [x for kv in args.set for x in ("--set", kv)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    result = dict(runs[0])
    for key in [k for k in runs[0] if k.endswith(("_median", "_per_s")) or k == "peak_rss_mb"]:
        result[key] = statistics.median(r[key] for r in runs)
    result["step_s_median_runs"] = [r["step_s_median"] for r in runs]
    result["step_s_min"] = min(r["step_s_min"] for r in runs)
    result["step_s_max"] = max(r["step_s_max"] for r in runs)
    result["load_average_runs"] = [r["load_average"] for r in runs]
    result["repeat"] = args.repeat
    result.pop("step_s_all", None)
    return result


if __name__ == "__main__":
    main()
