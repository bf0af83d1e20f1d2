"""tools/bench/bench.py end to end on a tiny shape: the JSON line, its keys, and that the numbers are consistent; the
variable-length mode, the per-phase RSS, the config overrides, the rollout's floor and the --ops delegation."""
import json
import math
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "tools" / "bench" / "bench.py"
TINY = REPO / "tools" / "bench" / "shapes" / "tiny.json"
PHASES = ("rollout", "reward", "logprob", "reference", "value", "update", "critic_update", "other")


def run_bench_with_stderr(*args):
    out = subprocess.run([sys.executable, str(BENCH), "--shape", str(TINY), "--threads", "1",
                          *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout  # exactly one JSON line on stdout
    return json.loads(lines[0]), out.stderr


def run_bench(*args):
    return run_bench_with_stderr(*args)[0]


@pytest.fixture(scope="module")
def default_run():
    return run_bench_with_stderr()


@pytest.fixture(scope="module")
def result(default_run):
    return default_run[0]


# tiny.json's matrix-product FLOPs per token, by hand: hidden 32, 4 heads of 8, 2 key-value heads, intermediate 64,
# 2 layers, vocabulary 64 (untied head): 2 x (2 x (q 32x32 + k, v 32x16 + o 32x32 + gate, up, down 32x64) + 64x32)
TINY_FLOP_PER_TOKEN = 2 * (2 * (32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64) + 64 * 32)
# float64 recomputation of the floor in another order than bench.py's: a few roundings of 2^-53 each side
FLOOR_REL = 8 * 2.0 ** -53


def tiny_floor(rate):
    """tiny.json's rollout floor by its definition: the step's 2 prompts of 8 tokens once each (their 3 samples
    share the prefill) and 2 x 3 x 5 sampled tokens, TINY_FLOP_PER_TOKEN each, at `rate` GFLOP/s."""
    return TINY_FLOP_PER_TOKEN / (rate * 1e9) * (2 * 8) + TINY_FLOP_PER_TOKEN / (rate * 1e9) * (2 * 3 * 5)


def test_rollout_floor_beside_the_rollout(default_run):
    """The floor keys (issue 42): FLOPs per token as counted by hand, the prompt tokens once per prompt, the GEMM
    rate measured in the run's process (gemm_peak), the floor and the ratio by their definitions; the same on the
    summary line (stderr)."""
    r, stderr = default_run
    assert r["matmul_mflop_per_token"] * 1e6 == pytest.approx(TINY_FLOP_PER_TOKEN, rel=FLOOR_REL)
    assert (r["rollout_prompt_tokens"], r["rollout_sampled_tokens"]) == (2 * 8, 2 * 3 * 5)
    assert r["gemm_rate_measured"] == {"1": True} and 0.1 < r["gemm_gflop_per_s_best"] < 1e5
    assert r["rollout_floor_s"] == pytest.approx(tiny_floor(r["gemm_gflop_per_s_best"]), rel=FLOOR_REL)
    assert r["rollout_floor_ratio"] == pytest.approx(r["rollout_s_median"] / r["rollout_floor_s"], rel=FLOOR_REL)
    assert (r["rollout_floor_s_1thread"], r["gemm_gflop_per_s_best_1thread"]) == \
        (r["rollout_floor_s"], r["gemm_gflop_per_s_best"])  # a 1-thread run: the same rate
    assert f"ratio {r['rollout_floor_ratio']:.2f}" in stderr and "16 prompt + 30 sampled tokens" in stderr


def test_keys_and_finite_values(result):
    for key in ["step_s_median", "completion_tokens_per_s", "completion_tokens_per_step", "peak_rss_mb"] + \
               [f"{p}_s_median" for p in PHASES]:
        assert isinstance(result[key], (int, float)) and math.isfinite(result[key]), key
    assert result["threads"] == 1 and result["paddle_version"].count(".") >= 2
    assert result["peak_rss_mb"] > 50
    assert result["fast_path"] is True
    assert len(result["step_s_all"]) == 2  # timed_steps
    # which CPU and kernel paths ran, so that runs on two CPU families can be told apart (docs/PERFORMANCE.md)
    from paddle_grpo import cpu_tuning

    kernels = result["kernels"]
    assert kernels["cpu"] == cpu_tuning.kernel_report()["cpu"]
    if "MKL_DEBUG_CPU_TYPE" in result["cpu_tuning"]:
        assert kernels["mkl_code_path"] == {"5": "AVX2", "7": "AVX-512"}[result["cpu_tuning"]["MKL_DEBUG_CPU_TYPE"]]


def test_completions_are_forced_to_completion_len(result):
    shape = json.loads(TINY.read_text())
    assert result["completion_tokens_per_step"] == \
        shape["prompts_per_step"] * shape["group_size"] * shape["completion_len"]
    # float64 division of the same numbers (JSON keeps 17 digits): approx's default rel 1e-6
    assert result["completion_tokens_per_s"] == pytest.approx(
        result["completion_tokens_per_step"] / result["step_s_median"])


def test_phases_add_up(result):
    assert result["reference_s_median"] > 0          # beta > 0: the reference model runs
    assert result["rollout_s_median"] > 0 and result["update_s_median"] > 0
    assert result["logprob_s_median"] < result["reference_s_median"]  # on-policy: no old-log-prob pass
    assert abs(result["other_s_median"]) < 0.5 * result["step_s_median"]
    assert result["step_s_min"] <= result["step_s_median"] <= result["step_s_max"]


def test_no_reference_without_kl_and_repeat_aggregates():
    """Also --gemm-rate: the given rate, not measured, in every run, and the aggregate's floor over its median
    rollout."""
    r = run_bench("--set", "beta=0", "--set", "timed_steps=1", "--repeat", "2", "--gemm-rate", "1=50")
    assert r["reference_s_median"] == 0.0 and r["shape"]["beta"] == 0
    assert r["repeat"] == 2 and len(r["step_s_median_runs"]) == 2
    assert min(r["step_s_median_runs"]) <= r["step_s_median"] <= max(r["step_s_median_runs"])
    assert r["gemm_rate_measured"] == {"1": False} and r["gemm_gflop_per_s_best"] == 50.0
    assert r["rollout_floor_s"] == pytest.approx(tiny_floor(50.0), rel=FLOOR_REL)
    assert r["rollout_floor_ratio"] == pytest.approx(r["rollout_s_median"] / r["rollout_floor_s"], rel=FLOOR_REL)


def test_peak_rss_by_phase(result):
    peaks, increases = result["peak_rss_mb_by_phase"], result["rss_increase_mb_by_phase"]
    # On-policy: no old-log-prob pass of its own (the reference pass calls step.logprobs inside its own phase).
    assert set(peaks) == set(increases) == {"rollout", "reference", "update", "step"}
    for phase, peak in peaks.items():
        assert result["rss_mb_before_steps"] * 0.9 < peak <= peaks["step"], phase  # the step encloses each phase
        assert 0 <= increases[phase] <= increases["step"] + 1e-9, phase
        assert peak < result["peak_rss_mb"] + 16, phase  # statm and getrusage agree to a few pages
    assert increases["step"] > 0


@pytest.fixture(scope="module")
def ppo_uniform():
    """One run for the PPO phases and the variable lengths (each bench run starts paddle and builds a model):
    --algorithm ppo, completions of uniform:2 lengths on completion_len 8, 3 timed steps, update_iters=2."""
    return run_bench("--algorithm", "ppo", "--lengths", "uniform:2", "--set", "completion_len=8",
                     "--set", "timed_steps=3", "--config", "update_iters=2")


def test_ppo_adds_the_critics_phases(ppo_uniform):
    """--algorithm ppo: the critic's values and update are phases of their own (time, peak RSS, GFLOP), the policy's
    update keeps its own; with GRPO (the module's `result`) the critic's phases are 0 / absent."""
    r = ppo_uniform
    assert r["algorithm"] == "ppo"
    assert r["value_s_median"] > 0 and r["critic_update_s_median"] > 0 and r["update_s_median"] > 0
    assert r["value_s_median"] + r["critic_update_s_median"] + r["update_s_median"] < r["step_s_median"]
    assert {"value", "critic_update", "update"} <= set(r["peak_rss_mb_by_phase"])
    for phase in ("value", "critic_update"):
        assert r["peak_rss_mb_by_phase"][phase] <= r["peak_rss_mb_by_phase"]["step"]
    gflop = r["gflop_per_step"]
    # the critic's pass covers all N x (L + T) tokens without an LM head; its update is 3x its forward
    assert gflop["critic_update"] == pytest.approx(3 * gflop["value"])  # float64 of the same sum: rel 1e-6


def test_grpo_has_no_critic_phases(result):
    assert result["algorithm"] == "grpo"
    assert result["value_s_median"] == 0.0 and result["critic_update_s_median"] == 0.0
    assert "value" not in result["peak_rss_mb_by_phase"] and "value" not in result["gflop_per_step"]


def test_variable_lengths_end_at_eos_with_the_drawn_lengths(ppo_uniform):
    """uniform:2 on completion_len 8: every row's completion_mask sum is its drawn length, in [2, 8], the rows end
    at EOS, and --config reaches the trainer (update_iters=2: off-policy, so the old-log-prob phase runs)."""
    r = ppo_uniform
    drawn, sums = r["drawn_lengths_by_step"], r["mask_sums_by_step"]
    shape = json.loads(TINY.read_text())
    assert len(drawn) == 3 and all(len(d) == shape["prompts_per_step"] * shape["group_size"] for d in drawn)
    assert sums == drawn
    flat = [n for d in drawn for n in d]
    assert min(flat) >= 2 and max(flat) <= 8 and len(set(flat)) >= 3  # not all fixed at one length
    assert drawn[0] != drawn[1]  # drawn per step
    assert r["completions_end_at_eos"] is True
    assert (r["completion_len_min"], r["completion_len_max"]) == (min(flat), max(flat))
    assert r["completion_len_mean"] == pytest.approx(np.mean(flat))  # float64 mean of integers: rel 1e-6 default
    assert r["completion_tokens_per_step"] == np.median([sum(d) for d in drawn])
    assert r["lengths"] == "uniform:2" and r["shape"]["config"] == {"update_iters": 2}
    assert r["logprob_s_median"] > 0 and r["peak_rss_mb_by_phase"]["logprob"] > 0
    assert r["rss_increase_mb_by_phase"]["logprob"] >= 0


def test_fixed_lengths_report(result):
    shape = json.loads(TINY.read_text())
    assert result["lengths"] == "fixed"
    assert result["completion_len_min"] == result["completion_len_max"] == shape["completion_len"]
    assert "drawn_lengths_by_step" not in result


# ------------------------------------------------------------------------------------------------ in process

@pytest.fixture(scope="module")
def bench(load_tool):
    return load_tool("bench/bench")


def test_draw_lengths_uniform_and_keyed(bench):
    from paddle_grpo.rollout.sampling import row_keys

    keys = row_keys(0, 1000, np.arange(4000))
    a = bench.draw_lengths(keys, 3, 9)
    assert a.dtype == np.int64 and a.min() == 3 and a.max() == 9
    counts = np.bincount(a - 3, minlength=7)
    assert counts.min() > 4000 / 7 * 0.8 and counts.max() < 4000 / 7 * 1.2  # every value, roughly equally often
    np.testing.assert_array_equal(a, bench.draw_lengths(keys, 3, 9))  # a row's length depends on its key only
    np.testing.assert_array_equal(a[100:200], bench.draw_lengths(keys[100:200], 3, 9))
    assert (bench.draw_lengths(row_keys(0, 2000, np.arange(4000)), 3, 9) != a).mean() > 0.5  # another step
    assert (bench.draw_lengths(keys, 5, 5) == 5).all()


def test_parse_lengths(bench):
    assert bench.parse_lengths(None, 8) is None and bench.parse_lengths("fixed", 8) is None
    assert bench.parse_lengths("uniform:1", 8) == 1 and bench.parse_lengths("uniform:8", 8) == 8
    for bad in ("uniform:0", "uniform:9", "uniform", "normal:3", "uniform:x"):
        with pytest.raises(SystemExit, match="lengths"):
            bench.parse_lengths(bad, 8)


class _FakePolicy:
    """generate() returns a full-width rollout of random non-EOS tokens, as rollout.generate does with EOS
    suppressed (min_new_tokens = max_new_tokens); records its keyword arguments."""

    def __init__(self):
        self.calls = []

    def generate(self, prompt_ids, prompt_mask, **kwargs):
        import paddle

        from paddle_grpo.rollout import Rollout

        self.calls.append(kwargs)
        n, T = len(kwargs["row_keys"]), kwargs["max_new_tokens"]
        ids = np.random.default_rng(0).integers(10, 50, size=(n, T))
        logps = -np.random.default_rng(1).random((n, T)).astype("float32")
        return Rollout(prompt_ids=paddle.to_tensor(prompt_ids), prompt_mask=paddle.to_tensor(prompt_mask),
                       completion_ids=paddle.to_tensor(ids), completion_mask=paddle.ones([n, T], dtype="int64"),
                       lengths=np.full(n, T), truncated=np.ones(n, dtype=bool),
                       sample_logprobs=paddle.to_tensor(logps))


@pytest.mark.parametrize("low,high", [(1, 6), (4, 4), (3, 12)])
def test_variable_lengths_cuts_each_row_at_eos(bench, low, high):
    from paddle_grpo.rollout.sampling import row_keys

    policy = _FakePolicy()
    drawn = bench.variable_lengths(policy, low)
    keys = row_keys(7, 3000, np.arange(6))
    prompts = np.ones((6, 2), dtype="int64")
    out = policy.generate(prompts, prompts, num_samples=1, max_new_tokens=high, min_new_tokens=high,
                          eos_token_ids=[2], pad_token_id=0, row_keys=keys)
    want = bench.draw_lengths(keys, low, high)
    longest = int(want.max())
    # The rollout decoded only to its longest row, with EOS suppressed up to there.
    assert policy.calls[0]["max_new_tokens"] == policy.calls[0]["min_new_tokens"] == longest
    np.testing.assert_array_equal(drawn[0], want)
    np.testing.assert_array_equal(out.lengths, want)
    assert not out.truncated.any()
    ids, mask, logps = out.completion_ids.numpy(), out.completion_mask.numpy(), out.sample_logprobs.numpy()
    raw = np.random.default_rng(0).integers(10, 50, size=(6, longest))
    assert ids.shape == mask.shape == logps.shape == (6, longest)
    for i, n in enumerate(want):
        np.testing.assert_array_equal(ids[i, :n - 1], raw[i, :n - 1])  # sampled tokens kept
        assert ids[i, n - 1] == 2 and (ids[i, n:] == 0).all()        # EOS, then pad
        np.testing.assert_array_equal(mask[i], np.arange(longest) < n)
        assert (logps[i, n:] == 0).all() and (logps[i, :n] < 0).all()
    with pytest.raises(ValueError, match="row_keys"):
        policy.generate(prompts, prompts, max_new_tokens=high, eos_token_ids=[2], pad_token_id=0)


def test_rss_monitor_sees_a_short_spike(bench):
    """A 256 MB block touched and freed at once inside a phase: the kernel's high-water mark keeps it, and the
    reset at the next boundary keeps it out of the following phase."""
    monitor = bench.RssMonitor()
    assert monitor.resettable, "/proc/self/clear_refs is not writable here"
    try:
        with monitor.phase("outer"):
            with monitor.phase("spike"):
                block = np.ones(32 * 2**20)  # 256 MB of float64, touched
                del block
            with monitor.phase("idle"):
                time.sleep(0.01)
    finally:
        monitor.close()
    s = monitor.summary()
    assert 240 < s["rss_increase_mb_by_phase"]["spike"] < 300
    assert s["rss_increase_mb_by_phase"]["idle"] < 20
    assert s["peak_rss_mb_by_phase"]["outer"] >= s["peak_rss_mb_by_phase"]["spike"]
    assert s["rss_increase_mb_by_phase"]["outer"] >= s["rss_increase_mb_by_phase"]["spike"]
    assert monitor.peak_mb() >= s["peak_rss_mb_by_phase"]["spike"]


def test_phase_hooks_wrap_and_restore(bench):
    from paddle_grpo import step

    before = {n: getattr(step, n) for n in ("rollout", "logprobs", "reference_logprobs", "update")}
    monitor = bench.RssMonitor()
    try:
        with bench.phase_hooks(monitor):
            assert all(getattr(step, n) is not f for n, f in before.items())
    finally:
        monitor.close()
    assert all(getattr(step, n) is f for n, f in before.items())


def test_shape_config_overrides_trainer_keys(bench, tmp_path):
    from paddle_grpo.config import ConfigError

    shape = json.loads(TINY.read_text())
    cfg = bench.make_config({**shape, "config": {"learning_rate": 0.25, "update_iters": 3}}, "m", "d", str(tmp_path))
    assert cfg.learning_rate == 0.25 and cfg.update_iters == 3
    assert bench.make_config(shape, "m", "d", str(tmp_path)).learning_rate == 1e-5
    with pytest.raises((ConfigError, ValueError, TypeError), match="no_such_key"):
        bench.make_config({**shape, "config": {"no_such_key": 1}}, "m", "d", str(tmp_path))


def test_real_size_shape_file():
    shape = json.loads((REPO / "tools" / "bench" / "shapes" / "qwen2.5-0.5b-2layers.json").read_text())
    peer = {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_layers": 2, "num_heads": 14,
            "num_kv_heads": 2, "prompt_len": 64, "completion_len": 128, "prompts_per_step": 2, "group_size": 4,
            "beta": 0.04, "warmup_steps": 1, "timed_steps": 2}
    assert shape == {**peer, "config": {"use_fused_head_and_loss_fn": True}}


def test_ops_delegates_to_bench_ops(bench, monkeypatch):
    seen = []
    fake = type(sys)("bench_ops")
    fake.main = lambda argv=None: seen.append(argv) or 0
    monkeypatch.setitem(sys.modules, "bench_ops", fake)
    assert bench.main(["--threads", "1", "--ops", "--vocab", "1000"]) == 0
    assert seen == [["--threads", "1", "--vocab", "1000"]]


def test_async_rollout_reports_both_waits_and_both_processes():
    """--config async_rollout=true runs the real Trainer with its rollout worker: the line carries both waits, the
    staleness and each process's CPU share (CPU time / wall of the timed steps: at most ~1 per single-threaded
    process, allowed 2 for paddle's helper threads), and the step leaves out the worker's overlapped rollout."""
    r = run_bench("--config", "async_rollout=true")
    assert r["async_rollout"] is True and r["rollout_lag"] == 1 and r["staleness_max"] == 1.0
    for key in ("wait_for_samples_s_median", "worker_wait_for_weights_s_median"):
        assert 0 <= r[key] < r["step_s_max"] + 1, key
    assert 0 < r["trainer_busy"] <= 2 and 0 < r["worker_busy"] <= 2
    assert r["rollout_s_median"] > 0  # the worker's, reported though it overlapped
    assert r["other_s_median"] < r["step_s_median"]
    # beta > 0: the worker's reference pass (rollout_worker_reference), overlapped too: it is not subtracted from
    # the trainer's own log-prob time (which would then go negative) nor counted in the trainer's step.
    assert r["shape"]["beta"] > 0 and r["reference_s_median"] > 0
    assert r["logprob_s_median"] >= 0 and r["other_s_median"] >= 0
    with_trainer_ref = run_bench("--config", "async_rollout=true", "--config", "rollout_worker_reference=false",
                                 "--set", "timed_steps=1")
    assert with_trainer_ref["reference_s_median"] > 0 and with_trainer_ref["logprob_s_median"] >= 0
