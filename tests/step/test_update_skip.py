"""A mini-batch with nothing to learn (issue 41 item 4.7): every group's rewards agree, so every advantage is 0, and
no KL loss, entropy bonus or positive-example loss: the update skips the model's forward and backward and takes the
optimizer step with zero gradients. The reference is the same run with the full pass forced
(`nothing_to_learn` patched to False): parameters, AdamW's state, the schedule and the counters must be equal BIT FOR
BIT (exact zeros in both; AdamW with weight decay and nonzero moments still moves the weights, which the test checks
so that skipping the optimizer step too would fail), and the update's time must drop."""
import json
import time

import numpy as np
import paddle
import pytest

from paddle_grpo import step
from paddle_grpo.config import config_from_dict
from paddle_grpo.step import policy_update
from paddle_grpo.trainer import Trainer
from resume_helpers import full_and_resumed, params, read_metrics

NAMES = ["Ann", "Bob", "Cid", "Dan", "Eve", "Fay"]
# "easy" prompts get a constant reward (their groups agree); the others vary with the completion.
REWARD_FILE = '''
def reward(prompts, completions, **kwargs):
    return [1.0 if "easy" in p else (sum(map(ord, c)) % 97) / 97 for p, c in zip(prompts, completions)]
'''
FORWARD_STATISTICS = ("train/entropy", "train/clip_frac_low", "train/clip_frac_high", "train/clip_frac_dual",
                      "train/approx_kl_old")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("skip")
    easy = [{"src": f"easy question {i}", "tgt": "x"} for i in range(4)]
    hard = [{"src": f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n", "tgt": "x"} for n in NAMES]
    (d / "easy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in easy))
    # alternating, not shuffled: with one prompt per mini-batch, every other mini-batch has nothing to learn
    mixed = [r for pair in zip(easy, hard) for r in pair]
    (d / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in mixed))
    (d / "rewards.py").write_text(REWARD_FILE)
    return d


def make_cfg(workdir, policy_dir, out, data="easy", **overrides):
    values = dict(actor_model_name_or_path=policy_dir, use_rm_server=False,
                  reward_funcs=f"{workdir / 'rewards.py'}:reward", train_datasets=str(workdir / f"{data}.jsonl"),
                  output_dir=str(out), logging_dir=str(out / "vdl"), max_prompt_len=32, max_dec_len=8,
                  min_dec_len=1, max_length=40, global_batch_size=2, rollout_n=4, per_device_train_batch_size=4,
                  per_device_logprob_batch_size=16, learning_rate=2e-3, max_steps=3, kl_coeff=0.0,
                  weight_decay=0.1, save_strategy="no", disable_tqdm=True, seed=7, temperature=1.0,
                  dataloader_shuffle=False)
    values.update(overrides)
    return config_from_dict(values)


def optimizer_state(trainer):
    """AdamW's accumulators in creation order, each as (its kind, e.g. 'w_0_moment1_0', value): the parameters'
    generated names (linear_40) differ between two trainers of one process."""
    return [(k.rsplit(".", 1)[-1], np.array(v.numpy()))
            for k, v in trainer.learner.optimizer.state_dict().items() if k != "LR_Scheduler"]


def assert_same_run(a, b):
    pa, pb = params(a.policy.model), params(b.policy.model)
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)  # bit for bit: exact zeros in both
    sa, sb = optimizer_state(a), optimizer_state(b)
    assert [k for k, _ in sa] == [k for k, _ in sb] and len(sa) > 0
    assert all(np.array_equal(x, y) for (_, x), (_, y) in zip(sa, sb))
    assert a.learner.optimizer.state_dict()["LR_Scheduler"] == b.learner.optimizer.state_dict()["LR_Scheduler"]
    assert a.learner.state == b.learner.state


def train(cfg, monkeypatch, skip):
    with monkeypatch.context() as m:
        if not skip:  # the reference: the full forward and backward on every mini-batch
            m.setattr(policy_update, "nothing_to_learn", lambda *a, **k: False)
        trainer = Trainer(cfg)
        trainer.train()
    return trainer


# LoRA: only the adapters are trained (the base has stop_gradient): they alone get zero gradients.
LORA = dict(lora=True, lora_rank=4, lora_alpha=8, target_modules=".*q_proj.*,.*v_proj.*")


@pytest.mark.parametrize("data, mini, skipped, extra", [
    ("easy", -1, [1.0, 1.0, 1.0], {}),     # every group agrees: the whole update is skipped
    ("mixed", 1, [0.5, 0.5, 0.5], {}),     # one prompt per mini-batch, easy and hard alternate: half are skipped
    ("mixed", 1, [0.5, 0.5, 0.5], LORA),
])
def test_a_skipped_update_equals_the_full_pass_bit_for_bit(workdir, tiny_policy_dir, tmp_path, monkeypatch, data,
                                                           mini, skipped, extra):
    cfg = lambda out: make_cfg(workdir, tiny_policy_dir, out, data=data, global_mini_batch_size=mini,  # noqa: E731
                               **extra)
    before = params(Trainer(cfg(tmp_path / "init")).policy.model)
    fast = train(cfg(tmp_path / "skip"), monkeypatch, skip=True)
    full = train(cfg(tmp_path / "full"), monkeypatch, skip=False)
    assert_same_run(fast, full)
    after = params(fast.policy.model)
    # weight decay (and, after a real step, Adam's moments) move the weights with zero gradients: the optimizer
    # step must be taken, not skipped
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    rows, reference = read_metrics(cfg(tmp_path / "skip").output_dir), read_metrics(cfg(tmp_path / "full").output_dir)
    assert [r["train/update_skipped"] for r in rows] == skipped
    assert all(r["train/update_skipped"] == 0.0 for r in reference)
    for row, ref in zip(rows, reference):
        for key in ("train/policy_loss", "train/grad_norm", "train/lr", "train/optimizer_steps"):
            assert row[key] == ref[key], key
        if data == "easy":  # no forward ran: its statistics are not logged
            assert row["train/grad_norm"] == 0.0 and row["train/frac_reward_zero_std"] == 1.0
            assert not set(FORWARD_STATISTICS) & set(row)
        else:
            assert set(FORWARD_STATISTICS) <= set(row)


def test_a_skipped_update_takes_a_fraction_of_the_time(workdir, tiny_policy_dir, tmp_path, monkeypatch):
    # The same zero-advantage batch updated 3 times each way on one trainer; the full pass runs the model forward
    # and backward on 8 rows (2 micro-batches of 4), the skipped one only an O(parameters) optimizer step. Medians against noise from
    # the other jobs on the machine.
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", max_steps=1))
    cfg = trainer.cfg
    batch, _ = step.collect(trainer.par, trainer.policy, trainer.encode, trainer.rewarder, trainer.sampler,
                            trainer.train_records, cfg, trainer.geometry.prompts_per_rank, 0)
    inputs = step.UpdateInputs(batch, paddle.zeros(batch.completion_ids.shape), batch.completion_mask, None, None)
    times = {}
    for skip in (True, False):
        with monkeypatch.context() as m:
            if not skip:
                m.setattr(policy_update, "nothing_to_learn", lambda *a, **k: False)
            spent = []
            for i in range(3):
                t0 = time.perf_counter()
                metrics = step.update(trainer.par, trainer.learner, inputs, cfg, trainer.geometry, i).as_dict()
                spent.append(time.perf_counter() - t0)
                assert metrics["train/update_skipped"] == float(skip)
        times[skip] = float(np.median(spent))
    assert times[True] < 0.5 * times[False], times


@pytest.mark.parametrize("extra", [
    {"kl_loss_coeff": 0.01},                                  # the KL to the reference has a gradient
    {"entropy_coeff": 0.01},                                  # so has the entropy bonus
    {"positive_example_lm_coeff": 0.1, "positive_example_min_reward": 1.0},  # VAPO's LM loss on correct answers
])
def test_a_term_with_a_gradient_is_never_skipped(workdir, tiny_policy_dir, tmp_path, extra):
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", max_steps=1, **extra))
    trainer.train()
    row = read_metrics(trainer.cfg.output_dir)[0]
    assert row["train/frac_reward_zero_std"] == 1.0  # every group agrees: the advantages are 0
    assert row["train/update_skipped"] == 0.0 and "train/entropy" in row


def test_a_user_policy_loss_is_not_skipped_unless_registered_advantage_weighted():
    from paddle_grpo.algorithms import policy_loss_spec, register_policy_loss, unregister_policy_loss

    assert all(policy_loss_spec(n).advantage_weighted for n in ("vanilla", "clip", "gspo"))
    register_policy_loss("test_with_a_bonus")(lambda *a: a)
    try:
        assert not policy_loss_spec("test_with_a_bonus").advantage_weighted
    finally:
        unregister_policy_loss("test_with_a_bonus")


def test_resume_of_a_run_with_skipped_updates_is_exact(workdir, tiny_policy_dir, tmp_path):
    common = dict(max_steps=4, lr_scheduler_type="cosine", warmup_steps=1, data="mixed", global_mini_batch_size=1,
                  save_strategy="steps", save_steps=2)
    full, resumed = full_and_resumed(lambda out, **kw: make_cfg(workdir, tiny_policy_dir, out, **kw), tmp_path, 2,
                                     **common)
    assert_same_run(full, resumed)
    assert [r["train/update_skipped"] for r in read_metrics(tmp_path / "split")][-2:] == [0.5, 0.5]
