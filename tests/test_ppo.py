"""PPO and VAPO end to end in one process: the trainer with a tiny random Qwen2 policy and a critic initialised from
it (policy/critic.py: a causal LM's backbone with a zero value head), real files, in-process rewards.

What the critic adds to a step (step/experience.py, step/critic_update.py), checked against independent references:
the values, returns and advantages the update receives against a direct forward of the critic and a numpy GAE
loop; both models train; pretrain_critic_steps leaves the policy bitwise untouched; a resumed run continues exactly
(critic weights, its optimizer, schedule and counters in the checkpoint); the critic's metrics reach metrics.jsonl
and VisualDL. Multi-process parity (2 data-parallel ranks, tensor parallel 2): tests/parallel/test_ppo_parallel.py.
"""
import json
import math
import os

import numpy as np
import paddle
import pytest
from numerics import f32_sum_tol

from paddle_grpo import step
from paddle_grpo.config import config_from_dict
from paddle_grpo.trainer import Trainer
from resume_helpers import full_and_resumed, params, read_metrics

NAMES = ["Ann", "Bob", "Cid", "Dan", "Eve", "Fay", "Gus", "Hal"]
# 1 for a completion naming the prompt's person, plus a length term: rewards vary within and across groups.
REWARD_FILE = '''
def name_reward(prompts, completions, tgt=None, **kwargs):
    return [float(t.split()[1] in c) + 0.05 * len(c) for t, c in zip(tgt, completions)]
'''
CRITIC_METRICS = ("train/value_loss", "train/value_clip_frac", "train/values_mean", "train/returns_mean",
                  "train/explained_variance", "train/critic_lr", "train/critic_grad_norm")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("ppo")
    rows = [{"src": f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n<think>",
             "tgt": f"(1) {n} is a knight"} for n in NAMES]
    (d / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (d / "rewards.py").write_text(REWARD_FILE)
    return d


def make_cfg(workdir, policy_dir, out, **overrides):
    values = dict(actor_model_name_or_path=policy_dir, critic_model_name_or_path=policy_dir, rl_algorithm="ppo",
                  use_rm_server=False, reward_funcs=f"{workdir / 'rewards.py'}:name_reward",
                  train_datasets=str(workdir / "train.jsonl"), output_dir=str(out), logging_dir=str(out / "vdl"),
                  max_prompt_len=32, max_dec_len=8, min_dec_len=1, max_length=40, global_batch_size=4, rollout_n=4,
                  per_device_train_batch_size=8, per_device_logprob_batch_size=16, per_device_value_batch_size=16,
                  learning_rate=2e-3, critic_learning_rate=1e-2, max_steps=2, kl_coeff=0.05, save_strategy="no",
                  disable_tqdm=True, seed=7, temperature=1.0,
                  # name_reward declares no maximum: what counts as correct for VAPO's positive examples (a
                  # completion of 8 or more characters, or one naming the person)
                  positive_example_min_reward=0.4)
    values.update(overrides)
    return config_from_dict(values)


@pytest.mark.parametrize("algorithm", ["ppo", "vapo"])
def test_a_step_trains_the_policy_and_the_critic_with_finite_metrics(workdir, tiny_policy_dir, tmp_path, algorithm):
    # pretrain_critic_steps 0: vapo's default (50) would leave the policy untouched for both steps
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", rl_algorithm=algorithm,
                               global_mini_batch_size=2, pretrain_critic_steps=0))
    policy0, critic0 = params(trainer.policy.model), params(trainer.critic_learner.critic.model)
    trainer.train()
    policy1, critic1 = params(trainer.policy.model), params(trainer.critic_learner.critic.model)
    # Every tensor of both models moved (the critic's backbone too: its zero head is nonzero after the first step).
    assert all(not np.array_equal(policy0[k], policy1[k]) for k in policy0)
    assert all(not np.array_equal(critic0[k], critic1[k]) for k in critic0)
    rows = read_metrics(tmp_path / "out")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for key in CRITIC_METRICS + ("train/policy_loss", "train/grad_norm"):
            assert math.isfinite(row[key]), (row["step"], key)
        assert row["train/value_loss"] > 0 and row["train/critic_grad_norm"] > 0
        assert 0.0 <= row["train/value_clip_frac"] <= 1.0
        assert row["train/critic_lr"] == 1e-2  # constant schedule
        # 2 mini-batches per step: two optimizer steps of each model
        assert row["train/optimizer_steps"] == 2 * row["step"]
        assert ("train/positive_lm_loss" in row) == (algorithm == "vapo")  # vapo's default coefficient 0.1
    # The zero value head: every value of the first experience is 0, so the explained variance is exactly 0.
    assert rows[0]["train/values_mean"] == 0.0 and rows[0]["train/explained_variance"] == 0.0
    assert trainer.critic_learner.state.optimizer_steps == 4
    if algorithm == "vapo":
        assert rows[0]["train/positive_lm_loss"] > 0  # an NLL


