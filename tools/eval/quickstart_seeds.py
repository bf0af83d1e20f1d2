"""Run the quickstart over several seeds, with learning-rate-0 controls, and record what a user can expect.

    python tools/eval/quickstart_seeds.py --seeds 42,1,2,3,4 --controls 42,1,2 --out docs/results/quickstart_seeds.json
    python tools/eval/quickstart_seeds.py --tables docs/results/quickstart_seeds.json      # print the tables again
    python tools/eval/quickstart_seeds.py --tables docs/results/quickstart_seeds.json \
        docs/results/quickstart_seeds_amd.json
    python tools/eval/quickstart_seeds.py --config configs/quickstart_ppo.yaml --seeds 42,1,2 --controls 42,1 \
        --out docs/results/quickstart_ppo_seeds.json                           # PPO with a critic

Seed s builds its own policy (`build/qs_s<s>`, as `build_actor_if_missing` does) and trains into `output/s<s>`; a
control reuses that policy with `--learning_rate 0` (`output/s<s>_lr0`), so the control differs from its run only by
the updates. The JSON file names the machine (CPU model, cores, threads, Python, paddle) and gives, per run, the SFT
steps, the first and last held-out `eval/accuracy` and the wall time; for runs with tools
(configs/quickstart_tools.yaml) also the first and last tool-use rate and accuracy with and without tools, which
`--tables` prints as a second table. `--tables` prints the markdown that README.md
and docs/quickstart.md show (with several files, also the ranges over all machines); tests/tools/test_quickstart_seeds.py
checks that they agree with the committed JSON files.
`--config` picks the run's file (default configs/quickstart.yaml); another file's runs go to `output/<name>_s<s>`
with their own policy `build/qs_<name>_s<s>` (`<name>`: the file's name without `quickstart_` and `.yaml`, e.g. `ppo`),
so they build it as a fresh clone would (`--name` sets `<name>`: e.g. `--run-args "--rl_algorithm vapo" --name
vapo`); when the file's `critic_model_name_or_path` is its actor's path (the PPO
quickstart's critic starts from the policy), it follows the per-seed policy too. A control keeps the critic's
learning rate: the critic only shapes the advantages, which a learning rate of 0 makes unused.
Left out on purpose: running seeds in parallel (two runs on two cores would change each other's wall times).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def machine() -> dict:
    """What the numbers depend on: float kernels differ by CPU, and results by thread count."""
    import paddle

    from paddle_grpo import cpu_tuning

    fields = cpu_tuning.cpu_fields()  # /proc/cpuinfo's first processor (empty without /proc)
    present = set(fields.get("flags", "").split())
    # paddle's oneDNN/MKL kernels are picked by these instruction sets, so results differ between CPUs
    flags = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in present]
    # the MKL code path the runs take: the environment's, else the one cpu_tuning picks (None: MKL's own choice)
    mkl = os.environ.get("MKL_DEBUG_CPU_TYPE") or cpu_tuning.mkl_cpu_type(fields.get("vendor_id"), present)
    return {"cpu": fields.get("model name") or platform.processor() or "", "cpu_family": fields.get("cpu family"),
            "cpu_flags": flags, "mkl_debug_cpu_type": mkl, "cores": os.cpu_count(),
            "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "unset"), "python": platform.python_version(),
            "paddle": paddle.__version__}


DEFAULT_CONFIG = "configs/quickstart.yaml"


def run_prefix(config: str) -> str:
    """"" for the default file (the paths of the recorded GRPO runs), else e.g. "ppo_" for quickstart_ppo.yaml."""
    stem = os.path.splitext(os.path.basename(config))[0]
    if os.path.normpath(config) == os.path.normpath(DEFAULT_CONFIG):
        return ""
    return (stem[len("quickstart_"):] if stem.startswith("quickstart_") else stem) + "_"


def run_paths(seed: int, control: bool, prefix: str = "") -> dict:
    name = f"{prefix}s{seed}_lr0" if control else f"{prefix}s{seed}"
    return {"policy": f"build/qs_{prefix}s{seed}", "output": f"output/{name}"}


def critic_follows_policy(config: str) -> bool:
    """Whether the file's critic is initialised from its own policy (critic path == actor path)."""
    from paddle_grpo.config import load_config

    cfg = load_config(os.path.join(_REPO, config), device="cpu", warn=False)
    return bool(cfg.critic_model_name_or_path) and cfg.critic_model_name_or_path == cfg.actor_model_name_or_path


