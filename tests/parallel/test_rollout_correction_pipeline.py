"""The rollout correction on the pipeline's loss path (step/policy_update._pipeline_mini_batch: the sampler's
log-probs travel with the last stage's labels): `--pipeline_parallel_degree 2` against one process, on CPU with
gloo, with a sampler whose log-probs are off by e^-1 at even positions (tests/workers/lagged_sampler_run_rl.py), so
TIS caps about half the tokens and the loss depends on the correction. Off-policy (2 mini-batches per rollout: the
recomputed old log-probs travel with the labels too)."""
import math
import sys

import pytest
from launch_helpers import (TINY_REL_TOL, assert_checkpoints_match, assert_metrics_match, launch, read_metrics,
                            run, write_config)


@pytest.mark.e2e
def test_two_stages_apply_the_correction_as_one_process(tmp_path, tiny_policy_dir, repo_root):
    cfg = write_config(tmp_path, tiny_policy_dir, "grpo")
    worker = repo_root / "tests" / "workers" / "lagged_sampler_run_rl.py"
    common = ["--global_mini_batch_size", "2", "--rollout_correction", "tis"]
    run([sys.executable, str(worker), str(cfg), "--output_dir", str(tmp_path / "one"), *common], tmp_path)
    run(launch(worker, cfg, "--output_dir", tmp_path / "pp", "--pipeline_parallel_degree", 2, *common,
               log_dir=tmp_path / "log"), tmp_path)
    one = [row for _, row in sorted(read_metrics(tmp_path / "one").items())]
    pp = [row for _, row in sorted(read_metrics(tmp_path / "pp").items())]
    assert assert_metrics_match(one, pp) > 30  # the correction's statistics and the corrected losses among them
    for row in one:
        # Even positions: ratio e^1 (times the ~1 of the synchronous numerics), capped at 2; odd ones ~1.
        assert 0.3 < row["rollout_correction/capped_frac"] < 0.7
        assert row["rollout_correction/ratio_max"] == pytest.approx(math.e, rel=TINY_REL_TOL)
    # 2 steps x 2 mini-batches of Adam at lr 1e-3 (numerics.assert_adam_close).
    assert_checkpoints_match(tmp_path / "one", tmp_path / "pp", tiny_policy_dir, 4)
    for log in ("workerlog.0", "workerlog.1"):
        assert "Traceback" not in (tmp_path / "log" / log).read_text()