def gae_numpy(rewards, values, mask, gamma, lam):
    """Plain loop: from each row's last valid token backwards, next value and advantage 0 after it."""
    adv = np.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        next_value = next_adv = 0.0
        for t in reversed(np.flatnonzero(mask[i])):
            delta = rewards[i, t] + gamma * next_value - values[i, t]
            next_adv = delta + gamma * lam * next_adv
            adv[i, t] = next_adv
            next_value = values[i, t]
    return adv, (adv + values) * mask


def test_values_returns_and_advantages_fed_to_the_update_equal_an_independent_recomputation(
        workdir, tiny_policy_dir, tmp_path, monkeypatch):
    """Step 2 (the critic trained once, so its values are not the zero head's): the update's V_old equals a direct
    full-batch forward of the critic's backbone times its head (numpy), and its returns and advantages equal a numpy
    GAE loop (gamma 1, lam 0.9) over PaddleNLP's PPO reward: -kl_coeff (logp_old - logp_ref) on every token plus the
    score on the last. The values' micro-batches (3 rows) differ from the reference's single batch."""
    cfg = make_cfg(workdir, tiny_policy_dir, tmp_path / "out", per_device_value_batch_size=3, lam=0.9)
    trainer = Trainer(cfg)
    seen = {}
    reference_logprobs, update_critic = step.reference_logprobs, step.update_critic

    def keep_reference(*args, **kwargs):
        out = reference_logprobs(*args, **kwargs)
        seen["ref"] = out.numpy().astype(np.float64)
        return out

    def keep_inputs(learner, inputs, *args):
        critic, b = learner.critic, inputs.batch
        ids = paddle.concat([b.prompt_ids, b.completion_ids], axis=1)
        mask = paddle.concat([b.prompt_mask, b.completion_mask], axis=1).astype("int64")
        positions = paddle.to_tensor(np.maximum(np.cumsum(mask.numpy(), axis=1) - 1, 0))
        with paddle.no_grad():
            hidden = critic.backbone(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False,
                                     return_dict=True).last_hidden_state.numpy().astype(np.float64)
        L, T = b.prompt_ids.shape[1], b.completion_ids.shape[1]
        w = critic.head.weight.numpy().astype(np.float64)   # [H, 1]
        assert critic.head.bias is None or not np.any(critic.head.bias.numpy())
        seen.update(batch=b, inputs=inputs, hidden=hidden, w=w, values=(hidden[:, L - 1:L - 1 + T] @ w)[..., 0])
        return update_critic(learner, inputs, *args)

    monkeypatch.setattr(step, "reference_logprobs", keep_reference)
    monkeypatch.setattr(step, "update_critic", keep_inputs)
    trainer.train_step()
    policy_inputs = {}
    update = step.update
    monkeypatch.setattr(step, "update", lambda par, learner, inputs, *a: policy_inputs.update(x=inputs) or
                        update(par, learner, inputs, *a))
    metrics = trainer.train_step()

    b, inputs = seen["batch"], seen["inputs"]
    mask = b.completion_mask.numpy().astype(np.float64)
    assert np.all(b.valid) and mask.sum() > 8
    v_ref = seen["values"] * mask
    H = seen["hidden"].shape[-1]
    # The backbone's hidden states of two batch shapes differ by float32 rounding through its ~20 chained sums
    # (numerics.tiny_lm_tol's depth for 2 layers, width 128), relative to the hidden states' size; the value sums H
    # of them, each times |w|: max|h| * sum|w| * that, plus the head's own float32 sum of H terms.
    h_max = np.abs(seen["hidden"]).max()
    tol_v = h_max * np.abs(seen["w"]).sum() * f32_sum_tol(128, 1.0, depth=20) + f32_sum_tol(H, h_max * np.abs(
        seen["w"]).sum())
    assert np.abs(v_ref).max() > 1e-3  # the critic trained once: not the zero head's values
    np.testing.assert_allclose(inputs.old_values.numpy() * mask, v_ref, rtol=0, atol=tol_v)

    old = b.sample_logprobs.numpy().astype(np.float64)   # on-policy: the rollout's log-probs are the old ones
    kl = np.clip(old - seen["ref"], -10, 10)
    rewards = -cfg.kl_coeff * kl * mask
    last = mask.sum(1).astype(int) - 1
    rewards[np.arange(len(last)), last] += np.clip(b.rewards, -cfg.clip_range_score, cfg.clip_range_score)
    adv_ref, ret_ref = gae_numpy(rewards, v_ref, mask, 1.0, 0.9)
    assert np.abs(adv_ref).max() > 1e-3
    # Each advantage sums at most T = 8 deltas, each off by 2 tol_v (two values), plus float32 rounding of those
    # sums (magnitude the sum of |rewards| and |values| of the row).
    T = mask.shape[1]
    magnitude = np.abs(rewards).sum(1).max() + 2 * np.abs(v_ref).sum(1).max()
    tol_a = 2 * T * tol_v + f32_sum_tol(3 * T, magnitude)
    np.testing.assert_allclose(inputs.returns.numpy() * mask, ret_ref, rtol=0, atol=tol_a + tol_v)
    np.testing.assert_allclose(policy_inputs["x"].advantages.numpy() * mask, adv_ref, rtol=0, atol=tol_a)
    np.testing.assert_array_equal(inputs.loss_mask.numpy(), mask)
    # The metrics of the experience: token means over the batch and 1 - Var(R - V) / Var(R).
    m = mask.astype(bool)
    assert metrics["train/values_mean"] == pytest.approx(v_ref[m].mean(), abs=tol_v)
    assert metrics["train/returns_mean"] == pytest.approx(ret_ref[m].mean(), abs=tol_a + tol_v)
    ev = 1 - np.var(ret_ref[m] - v_ref[m]) / np.var(ret_ref[m])
    assert metrics["train/explained_variance"] == pytest.approx(ev, abs=1e-3)


