"""The new policy losses, the adaptive entropy coefficient and mask_truncated_completions in real training runs of
the tiny Qwen2 (tests/conftest.py), configured from YAML files as a user would: each loss trains 2 steps with a
finite logged loss and changed parameters; the entropy coefficient follows its rule, is logged and survives an exact
resume; truncated completions leave the loss (docs/algorithms.md, "Entropy control")."""
import math

import numpy as np
import paddle
import pytest
import yaml

from paddle_grpo import step
from paddle_grpo.algorithms import adaptive_entropy_coeff
from paddle_grpo.config import config_from_dict, load_config
from paddle_grpo.parallel import ParallelContext
from paddle_grpo.step import Batch
from paddle_grpo.trainer import Trainer
from batch_helpers import grouped_batch
from resume_helpers import (assert_resumed_exactly, full_and_resumed, name_prompts_dir, params, read_metrics, tiny_run,
                            trained)

# A reward that varies with the completion under a random policy, so that every group has advantages.
REWARD_FILE = '''
def reward(prompts, completions, **kwargs):
    return [(sum(map(ord, c)) % 97) / 97 for c in completions]
'''


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return name_prompts_dir(tmp_path_factory.mktemp("losses"), REWARD_FILE)


def settings(workdir, policy_dir, out, **overrides):
    """A 2-step run of the tiny policy on `workdir`'s prompts and reward; update_iters 2: the second pass runs off
    policy (rho != 1), where the losses differ from REINFORCE."""
    return tiny_run(policy_dir, f"{workdir / 'rewards.py'}:reward", workdir / "train.jsonl", out,
                    **{"max_dec_len": 6, "update_iters": 2, **overrides})


def yaml_cfg(tmp_path, values):
    """The config loaded from a YAML file holding `values` (the path a user takes)."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(values))
    return load_config(str(path), [])


@pytest.mark.parametrize("loss, extra", [
    ("cispo", {"clip_range_ratio_high": 4.0}),
    ("gmpo", {}),
    ("sapo", {"sapo_temperature_neg": 2.0}),
    ("clip_cov", {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.0}),
    ("kl_cov", {"kl_cov_ratio": 0.2}),
])
def test_each_new_loss_trains_from_yaml(workdir, tiny_policy_dir, tmp_path, loss, extra):
    cfg = yaml_cfg(tmp_path, settings(workdir, tiny_policy_dir, tmp_path / "out", policy_loss=loss, **extra))
    assert cfg.policy_loss == loss
    changed, rows = trained(Trainer(cfg))
    assert changed and [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert math.isfinite(row["train/policy_loss"]) and math.isfinite(row["train/grad_norm"])
        assert row["train/grad_norm"] > 0 and row["train/update_skipped"] == 0


def test_the_entropy_coefficient_follows_its_rule_and_survives_resume(workdir, tiny_policy_dir, tmp_path):
    # target 5.0 nats lies near the tiny random policy's entropies (at most ln 320 = 5.77); the coefficient must
    # follow adaptive_entropy_coeff step by step from the logged entropies, in both runs alike
    common = dict(max_steps=4, entropy_target=5.0, entropy_coeff=0.02, entropy_coeff_lr=0.01,
                  save_strategy="steps", save_steps=2, dataloader_shuffle=True, update_iters=1)
    full, resumed = full_and_resumed(lambda out, **kw: config_from_dict(settings(workdir, tiny_policy_dir, out, **kw)),
                                     tmp_path, 2, **common)
    assert_resumed_exactly(tmp_path, full, resumed, (3, 4))
    assert full.learner.state == resumed.learner.state
    a = {r["step"]: r for r in read_metrics(tmp_path / "full")}
    coeff, applied = 0.02, 0.02
    for n in (1, 2, 3, 4):
        assert a[n]["train/entropy_coeff"] == applied, n
        coeff, applied = adaptive_entropy_coeff(coeff, applied, a[n]["train/entropy"], 5.0, 0.01)
    assert (full.learner.state.entropy_coeff, full.learner.state.entropy_applied) == (coeff, applied)
    assert len({a[n]["train/entropy_coeff"] for n in a}) > 1  # it moved


def test_a_fixed_entropy_coeff_logs_no_coefficient(workdir, tiny_policy_dir, tmp_path):
    trainer = Trainer(config_from_dict(settings(workdir, tiny_policy_dir, tmp_path / "out", entropy_coeff=0.01,
                                                max_steps=1)))
    trainer.train()
    assert "train/entropy_coeff" not in read_metrics(trainer.cfg.output_dir)[0]
    assert trainer.learner.state.entropy_applied is None


def test_every_completion_truncated_and_masked_leaves_nothing_to_learn(workdir, tiny_policy_dir, tmp_path):
    # min_dec_len = max_dec_len: EOS is masked at every position, so every completion is truncated
    values = settings(workdir, tiny_policy_dir, tmp_path / "masked", min_dec_len=6, weight_decay=0.0,
                      mask_truncated_completions=True, update_iters=1)
    trainer = Trainer(yaml_cfg(tmp_path, values))
    before = params(trainer.policy.model)
    trainer.train()
    rows = read_metrics(trainer.cfg.output_dir)
    assert all(r["response_length/clip_ratio"] == 1.0 for r in rows)
    assert all(r["train/update_skipped"] == 1.0 and r["train/policy_loss"] == 0.0 for r in rows)
    after = params(trainer.policy.model)
    assert all(np.array_equal(before[k], after[k]) for k in before)  # zero gradients, no weight decay: no move
    plain = Trainer(config_from_dict({**values, "mask_truncated_completions": False,
                                      "output_dir": str(tmp_path / "plain"), "logging_dir": str(tmp_path / "pv")}))
    plain.train()
    assert any(not np.array_equal(before[k], v) for k, v in params(plain.policy.model).items())


def test_truncated_rows_leave_the_loss_mask_but_not_the_advantages(tiny_policy_dir, workdir, tmp_path):
    pid, pm, cid, cm = grouped_batch(320, P=2, G=4, T=5)
    n = cid.shape[0]
    truncated = np.array([True, False, False, True, False, True, False, False])
    rewards = np.linspace(0.0, 1.0, n)
    batch = Batch(prompt_ids=pid, prompt_mask=pm, completion_ids=cid, completion_mask=cm,
                  sample_logprobs=paddle.zeros(cid.shape), lengths=cm.numpy().sum(1), truncated=truncated,
                  texts=[""] * n, rewards=rewards, valid=np.ones(n, dtype=bool), scores_by_function={"r": []},
                  prompt_index=[0] * 4 + [1] * 4)
    rows = step.gather(ParallelContext(), batch, None, None)
    out = {}
    for mask_truncated in (False, True):
        cfg = config_from_dict(settings(workdir, tiny_policy_dir, tmp_path, mask_truncated_completions=mask_truncated))
        estimate = step.estimate_advantages(rows, rewards.astype(np.float32), cfg)
        out[mask_truncated] = step.update_inputs(rows, estimate, batch, None, None, None, cfg)[0]
    kept, masked = out[False], out[True]
    np.testing.assert_array_equal(kept.loss_mask.numpy(), cm.numpy())
    np.testing.assert_array_equal(masked.loss_mask.numpy(), cm.numpy() * ~truncated[:, None])
    # TRL's: the truncated completions' rewards still count in their groups' advantages
    np.testing.assert_array_equal(kept.advantages.numpy(), masked.advantages.numpy())
    assert (masked.advantages.numpy()[truncated] != 0).any()
