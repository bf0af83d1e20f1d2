"""PPO with a critic on several CPU processes (gloo) against one process: 2 data-parallel ranks, tensor parallel
2, sharding stage1 (and its exact resume). The same global batch and seed: sampling is keyed by global row, the
values are gathered with the other per-row data so GAE runs on the global batch, and the critic's value loss takes
the mini-batch's global token count, so metrics, the policy and the critic must agree up to float32 rounding of
other summation orders (launch_helpers' tolerances, derived there for these tiny runs)."""
import json
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest
from launch_helpers import (SLOW, TINY_REL_TOL, assert_checkpoints_match, assert_metrics_match, assert_resume_exact,
                            launch, read_metrics, run, write_config)
from numerics import assert_adam_close

CRITIC_LR = 1e-3  # as write_config's policy learning rate: assert_adam_close's lr for both models


def ppo_config(tmp_path, tiny_policy_dir):
    """write_config's tiny run as PPO (kl_coeff 0.01 in the reward), its critic initialised from the policy, two
    mini-batches (optimizer steps) per step."""
    path = write_config(tmp_path, tiny_policy_dir, "ppo")
    cfg = json.loads(path.read_text())
    cfg.update(critic_model_name_or_path=tiny_policy_dir, critic_learning_rate=CRITIC_LR, global_mini_batch_size=2,
               per_device_value_batch_size=4)
    path.write_text(json.dumps(cfg))
    return path


def read_critic(checkpoint_dir):
    return {k: v.numpy() for k, v in paddle.load(str(checkpoint_dir / "critic" / "model_state.pdparams")).items()}


def assert_critics_match(one, two, initial_dir, optimizer_steps, checkpoint="checkpoint-2"):
    """The critics of two runs at `checkpoint` are the same Adam training from the critic `load_critic` builds of
    the policy (its backbone; the value head starts at 0), as assert_checkpoints_match does for the policy."""
    from paddle_grpo.policy import load_critic

    a, b = read_critic(Path(one) / checkpoint), read_critic(Path(two) / checkpoint)
    initial = {k: v.numpy() for k, v in load_critic(initial_dir).model.state_dict().items()}
    assert set(a) == set(b) == set(initial)
    return assert_adam_close(a, b, initial, lr=CRITIC_LR, steps=optimizer_steps, rel=TINY_REL_TOL)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny_policy_dir, repo_root):
    """one_process(*args): the output directory of run_rl.py on ppo_config's run in one process with `args`, run
    once per module for each `args`: the data-parallel and tensor-parallel launches compare with the same run."""
    runs = {}

    def get(*args):
        key = tuple(map(str, args))
        if key not in runs:
            work = tmp_path_factory.mktemp("one_ppo")
            cfg = ppo_config(work, tiny_policy_dir)
            run([sys.executable, str(repo_root / "run_rl.py"), str(cfg), "--output_dir", str(work / "one"), *key],
                work)
            runs[key] = work / "one"
        return runs[key]

    return get


@pytest.mark.e2e
@pytest.mark.numerics
# sharding: 3 launches of 4 steps (its parity, then the resume), about 2 minutes on 2 loaded cores: opt-in
# (PADDLE_GRPO_SLOW_DIST=1), as the suite must stay fast; data parallel and tensor parallel always run.
@pytest.mark.parametrize("layout", ["data_parallel", "tensor_parallel", pytest.param("sharding", marks=SLOW)])
def test_ppo_on_two_processes_equals_one_process(tmp_path, tiny_policy_dir, repo_root, layout, one_process):
    """Sharding runs 4 steps with a checkpoint at 2 and is then resumed from it: steps 3-4, the policy and the
    critic (whose AdamW states are split over the 2 ranks as the policy's) equal the uninterrupted run bitwise."""
    cfg = ppo_config(tmp_path, tiny_policy_dir)
    extra = {"data_parallel": [], "tensor_parallel": ["--tensor_parallel_degree", 2],
             "sharding": ["--sharding", "stage1"]}[layout]
    sharding = layout == "sharding"
    steps = ["--max_steps", 4, "--save_steps", 2, "--critic_lr_scheduler_type", "cosine"] if sharding else []
    one_dir = one_process(*steps)
    one = read_metrics(one_dir)
    run(launch(repo_root / "run_rl.py", cfg, "--output_dir", tmp_path / "two", *steps, *extra,
               log_dir=tmp_path / "log"), tmp_path)
    two = read_metrics(tmp_path / "two")
    assert sorted(one) == sorted(two) == list(range(1, 5 if steps else 3))
    rows_one, rows_two = [one[s] for s in sorted(one)], [two[s] for s in sorted(two)]
    assert assert_metrics_match(rows_one, rows_two) > 40
    for row in rows_one:  # the critic trained in both, on the global batch
        assert row["train/value_loss"] > 0 and row["train/critic_grad_norm"] > 0
    assert one[2]["train/values_mean"] != 0.0  # step 2's values come from a trained critic
    last = max(one)
    optimizer_steps = one[last]["train/optimizer_steps"]
    assert optimizer_steps == 2 * last
    ckpt = f"checkpoint-{last}"
    assert_checkpoints_match(one_dir, tmp_path / "two", tiny_policy_dir, optimizer_steps, checkpoint=ckpt)
    assert_critics_match(one_dir, tmp_path / "two", tiny_policy_dir, optimizer_steps, checkpoint=ckpt)
    critic_dir = tmp_path / "two" / ckpt / "critic"
    files = {"data_parallel": ["optimizer.pdopt"], "tensor_parallel": ["optimizer.tp0.pdopt", "optimizer.tp1.pdopt"],
             "sharding": ["optimizer.sharding0.pdopt", "optimizer.sharding1.pdopt"]}[layout]
    assert all((critic_dir / f).is_file() for f in files), sorted(p.name for p in critic_dir.iterdir())
    assert "Traceback" not in (tmp_path / "log" / "workerlog.1").read_text()
    if layout == "sharding":
        assert_resume_exact(tmp_path, str(repo_root / "run_rl.py"), cfg, [*steps, *extra], full_dir=tmp_path / "two")
        a, b = read_critic(tmp_path / "two" / ckpt), read_critic(tmp_path / "resumed" / ckpt)
        assert all(np.array_equal(a[k], b[k]) for k in a)