def test_pretrain_critic_steps_train_the_critic_alone_first(workdir, tiny_policy_dir, tmp_path):
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", rl_algorithm="vapo",
                               pretrain_critic_steps=1))
    policy0, critic0 = params(trainer.policy.model), params(trainer.critic_learner.critic.model)
    first = trainer.train_step()
    policy1, critic1 = params(trainer.policy.model), params(trainer.critic_learner.critic.model)
    assert all(np.array_equal(policy0[k], policy1[k]) for k in policy0)  # same process, same kernels: bitwise
    # One mini-batch: the zero head learns; the backbone's gradient is 0 until the head is nonzero (dV/dh = w), so
    # only its weight decay moves it (not the norms', which take none).
    assert not np.array_equal(critic0["score.weight"], critic1["score.weight"])
    assert "train/policy_loss" not in first and "train/positive_lm_loss" not in first
    assert first["train/value_loss"] > 0 and trainer.learner.state.optimizer_steps == 0
    assert trainer.learner.scheduler.last_epoch == 0  # the policy's schedule waits too
    second = trainer.train_step()
    policy2 = params(trainer.policy.model)
    assert all(not np.array_equal(policy1[k], policy2[k]) for k in policy1)
    assert math.isfinite(second["train/policy_loss"]) and trainer.learner.state.optimizer_steps == 1
    assert trainer.critic_learner.state.optimizer_steps == 2


