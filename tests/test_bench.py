"""tools/bench.py end to end on a tiny shape: the JSON line, its keys, and that the numbers are consistent."""
import json
import math
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
TINY = REPO / "tools" / "shapes" / "tiny.json"
PHASES = ("rollout", "reward", "logprob", "reference", "update", "other")


def run_bench(*args):
    out = subprocess.run([sys.executable, str(REPO / "tools" / "bench.py"), "--shape", str(TINY), "--threads", "1",
                          *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout  # exactly one JSON line on stdout
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def result():
    return run_bench()


def test_keys_and_finite_values(result):
    for key in ["step_s_median", "completion_tokens_per_s", "completion_tokens_per_step", "peak_rss_mb"] + \
               [f"{p}_s_median" for p in PHASES]:
        assert isinstance(result[key], (int, float)) and math.isfinite(result[key]), key
    assert result["threads"] == 1 and result["paddle_version"].count(".") >= 2
    assert result["peak_rss_mb"] > 50
    assert result["fast_path"] is True
    assert len(result["step_s_all"]) == 2  # timed_steps


def test_completions_are_forced_to_completion_len(result):
    shape = json.loads(TINY.read_text())
    assert result["completion_tokens_per_step"] == \
        shape["prompts_per_step"] * shape["group_size"] * shape["completion_len"]
    assert result["completion_tokens_per_s"] == pytest.approx(
        result["completion_tokens_per_step"] / result["step_s_median"])


def test_phases_add_up(result):
    assert result["reference_s_median"] > 0          # beta > 0: the reference model runs
    assert result["rollout_s_median"] > 0 and result["update_s_median"] > 0
    assert result["logprob_s_median"] < result["reference_s_median"]  # on-policy: no old-log-prob pass
    assert abs(result["other_s_median"]) < 0.5 * result["step_s_median"]
    assert result["step_s_min"] <= result["step_s_median"] <= result["step_s_max"]


def test_no_reference_without_kl_and_repeat_aggregates():
    r = run_bench("--set", "beta=0", "--set", "timed_steps=1", "--repeat", "2")
    assert r["reference_s_median"] == 0.0 and r["shape"]["beta"] == 0
    assert r["repeat"] == 2 and len(r["step_s_median_runs"]) == 2
    assert min(r["step_s_median_runs"]) <= r["step_s_median"] <= max(r["step_s_median_runs"])
