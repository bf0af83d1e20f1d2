"""`rollout_precision`: the CPU decode engine's products in bfloat16 for the training rollouts, against a float32
trainer whose rollout correction (tis unless set) absorbs and logs the mismatch; evaluation samples in float32."""
import json
import os
import subprocess
import sys

import pytest
from dry_run_helpers import REPO, base_args, one_step_run_argv, run_rl_main
from test_dry_run_async_correction import quickstart_copy

from paddle_grpo.config import ConfigError, load_config
from paddle_grpo.kernels import gemm


def bf16_or_skip():
    try:
        gemm.best_backend("bfloat16")
    except ValueError as e:
        pytest.skip(f"no bfloat16 GEMM on this CPU: {e}")


@pytest.mark.parametrize("extra, mode", [
    ("rollout_precision: bfloat16\n", "tis"),                                  # corrected by default
    ("rollout_precision: bfloat16\nrollout_correction: none\n", "none"),       # an explicit none is kept
    ("rollout_precision: bfloat16\nrollout_correction: mis\n", "mis"),
    ("rollout_precision: bfloat16\nasync_rollout: true\n", "clip"),            # a lagged sampler's default first
    ("rollout_precision: float32\n", "none"),
])
def test_a_reduced_precision_sampler_defaults_to_tis(tmp_path, extra, mode):
    cfg = load_config(quickstart_copy(tmp_path, extra), [], warn=False)
    assert cfg.correction_mode == mode
    if mode == "tis":
        assert "rollout_correction: tis  # not set: the default for rollout_precision bfloat16" in cfg.format()
        assert "the default for rollout_precision bfloat16" in cfg.correction_reason


def test_an_unknown_precision_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"rollout_precision.*'float16'.*must be one of 'float32', 'bfloat16'"):
        load_config(quickstart_copy(tmp_path, "rollout_precision: float16\n"), [], warn=False)


def test_the_dry_run_names_the_products_the_rollout_runs(tmp_path, tiny_policy_dir, capsys):
    bf16_or_skip()
    argv = [*base_args(tmp_path, tiny_policy_dir), "--rollout_precision", "bfloat16", "--dry_run"]
    status, out, _ = run_rl_main(argv, capsys)
    assert status == 0, out
    lines = out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.strip().startswith("decoder: "))
    assert lines[at].strip() == "decoder: fast path (qwen2)"
    assert lines[at + 1].strip().startswith("decode engine: numpy steps, GEMM: ") and "bfloat16" in lines[at + 1]
    assert "rollout_correction: tis" in out


def test_a_bf16_rollout_trains_and_logs_the_mismatch(tmp_path, tiny_policy_dir):
    """One real step (run_rl.py in a subprocess): the sampler's log-probs come from bf16 products, so the logged
    sampler-trainer KL is positive but small, and the tis weights stay near 1."""
    bf16_or_skip()
    argv, out_dir = one_step_run_argv(tmp_path, tiny_policy_dir)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, *argv, "--rollout_precision", "bfloat16"], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    # bf16 rounding of the products' inputs (2^-9 relative each) moves the tiny model's log-probs by ~1e-4-1e-3
    # (measured: KL 1.3e-7, largest ratio 1.0015), a float32 sampler by ~1e-6 (KL 0.0, largest ratio 1 + 1e-6 with
    # `--rollout_correction tis` alone): the KL per token is of the order of their square, so above 1e-9 only in
    # bf16, and below 0.05 unless the sampler were another policy.
    assert 1e-9 < row["rollout_correction/kl"] < 0.05, row
    assert 0.9 < row["rollout_correction/ess"] <= 1.0 + 1e-9, row


def test_the_key_has_no_effect_off_the_cpu():
    """On a GPU the rollout runs in the AMP precision (bf16 / fp16 keys): rollout_precision is ignored there, as
    the configuration's effect table says, instead of stopping the run."""
    from paddle_grpo.config import FIELDS
    from paddle_grpo.policy.causal import cpu_rollout_precision

    assert cpu_rollout_precision("cpu", "bfloat16") == "bfloat16"
    assert cpu_rollout_precision("gpu:0", "bfloat16") == "float32"
    assert cpu_rollout_precision("gpu:0", "float32") == "float32"
    assert "AMP" in FIELDS["rollout_precision"].metadata["effect"]["gpu"].note