def test_pretrain_critic_steps_without_a_critic_leave_the_policy_update_alone(workdir, tiny_policy_dir, tmp_path):
    """The key has no effect without a critic (config notes say so): a GRPO step still updates the policy."""
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", rl_algorithm="grpo",
                               pretrain_critic_steps=2))
    assert trainer.critic_learner is None
    before = params(trainer.policy.model)
    first = trainer.train_step()
    after = params(trainer.policy.model)
    assert "train/policy_loss" in first and trainer.learner.state.optimizer_steps == 1
    assert any(not np.array_equal(before[k], after[k]) for k in before)


def test_a_resumed_run_continues_exactly_with_the_critic(workdir, tiny_policy_dir, tmp_path):
    """VAPO with value pretraining, a decaying critic schedule with warm-up and 2 mini-batches: stopped and resumed
    at step 2, steps 3-4 and both models equal the uninterrupted run's bit for bit."""
    common = dict(rl_algorithm="vapo", max_steps=4, pretrain_critic_steps=1, critic_lr_scheduler_type="cosine",
                  critic_warmup_ratio=0.25, critic_min_learning_rate=1e-3, global_mini_batch_size=2,
                  dataloader_shuffle=True, save_strategy="steps", save_steps=2)
    full, resumed = full_and_resumed(lambda out, **kw: make_cfg(workdir, tiny_policy_dir, out, **kw), tmp_path, 2,
                                     **common)
    a = {r["step"]: r for r in read_metrics(tmp_path / "full")}
    b = {r["step"]: r for r in read_metrics(tmp_path / "split")}
    for n in (3, 4):
        assert set(a[n]) == set(b[n])
        for key in a[n]:
            if not key.startswith("perf/"):
                assert a[n][key] == b[n][key], (n, key)
    assert a[4]["train/critic_lr"] < a[3]["train/critic_lr"] < 1e-2  # the critic's cosine decay, resumed
    for model in ("policy", "critic"):
        get = (lambda t: t.policy.model) if model == "policy" else (lambda t: t.critic_learner.critic.model)
        pa, pb = params(get(full)), params(get(resumed))
        assert all(np.array_equal(pa[k], pb[k]) for k in pa), model
    assert full.critic_learner.state == resumed.critic_learner.state
    ckpt = tmp_path / "split" / "checkpoint-2"
    assert (ckpt / "critic" / "optimizer.pdopt").is_file() and (ckpt / "critic" / "config.json").is_file()
    assert json.loads((ckpt / "trainer_state.json").read_text())["critic"]["optimizer_steps"] == 4


def test_the_critic_checkpoint_loads_as_a_critic(workdir, tiny_policy_dir, tmp_path):
    from paddle_grpo.policy import load_critic

    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", max_steps=1, save_strategy="steps"))
    trainer.train()
    loaded = load_critic(str(tmp_path / "out" / "checkpoint-1" / "critic"))
    assert loaded.kind == "critic checkpoint"
    mine = params(trainer.critic_learner.critic.model)
    theirs = params(loaded.model)
    assert set(mine) == set(theirs) and all(np.array_equal(mine[k], theirs[k]) for k in mine)


def test_the_critic_metrics_reach_metrics_jsonl_and_visualdl(workdir, tiny_policy_dir, tmp_path):
    from visualdl import LogReader

    Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", rl_algorithm="vapo", max_steps=2,
                     report_to="visualdl", pretrain_critic_steps=0)).train()
    rows = read_metrics(tmp_path / "out")
    logdir = tmp_path / "out" / "vdl"
    files = [f for f in os.listdir(logdir) if f.startswith("vdlrecords")]
    reader = LogReader(file_path=str(logdir / files[0]))
    scalars = set(reader.get_tags()["scalar"])
    for key in CRITIC_METRICS + ("train/positive_lm_loss", "perf/value_s"):
        assert key in scalars, key
        got = [(r.id, r.value) for r in reader.get_data("scalar", key)]
        # VisualDL keeps float32: one rounding, relative 2^-24
        assert [s for s, _ in got] == [1, 2], key
        assert [v for _, v in got] == pytest.approx([r[key] for r in rows], rel=1e-7, abs=1e-30), key


