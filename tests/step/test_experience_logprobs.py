"""Which log-probs the experience phase takes (issue 41, item 1.3; docs/algorithms.md section 4, "What old is"):

- the reward's KL term (kl_coeff) takes the sampler's log-probs whatever the mini-batching, so with a sampler that
  disagrees with the trainer (a lag) the advantages of one optimizer step per step and of several are the same;
- with `rollout_correction: clip` and several optimizer steps the old-log-prob pass is not run (verl's bypass mode:
  its result would be discarded), with `tis` it is.

Real runs of the trainer on the tiny policy (one step each). The sampler's log-probs are shifted by SHIFT at even
positions after the collect phase, as a sampler with other (older) weights would report them
(tests/workers/lagged_sampler_run_rl.py does the same for the pipeline test).
"""
import json

import numpy as np
import paddle
import pytest

from paddle_grpo import step
from paddle_grpo.config import config_from_dict

pytestmark = pytest.mark.e2e

SHIFT = 0.5
COLLECT, ESTIMATE = step.collect, step.estimate_advantages  # the originals, wrapped afresh for each run
REWARD = """
def length_reward(prompts, completions, **kwargs):
    return [0.1 * len(c) for c in completions]
"""


def run_one_step(tmp_path, policy_dir, name, monkeypatch, **overrides):
    """Train one step with the lagged sampler; returns (trainer, what estimate_advantages received and gave)."""
    from paddle_grpo.trainer import Trainer

    rows = [{"src": f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n", "tgt": n}
            for n in ("Ann", "Bob", "Cid", "Dan")]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "rewards.py").write_text(REWARD)
    out = tmp_path / name
    values = dict(
        actor_model_name_or_path=policy_dir, use_rm_server=False,
        reward_funcs=f"{tmp_path / 'rewards.py'}:length_reward", train_datasets=str(tmp_path / "train.jsonl"),
        output_dir=str(out), logging_dir=str(out / "vdl"), max_prompt_len=32, max_dec_len=8, min_dec_len=1,
        max_length=40, global_batch_size=4, rollout_n=4, per_device_train_batch_size=8,
        per_device_logprob_batch_size=16, learning_rate=2e-3, max_steps=1, kl_coeff=0.0, save_strategy="no",
        disable_tqdm=True, seed=7, temperature=0.9, report_to="none")
    values.update(overrides)
    collect, estimate = COLLECT, ESTIMATE
    seen = {}

    def lagged_collect(*args, **kwargs):
        batch, metrics = collect(*args, **kwargs)
        T = batch.sample_logprobs.shape[1]
        even = paddle.to_tensor((np.arange(T) % 2 == 0).astype("float32"))[None]
        batch.sample_logprobs = batch.sample_logprobs - SHIFT * even * batch.completion_mask.astype("float32")
        seen["sample"] = batch.sample_logprobs.numpy().copy()
        return batch, metrics

    def spy_estimate(rows, rewards, cfg):
        out = estimate(rows, rewards, cfg)
        seen.update(old=None if rows.old is None else rows.old.copy(), mask=rows.mask.copy(),
                    advantages=out.advantages.copy())
        return out

    monkeypatch.setattr(step, "collect", lagged_collect)  # what Trainer.train_step calls (through the package)
    monkeypatch.setattr(step, "estimate_advantages", spy_estimate)
    trainer = Trainer(config_from_dict(values))
    return trainer, seen


def test_the_reward_kl_does_not_depend_on_the_mini_batching(tmp_path, tiny_policy_dir, monkeypatch):
    """REINFORCE++ with the KL in the reward (k1 per token) and a lagged sampler: one optimizer step per step
    (on-policy) and two (global_mini_batch_size 2) give the same advantages bit for bit (the same maths on the same
    inputs in one process), and the KL's policy side is the sampler's log-probs. Before, two optimizer steps took
    the trainer's recomputed log-probs there, whose gap of SHIFT at even positions moved the advantages."""
    results = {}
    for mini in (-1, 2):
        trainer, seen = run_one_step(tmp_path, tiny_policy_dir, f"mini{mini}", monkeypatch,
                                     rl_algorithm="reinforce_plus_plus", kl_coeff=0.1, global_mini_batch_size=mini)
        metrics = trainer.train()
        assert metrics["train/optimizer_steps"] == (1 if mini == -1 else 2)
        m = seen["mask"].astype(bool)
        np.testing.assert_array_equal(seen["old"][m], seen["sample"][:, :m.shape[1]][m])  # the sampler's, exactly
        results[mini] = seen
    np.testing.assert_array_equal(results[-1]["advantages"], results[2]["advantages"])
    np.testing.assert_array_equal(results[-1]["sample"], results[2]["sample"])  # the same rollout (the check's base)


@pytest.mark.parametrize("mode, passes", [("clip", 0), ("tis", 1)])
def test_clip_skips_the_old_log_prob_pass(tmp_path, tiny_policy_dir, monkeypatch, mode, passes):
    """Two optimizer steps per step: `tis` weights by the old log-probs, so the trainer computes them once before the
    update (one eval-mode pass over the batch, one micro-batch of per_device_logprob_batch_size 16 rows); `clip`
    takes the sampler's as old and the pass is not run. The forward passes the policy makes in eval mode are
    counted (the update's run in train mode, the rollout does not call Policy.logprobs); no reference model (KL 0)."""
    trainer, _ = run_one_step(tmp_path, tiny_policy_dir, mode, monkeypatch, global_mini_batch_size=2,
                              rollout_correction=mode)
    policy, counts = trainer.policy, {"eval": 0, "train": 0}
    forward = policy.logprobs

    def counting(*args, **kwargs):
        counts["train" if policy.model.training else "eval"] += 1
        return forward(*args, **kwargs)

    monkeypatch.setattr(policy, "logprobs", counting)
    metrics = trainer.train()
    assert metrics["train/optimizer_steps"] == 2
    assert counts["eval"] == passes
    assert counts["train"] == 2  # the update's forward: 2 mini-batches of 8 rows, one micro-batch each
    # With clip the ratio statistics compare the current policy with the (shifted) sampler: the gap is seen.
    assert metrics["rollout_correction/ratio_max"] > 1.3