def run_one(seed: int, control: bool, log_dir: str, overwrite: bool = False, config: str = DEFAULT_CONFIG,
            extra: tuple = (), prefix: str = "") -> dict:
    """One `run_rl.py CONFIG` run (with `extra` arguments appended) into run_paths(seed, control, prefix); returns
    its summary row."""
    paths = run_paths(seed, control, prefix)
    cmd = [sys.executable, "run_rl.py", config, "--seed", str(seed),
           "--actor_model_name_or_path", paths["policy"], "--output_dir", paths["output"],
           "--logging_dir", f"{paths['output']}/vdl_log", "--disable_tqdm", "true"]
    if critic_follows_policy(config):
        cmd += ["--critic_model_name_or_path", paths["policy"]]
    cmd += list(extra)
    if overwrite:
        cmd += ["--overwrite_output_dir", "true"]
    if control:
        cmd += ["--learning_rate", "0"]
    os.makedirs(log_dir, exist_ok=True)
    log = os.path.join(log_dir, os.path.basename(paths["output"]) + ".log")
    t0, load_before = time.time(), os.getloadavg()
    with open(log, "w", encoding="utf-8") as f:
        status = subprocess.run(cmd, cwd=_REPO, stdout=f, stderr=subprocess.STDOUT).returncode
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {status}; see {log}")
    row = summarise(seed, control, wall_s=time.time() - t0, prefix=prefix)
    # the machine's load (1, 5 and 15 minute averages) when the run started and ended: the wall time's context
    row["load_average"] = [round(x, 2) for x in load_before + os.getloadavg()]
    return row


# Multi-turn runs (configs/quickstart_tools.yaml) also log these at each evaluation; the summary keeps the first
# and last value of each under its short name.
TOOL_METRICS = {"eval/tool_use_rate": "tool_use", "eval/accuracy_with_tools": "accuracy_with_tools",
                "eval/accuracy_without_tools": "accuracy_without_tools"}