def test_a_failing_step_rewinds_and_saves_the_critic_and_the_resumed_run_is_exact(workdir, tiny_policy_dir,
                                                                                   tmp_path, monkeypatch):
    """Step 3 fails in the experience phase (the critic's values), after its prompts and random numbers were drawn
    and before any optimizer step: faults.StepGuard rewinds to the end of step 2 and saves it with the critic
    (weights, optimizer, schedule, counters); the same command then resumes to the uninterrupted run's history and
    weights, bit for bit."""
    common = dict(rl_algorithm="vapo", max_steps=4, global_mini_batch_size=2, critic_lr_scheduler_type="linear",
                  save_strategy="steps", save_steps=10)
    reference = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "ref", **common))
    reference.train()

    values = step.values

    def failing(*args, **kwargs):
        if trainer.step == 2:
            raise OSError("the critic's values failed")
        return values(*args, **kwargs)

    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", **common))
    monkeypatch.setattr(step, "values", failing)
    with pytest.raises(OSError, match="values failed") as info:
        trainer.train()
    assert "saved a checkpoint of the last completed step" in info.value.__notes__[0]
    state = json.loads((tmp_path / "out" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["step"] == 2 and state["critic"]["optimizer_steps"] == 4
    monkeypatch.setattr(step, "values", values)
    resumed = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", **common))
    resumed.train()
    a, b = read_metrics(tmp_path / "ref"), read_metrics(tmp_path / "out")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert {k: v for k, v in x.items() if not k.startswith("perf/")} == \
            {k: v for k, v in y.items() if not k.startswith("perf/")}
    for get in (lambda t: t.policy.model, lambda t: t.critic_learner.critic.model):
        pa, pb = params(get(reference)), params(get(resumed))
        assert all(np.array_equal(pa[k], pb[k]) for k in pa)


def test_the_step_guard_rewinds_the_critics_schedule_counters_and_loss_scale(workdir, tiny_policy_dir, tmp_path):
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", critic_lr_scheduler_type="linear"))
    critic = trainer.critic_learner
    before = json.dumps(critic.state_dict(), sort_keys=True)
    trainer.guard.begin()
    critic.scheduler.step()
    critic.state.nonfinite_total += 1
    critic.state.optimizer_steps += 1
    assert json.dumps(critic.state_dict(), sort_keys=True) != before
    trainer.guard.restore()
    assert json.dumps(critic.state_dict(), sort_keys=True) == before
    assert critic.optimizer.get_lr() == 1e-2


def test_the_positive_example_lm_loss_is_the_nll_of_the_correct_rows_of_the_batch(workdir, tiny_policy_dir, tmp_path,
                                                                                 monkeypatch):
    """VAPO, one mini-batch: train/positive_lm_loss is the mean of -log p over the tokens of the rows whose reward
    reaches positive_example_min_reward (0.4), whatever their group scored (numpy, from the rollout's own log-probs: the
    update's first forward is the sampling policy)."""
    from numerics import tiny_lm_tol

    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", rl_algorithm="vapo", max_steps=1,
                               pretrain_critic_steps=0))
    assert trainer.positive_min_reward == 0.4  # the key, exactly
    seen = {}
    update = step.update
    monkeypatch.setattr(step, "update", lambda par, learner, inputs, *a: seen.update(inputs=inputs) or
                        update(par, learner, inputs, *a))
    metrics = trainer.train_step()
    b = seen["inputs"].batch
    correct = np.asarray(b.rewards, dtype=np.float64) >= 0.4
    assert 0 < correct.sum() < len(b)
    mask = b.completion_mask.numpy().astype(bool) & correct[:, None]
    lp = b.sample_logprobs.numpy().astype(np.float64)
    want = -lp[mask].mean()
    np.testing.assert_array_equal(seen["inputs"].positive.numpy().astype(bool), mask)
    # the rollout's log-probs against the update's forward: another code path of the tiny policy (numerics)
    assert metrics["train/positive_lm_loss"] == pytest.approx(want, abs=tiny_lm_tol(128, 2, 320) + 1e-6 * want)


