"""Shared by the multi-process tests (tests/parallel/test_distributed.py, test_pipeline.py): a tiny training config, the
`paddle.distributed.launch` command for CPU ranks, running it, and the exact-resume check."""
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest
from numerics import assert_adam_close, f32_sum_tol

NAMES = ["Ann", "Bob", "Cid", "Dan", "Eve", "Fay", "Gus", "Hal"]


def write_config(tmp_path, tiny_policy_dir, algorithm):
    rows = [{"src": f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n<think>",
             "tgt": f"(1) {n} is a knight and a friend"} for n in NAMES]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = {"actor_model_name_or_path": tiny_policy_dir, "use_rm_server": False, "reward_funcs": "length_similarity",
           "train_datasets": str(tmp_path / "train.jsonl"), "max_prompt_len": 32, "max_dec_len": 8,
           "min_dec_len": 1, "max_length": 40, "global_batch_size": 4, "rollout_n": 4,
           "per_device_train_batch_size": 4, "per_device_logprob_batch_size": 4, "learning_rate": 1e-3,
           "max_steps": 2, "save_steps": 100, "disable_tqdm": True, "report_to": "none", "temperature": 1.0,
           "rl_algorithm": algorithm, "kl_coeff": 0.01 if algorithm != "grpo" else 0.0,
           "kl_loss_coeff": 0.01 if algorithm == "grpo" else 0.0, "dataloader_shuffle": True}
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps(cfg))
    return path


# Tolerances of the multi-process comparisons (1 rank against 2, tensor / pipeline parallel, the chunked LM head):
# the same maths summed in other orders. On write_config's runs (the tiny policy: 2 layers, hidden 64, intermediate
# 128, vocab 320; at most 16 rows x 40 positions per optimizer step) a value passes through about 42 chained float32
# sums (forward and backward through the layers, the LM head and its log-softmax), the longest over the 640 positions
# that make up a weight's gradient.
def tiny_rel_tol(layers=2):
    """Relative float32 bound of write_config's runs with a `layers`-layer tiny policy (3.2e-3 for 2 layers)."""
    return f32_sum_tol(640, 1.0, depth=2 * (9 * layers + 3))


TINY_REL_TOL = tiny_rel_tol(2)  # 3.2e-3
# A metric that is a mean of up to 640 terms of size about 1 whose sum cancels (the policy loss with zero-mean
# advantages was -4e-8) is off by at most this, absolutely.
TINY_ABS_TOL = f32_sum_tol(640, 1.0)  # 7.6e-5
# Measured 2026-11-25 on an AMD EPYC, for scale: 1 rank against 2, and one process under MKL_DEBUG_CPU_TYPE=2/4/5,
# differed by at most 1.6e-7 absolutely in any metric and 1e-7 in the 99.9th percentile of the parameters.


def assert_metrics_match(one, two, rel=TINY_REL_TOL):
    """Two metrics.jsonl row lists of the same training: every non-perf value within float32 rounding (rewards and
    lengths come out exactly equal); returns the number of values compared."""
    assert [r["step"] for r in one] == [r["step"] for r in two]
    compared = 0
    for a, b in zip(one, two):
        assert set(a) == set(b)
        for key in a:
            if not key.startswith("perf/"):
                assert b[key] == pytest.approx(a[key], rel=rel, abs=TINY_ABS_TOL), (a["step"], key)
                compared += 1
    return compared


def assert_checkpoints_match(one, two, initial_dir, optimizer_steps, checkpoint="checkpoint-2", lr=1e-3,
                             rel=TINY_REL_TOL):
    """Run `one`'s and run `two`'s parameters at `checkpoint` are the same Adam training of `initial_dir`'s
    (numerics.assert_adam_close, write_config's learning rate); returns the drift statistics."""
    pa = read_params(Path(one) / checkpoint)
    pb = read_params(Path(two) / checkpoint)
    assert set(pa) == set(pb)
    initial = read_params(Path(initial_dir))
    return assert_adam_close(pa, pb, initial, lr=lr, steps=optimizer_steps, rel=rel)


def launch(*args, log_dir, nproc=2):
    return [sys.executable, "-m", "paddle.distributed.launch", "--devices", "", "--nproc_per_node", str(nproc),
            "--log_dir", str(log_dir), *map(str, args)]


# Opt-in: 3-4 gloo processes on a 2-core machine are slow; PADDLE_GRPO_SLOW_DIST=1 runs these tests.
SLOW = pytest.mark.skipif(os.environ.get("PADDLE_GRPO_SLOW_DIST") != "1",
                          reason="3-4 gloo processes on a 2-core machine; PADDLE_GRPO_SLOW_DIST=1 runs them")


def run_once(cmd, cwd, timeout=600):
    """Run `cmd` with this checkout first on PYTHONPATH; the CompletedProcess, whatever its exit status. A launch
    still running after `timeout` seconds gets SIGTERM (the launcher then stops its workers) and returncode None."""
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=timeout)
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return subprocess.CompletedProcess(cmd, None, out, err + f"\n(stopped after {timeout} s)")


def run(cmd, cwd):
    for attempt in (1, 2):
        out = run_once(cmd, cwd)
        # A gloo worker killed by a signal (SIGABRT, seen only while other test suites overloaded the 2 cores) is
        # retried once; any real error fails the second attempt the same way.
        if out.returncode == 0 or "Exit code -" not in out.stdout + out.stderr or attempt == 2:
            break
        print(f"retrying after a worker died by a signal: {out.stdout[-300:]}")
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    return out


def read_metrics(output_dir):
    """{step: metrics row} of a run's metrics.jsonl (rank 0 alone writes it)."""
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return {row["step"]: row for row in map(json.loads, lines)}


def read_params(checkpoint_dir):
    return {k: v.numpy() for k, v in paddle.load(str(checkpoint_dir / "model_state.pdparams")).items()}


def assert_resume_exact(tmp_path, run_rl, cfg, args, full_dir=None):
    """Resume a launched run (`args`: 4 steps, a checkpoint every 2) from the checkpoint at step 2 of `full_dir`
    (run here first when None) and require steps 3-4 and the final parameters to equal the uninterrupted run's,
    bit for bit. (Exact equality holds: the same launch on the same machine in the same environment runs the same
    kernels in the same order; a resume must reproduce it, not approximate it.)"""
    if full_dir is None:
        full_dir = tmp_path / "full"
        run(launch(run_rl, cfg, "--output_dir", full_dir, *args, log_dir=tmp_path / "log_full"), tmp_path)
    (tmp_path / "resumed").mkdir()
    shutil.copytree(full_dir / "checkpoint-2", tmp_path / "resumed" / "checkpoint-2")
    run(launch(run_rl, cfg, "--output_dir", tmp_path / "resumed", "--resume_from_checkpoint", "true", *args,
               log_dir=tmp_path / "log_resumed"), tmp_path)
    full, resumed = read_metrics(full_dir), read_metrics(tmp_path / "resumed")
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        for key, value in full[step].items():
            if not key.startswith("perf/"):
                assert resumed[step][key] == value, (step, key)
    pa, pb = read_params(full_dir / "checkpoint-4"), read_params(tmp_path / "resumed" / "checkpoint-4")
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