def _number(value):
    """A logged metric as a float, or None (missing, or nan: an accuracy over no sample)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def summarise(seed: int, control: bool, wall_s: float | None = None, root: str = _REPO, prefix: str = "") -> dict:
    """The row of one finished run, from its metrics.jsonl and its policy's build_info.json. With tools, also
    "tools": {short name: [first, last]} of TOOL_METRICS (None where a value is nan)."""
    paths = run_paths(seed, control, prefix)
    evals = []
    with open(os.path.join(root, paths["output"], "metrics.jsonl"), encoding="utf-8") as f:
        for line in f:
            row = json.loads(line)
            if "eval/accuracy" in row:
                evals.append(row)
    with open(os.path.join(root, paths["policy"], "build_info.json"), encoding="utf-8") as f:
        build = json.load(f)
    accuracy = [r["eval/accuracy"] for r in evals]
    out = {"seed": seed, "learning_rate_0": control, "sft_steps": build["sft_steps"],
           "eval_first": accuracy[0], "eval_last": accuracy[-1], "last_step": evals[-1]["step"],
           "eval_all_min": min(accuracy), "eval_all_max": max(accuracy),
           "wall_s": None if wall_s is None else round(wall_s)}
    if "eval/tool_use_rate" in evals[0]:
        out["tools"] = {short: [_number(evals[0].get(key)), _number(evals[-1].get(key))]
                        for key, short in TOOL_METRICS.items()}
    out["eval"] = [[r["step"], r["eval/accuracy"]] for r in evals]
    config = os.path.join(root, paths["output"], "config.yaml")
    if os.path.isfile(config):  # every key of the run as resolved, and what each unset one took
        out["config"], out["config_unset"] = resolved_config(config)
    return out


def resolved_config(path: str) -> tuple:
    """({key: value}, {key: what its null resolved to}) of a run's config.yaml (Config.format: an unset key is
    written `key: null  # null = ...`)."""
    import re

    import yaml

    with open(path, encoding="utf-8") as f:
        text = f.read()
    notes = dict(re.findall(r"^(\w+): null  # null = (.*)$", text, flags=re.MULTILINE))
    return yaml.safe_load(text), notes


def _pts(x: float) -> str:
    return f"{100 * x:+.1f}"


def tables(results: dict) -> str:
    """The markdown shown in README.md (range line) and docs/quickstart.md (per-run table)."""
    runs = [r for r in results["runs"] if not r["learning_rate_0"]]
    controls = [r for r in results["runs"] if r["learning_rate_0"]]
    gains = [r["eval_last"] - r["eval_first"] for r in runs]
    control_gains = [r["eval_last"] - r["eval_first"] for r in controls]
    control_line = (f"with `learning_rate 0`: {_pts(min(control_gains))} to {_pts(max(control_gains))} points."
                    if controls else "")
    if runs:
        summary = (f"Over {len(runs)} seeds: step 0 {min(r['eval_first'] for r in runs):.3f}-"
                   f"{max(r['eval_first'] for r in runs):.3f}, step {runs[0]['last_step']} "
                   f"{min(r['eval_last'] for r in runs):.3f}-{max(r['eval_last'] for r in runs):.3f}, "
                   f"**{_pts(min(gains))} to {_pts(max(gains))} points**" +
                   (f"; {control_line}" if controls else "."))
    else:  # controls only (--seeds ""): e.g. more controls for a file of earlier runs
        summary = f"Controls only: {control_line}"
    lines = [summary, "",
             "| run | SFT steps | step 0 | last step | change | wall time |", "|---|---|---|---|---|---|"]
    for r in results["runs"]:
        label = f"`--seed {r['seed']}" + (" --learning_rate 0`" if r["learning_rate_0"] else "`")
        change = _pts(r["eval_last"] - r["eval_first"])
        if r["learning_rate_0"]:
            change += f" (all evals {r['eval_all_min']:.3f}-{r['eval_all_max']:.3f})"
        wall = "" if r["wall_s"] is None else f"{r['wall_s']} s"
        lines.append(f"| {label} | {r['sft_steps']} | {r['eval_first']:.3f} | {r['eval_last']:.3f} | {change} | "
                     f"{wall} |")
    if any("tools" in r for r in results["runs"]):
        lines += ["", tool_table(results).rstrip("\n")]
    return "\n".join(lines) + "\n"


def _share(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def tool_table(results: dict) -> str:
    """The tool metrics of multi-turn runs at the first and last evaluation: the share of held-out samples that
    called a tool, and the accuracy among those that did / did not ("-": no such sample)."""
    lines = ["| run | tool use, step 0 -> last | accuracy with tools | accuracy without tools |", "|---|---|---|---|"]
    for r in results["runs"]:
        if "tools" not in r:
            continue
        label = f"`--seed {r['seed']}" + (" --learning_rate 0`" if r["learning_rate_0"] else "`")
        cells = [f"{_share(first)} -> {_share(last)}" for first, last in
                 (r["tools"][k] for k in ("tool_use", "accuracy_with_tools", "accuracy_without_tools"))]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def combined(results: list) -> str:
    """The README's line over several machines' results files: the ranges over every run of every file."""
    runs = [r for res in results for r in res["runs"] if not r["learning_rate_0"]]
    controls = [r for res in results for r in res["runs"] if r["learning_rate_0"]]
    gains = [r["eval_last"] - r["eval_first"] for r in runs]
    control_gains = [r["eval_last"] - r["eval_first"] for r in controls]
    line = (f"Over {len(results)} machines ({len(runs)} runs): step 0 {min(r['eval_first'] for r in runs):.3f}-"
            f"{max(r['eval_first'] for r in runs):.3f}, step {runs[0]['last_step']} "
            f"{min(r['eval_last'] for r in runs):.3f}-{max(r['eval_last'] for r in runs):.3f}, "
            f"**{_pts(min(gains))} to {_pts(max(gains))} points**")
    if controls:
        line += (f"; with `learning_rate 0` ({len(controls)} runs): {_pts(min(control_gains))} to "
                 f"{_pts(max(control_gains))} points")
    return line + ".\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="42,1,2,3,4", help="comma-separated seeds to train")
    parser.add_argument("--controls", default="42,1,2", help="seeds to rerun with learning_rate 0")
    parser.add_argument("--config", default=DEFAULT_CONFIG,
                        help="the run's config file, relative to the repository (module docstring)")
    parser.add_argument("--run-args", default="", metavar="ARGS",
                        help="more run_rl.py arguments for every run, e.g. \"--rl_algorithm vapo\"")
    parser.add_argument("--name", help="the runs' name in output/<name>_s<s> and build/qs_<name>_s<s> (default: from "
                                       "--config, e.g. ppo; module docstring)")
    parser.add_argument("--out", default="output/quickstart_seeds.json", help="JSON file to write")
    parser.add_argument("--log-dir", default="output/quickstart_seeds_logs", help="one log per run")
    parser.add_argument("--collect", action="store_true",
                        help="do not run: summarise runs already finished in output/ (wall times unknown)")
    parser.add_argument("--tables", metavar="JSON", nargs="+",
                        help="only print the markdown of existing results files (several: each one's, then the "
                             "ranges over all of them)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace runs already in output/ (each run gets --overwrite_output_dir true)")
    args = parser.parse_args(argv)
    if args.tables:
        loaded = []
        for path in args.tables:
            with open(path, encoding="utf-8") as f:
                loaded.append(json.load(f))
            print(f"{path}:\n" if len(args.tables) > 1 else "", end="")
            print(tables(loaded[-1]), end="\n" if len(args.tables) > 1 else "")
        if len(loaded) > 1:
            print(combined(loaded), end="")
        return 0
    plan = [(int(s), False) for s in args.seeds.split(",") if s] + \
           [(int(s), True) for s in args.controls.split(",") if s]
    prefix, extra = run_prefix(args.config) if args.name is None else f"{args.name}_", tuple(args.run_args.split())
    existing = [run_paths(s, c, prefix)["output"] for s, c in plan
                if os.path.exists(os.path.join(_REPO, run_paths(s, c, prefix)["output"]))]
    if existing and not (args.collect or args.overwrite):
        raise SystemExit(f"{', '.join(existing)} already exist: pass --overwrite to train them again from scratch, "
                         "or --collect to summarise them")
    rows = [summarise(s, c, prefix=prefix) if args.collect else
            run_one(s, c, args.log_dir, args.overwrite, args.config, extra, prefix) for s, c in plan]
    results = {"machine": machine(), "config": args.config, "run_args": args.run_args, "runs": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    print(tables(results), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