def test_vapo_with_groups_of_one_trains_on_its_correct_answers(workdir, tiny_policy_dir, tmp_path):
    """rollout_n 1: every correct answer is a positive example (the group-best rule gave none, and a loss of 0)."""
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", rl_algorithm="vapo", max_steps=1,
                               pretrain_critic_steps=0, rollout_n=1, global_batch_size=8,
                               per_device_train_batch_size=8))
    metrics = trainer.train_step()
    correct = np.asarray(trainer.batch.rewards, dtype=np.float64) >= 0.4
    assert correct.any() and metrics["train/positive_lm_loss"] > 0  # an NLL of at least one row


def test_vapo_without_a_known_correct_reward_stops_at_start_up(workdir, tiny_policy_dir, tmp_path):
    from paddle_grpo.config import ConfigError

    # name_reward declares no maximum, and neither positive_example_min_reward nor eval_max_reward is set.
    cfg = make_cfg(workdir, tiny_policy_dir, tmp_path / "out", rl_algorithm="vapo", positive_example_min_reward=None)
    with pytest.raises(ConfigError, match=r"positive_example_lm_coeff is 0.1 \(rl_algorithm 'vapo'\).*Set "
                                          r"positive_example_min_reward \(or eval_max_reward\)"):
        Trainer(cfg)
    # eval_max_reward is what eval/accuracy counts as correct: the positive examples follow it (minus 1e-6).
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out2", rl_algorithm="vapo",
                               positive_example_min_reward=None, eval_max_reward=1.4))
    assert trainer.positive_min_reward == 1.4 - 1e-6


def test_the_policy_schedule_spans_the_steps_after_value_pretraining(workdir, tiny_policy_dir, tmp_path):
    """Value pretraining of 1 step, then 2 policy steps of 2 optimizer steps each: the policy's cosine schedule
    (floor 0.1 x learning_rate) is sized for those 4 optimizer steps and ends at its floor; the critic, whose keys
    are unset, follows the policy's cosine schedule and floor over its own 6 optimizer steps (PaddleNLP's critic
    copies the actor's arguments)."""
    lr, floor, critic_lr = 2e-3, 2e-4, 1e-2
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", rl_algorithm="vapo", max_steps=3,
                               pretrain_critic_steps=1, global_mini_batch_size=2, learning_rate=lr,
                               min_learning_rate=floor, lr_scheduler_type="cosine", critic_learning_rate=critic_lr))
    trainer.train()
    rows = read_metrics(tmp_path / "out")

    def cosine(peak, low, s, total):  # lr_lambda by hand: no warm-up, p = s / total
        return low + (peak - low) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total)))

    # float64 evaluations of one formula in a different order: a few ulps apart
    assert [r["train/lr"] for r in rows] == pytest.approx([lr, cosine(lr, floor, 2, 4), floor], rel=1e-12)
    assert rows[-1]["train/lr"] == pytest.approx(floor, rel=1e-12)
    assert [r["train/critic_lr"] for r in rows] == pytest.approx(
        [cosine(critic_lr, floor, s, 6) for s in (2, 4, 6)], rel=1e-12)


def test_the_critic_warms_up_as_the_policy_when_its_keys_are_unset(workdir, tiny_policy_dir, tmp_path):
    """warmup_steps 3 and no critic_warmup_ratio: both models warm up over 3 optimizer steps, (s + 1) / 3."""
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", max_steps=2, warmup_steps=3,
                               learning_rate=2e-3, critic_learning_rate=1e-2, weight_decay=0.0))
    assert trainer.critic_learner.optimizer._weight_decay == 0.0  # critic_weight_decay unset: weight_decay's
    trainer.train()
    rows = read_metrics(tmp_path / "out")
    # one optimizer step per step; the logged rate is after the step's scheduler step (s = 1, 2)
    assert [r["train/lr"] for r in rows] == pytest.approx([2e-3 * 2 / 3, 2e-3], rel=1e-12)
    assert [r["train/critic_lr"] for r in rows] == pytest.approx([1e-2 * 2 / 3, 1e-2], rel=1e-12)
