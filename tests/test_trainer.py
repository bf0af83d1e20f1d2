"""End-to-end: the trainer with a tiny random Qwen2, real files, in-process rewards and a real reward server.

Every test runs a few steps of the real loop (rollout, rewards, log-probs, advantages, AdamW updates) and asserts on
values: metrics finite and consistent, parameters changed (or not), optimizer-step counts, checkpoints identical.
"""
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import paddle
import pytest
from numerics import assert_adam_close, f32_sum_tol

from paddle_grpo import step
from paddle_grpo.config import config_from_dict
from paddle_grpo.rewards.client import RewardServerError
from paddle_grpo.trainer import Trainer, TrainingError
from resume_helpers import full_and_resumed, params, read_metrics

NAMES = ["Ann", "Bob", "Cid", "Dan", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jon", "Kim", "Lea"]

# A reward with variance under a random policy: 1 for a completion mentioning the prompt's name, plus a small
# length term; "easy" prompts get a constant reward (zero variance: dynamic sampling must drop their groups).
REWARD_FILE = '''
def name_reward(prompts, completions, tgt=None, **kwargs):
    out = []
    for p, c in zip(prompts, completions):
        if "easy" in p:
            out.append(1.0)
        else:
            out.append(float(tgt[len(out)].split()[1] in c) + 0.01 * len(c))
    return out
'''


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("trainer")
    rows = [{"src": [f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n<think>"],
             "tgt": [f"(1) {n} is a knight"]} for n in NAMES]
    with open(d / "train.jsonl", "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows) + "\n")
    with open(d / "eval.jsonl", "w") as f:
        f.write("\n".join(json.dumps(r) for r in rows[:4]) + "\n")
    easy = [{"src": f"easy question {i}", "tgt": "(1) Ann is a knight"} for i in range(6)]
    with open(d / "mixed.jsonl", "w") as f:
        f.write("\n".join(json.dumps(r) for r in easy + rows[:6]) + "\n")
    (d / "rewards.py").write_text(REWARD_FILE)
    return d


def make_cfg(workdir, tiny_policy_dir, out, **overrides):
    values = dict(actor_model_name_or_path=tiny_policy_dir, use_rm_server=False,
                  reward_funcs=f"{workdir / 'rewards.py'}:name_reward", train_datasets=str(workdir / "train.jsonl"),
                  output_dir=str(out), logging_dir=str(out / "vdl"), max_prompt_len=32, max_dec_len=8,
                  min_dec_len=1, max_length=40, global_batch_size=4, rollout_n=4, per_device_train_batch_size=8,
                  per_device_logprob_batch_size=16, learning_rate=2e-3, max_steps=2, kl_coeff=0.0,
                  save_strategy="no", disable_tqdm=True, seed=7, temperature=1.0)
    values.update(overrides)
    return config_from_dict(values)


EXPECTED_TRAIN_METRICS = {
    "train/reward", "train/reward_std", "train/frac_reward_zero_std", "train/advantage_mean",
    "train/advantage_std", "train/policy_loss", "train/entropy", "train/clip_frac_low", "train/clip_frac_high",
    "train/clip_frac_dual", "train/approx_kl_old", "train/grad_norm", "train/lr", "response_length/mean",
    "response_length/max", "response_length/min", "response_length/clip_ratio", "perf/step_s", "perf/rollout_s",
    "perf/reward_s", "perf/logprob_s", "perf/update_s", "perf/completion_tokens_per_s",
}


@pytest.mark.parametrize("algorithm, extra", [
    ("grpo", {}),
    ("grpo", {"kl_loss_coeff": 0.05, "kl_coeff": 0.01, "use_kl_in_reward": True, "norm_adv_by_std": False}),
    ("reinforce_plus_plus", {"kl_coeff": 0.01}),
    ("reinforce_plus_plus_baseline", {"kl_coeff": 0.01, "kl_loss_coeff": 0.01}),
    ("rloo", {"importance_sampling_level": "sequence", "loss_agg_mode": "seq-mean-token-mean"}),
])
def test_each_estimator_trains_with_finite_metrics(workdir, tiny_policy_dir, tmp_path, algorithm, extra):
    cfg = make_cfg(workdir, tiny_policy_dir, tmp_path / "out", rl_algorithm=algorithm, **extra)
    trainer = Trainer(cfg)
    before = params(trainer.policy.model)
    trainer.train()
    after = params(trainer.policy.model)
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    rows = read_metrics(cfg.output_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert EXPECTED_TRAIN_METRICS <= set(row), EXPECTED_TRAIN_METRICS - set(row)
        for key, value in row.items():
            assert isinstance(value, (int, float)) and math.isfinite(value), (key, value)
        assert row["response_length/min"] >= 1 and row["response_length/max"] <= 8
        assert 0 <= row["response_length/clip_ratio"] <= 1
        assert row["train/lr"] == pytest.approx(2e-3)  # a float64 schedule value: approx's default rel 1e-6
    if cfg.needs_reference_model:
        assert trainer.reference is not None and "train/kl" in rows[0]
        assert rows[0]["train/kl"] >= 0
    if cfg.kl_loss_coeff > 0:
        assert "train/kl_loss" in rows[0]


def test_no_reference_model_without_kl(workdir, tiny_policy_dir, tmp_path):
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", kl_coeff=0.0, kl_loss_coeff=0.0))
    assert trainer.reference is None
    trainer.train()
    assert "train/kl" not in read_metrics(trainer.cfg.output_dir)[0]
    assert Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "o2", kl_loss_coeff=0.1)).reference is not None


@pytest.mark.parametrize("update_iters, mini", [(2, -1), (1, 2), (2, 2)])
def test_update_iters_and_mini_batches_multiply_optimizer_steps(workdir, tiny_policy_dir, tmp_path, update_iters,
                                                               mini):
    cfg = make_cfg(workdir, tiny_policy_dir, tmp_path / "out", update_iters=update_iters,
                   global_mini_batch_size=mini)
    trainer = Trainer(cfg)
    trainer.train()
    per_step = (4 // (4 if mini == -1 else mini)) * update_iters
    assert trainer.learner.state.optimizer_steps == 2 * per_step
    assert [r["train/optimizer_steps"] for r in read_metrics(cfg.output_dir)] == [per_step, 2 * per_step]
    # Off-policy passes recompute the old log-probs; the second pass sees a ratio away from 1.
    if per_step > 1:
        assert read_metrics(cfg.output_dir)[0]["train/approx_kl_old"] != 0.0


@pytest.mark.numerics
def test_micro_batch_size_does_not_change_the_update(workdir, tiny_policy_dir, tmp_path):
    """token-mean with global denominators: 1 micro-batch of 16 or 4 of 4 give the same parameters."""
    results = []
    for mb in (16, 4):
        trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / f"mb{mb}", per_device_train_batch_size=mb,
                                   max_steps=1, max_grad_norm=0.0))
        trainer.train()
        results.append(params(trainer.policy.model))
    # Adam's first step is lr * g / (|g| + eps): for elements whose gradient is near zero it amplifies the float
    # rounding of summing 4 shares instead of 1 (numerics.assert_adam_close). The tiny policy (2 layers, hidden 64,
    # intermediate 128) on 16 rows of at most 40 positions: ~42 chained sums, the longest over 640 positions.
    initial = {k: v.numpy() for k, v in paddle.load(os.path.join(tiny_policy_dir, "model_state.pdparams")).items()}
    assert_adam_close(results[0], results[1], initial, lr=2e-3, steps=1, rel=f32_sum_tol(640, 1.0, depth=42))


def test_learning_rate_zero_leaves_parameters_unchanged(workdir, tiny_policy_dir, tmp_path):
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", learning_rate=0.0, weight_decay=0.0))
    before = params(trainer.policy.model)
    trainer.train()
    after = params(trainer.policy.model)
    assert all(np.array_equal(before[k], after[k]) for k in before)


def test_dynamic_sampling_drops_zero_variance_groups(workdir, tiny_policy_dir, tmp_path):
    cfg = make_cfg(workdir, tiny_policy_dir, tmp_path / "out", train_datasets=str(workdir / "mixed.jsonl"),
                   dynamic_sampling=True, global_gen_batch_size=4, max_gen_batches=4, dataloader_shuffle=True,
                   max_steps=2)
    trainer = Trainer(cfg)
    trainer.train()
    rows = read_metrics(cfg.output_dir)
    assert sum(r["train/dynamic_sampling_dropped_groups"] for r in rows) > 0
    # Every group that was kept has reward variance: "easy" prompts (constant reward) never reach the update.
    assert all(r["train/frac_reward_zero_std"] == 0.0 for r in rows)


def test_non_finite_updates_are_skipped_then_stop_the_run(workdir, tiny_policy_dir, tmp_path):
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", max_consecutive_nonfinite=2))
    cfg = trainer.cfg
    batch, _ = step.collect(trainer.par, trainer.policy, trainer.encode, trainer.rewarder, trainer.sampler,
                            trainer.train_records, cfg, trainer.geometry.prompts_per_rank, 0)
    before = params(trainer.policy.model)
    poisoned = paddle.full(batch.completion_ids.shape, float("nan"))
    inputs = step.UpdateInputs(batch, poisoned, batch.completion_mask, None, None)
    metrics = step.update(trainer.par, trainer.learner, inputs, cfg, trainer.geometry, 0).as_dict()
    assert metrics["train/nonfinite_updates"] == 1 and trainer.learner.state.nonfinite_in_a_row == 1
    assert math.isnan(metrics["train/grad_norm"]) and math.isnan(metrics["train/policy_loss"])
    assert all(np.array_equal(before[k], v) for k, v in params(trainer.policy.model).items())
    with pytest.raises(TrainingError, match="2 consecutive updates had a non-finite loss or gradient"):
        step.update(trainer.par, trainer.learner, inputs, cfg, trainer.geometry, 1)


def test_resume_reproduces_the_uninterrupted_run(workdir, tiny_policy_dir, tmp_path):
    common = dict(max_steps=4, lr_scheduler_type="cosine", warmup_steps=1, normalize_reward=True,
                  kl_coeff=0.01, rl_algorithm="reinforce_plus_plus", dataloader_shuffle=True, save_strategy="steps",
                  save_steps=2)
    full, resumed = full_and_resumed(lambda out, **kw: make_cfg(workdir, tiny_policy_dir, out, **kw), tmp_path, 2,
                                     **common)
    a = {r["step"]: r for r in read_metrics(tmp_path / "full")}
    b = {r["step"]: r for r in read_metrics(tmp_path / "split")}
    for n in (3, 4):
        for key in a[n]:
            if not key.startswith("perf/"):
                assert a[n][key] == b[n][key], (n, key)
    pa, pb = params(full.policy.model), params(resumed.policy.model)
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
    assert os.path.isdir(tmp_path / "split" / "checkpoint-4") and os.path.isdir(tmp_path / "full" / "checkpoint-2")


def test_checkpoint_loads_with_automodel_and_partial_saves_are_ignored(workdir, tiny_policy_dir, tmp_path):
    from paddlenlp.transformers import AutoModelForCausalLM, AutoTokenizer

    from paddle_grpo.run.checkpoint import latest_checkpoint

    cfg = make_cfg(workdir, tiny_policy_dir, tmp_path / "out", save_strategy="steps", save_steps=1, max_steps=2,
                   save_total_limit=1)
    trainer = Trainer(cfg)
    trainer.train()
    os.makedirs(tmp_path / "out" / ".tmp-checkpoint-3")  # what a crash mid-save leaves behind
    path = latest_checkpoint(cfg.output_dir)
    assert path.endswith("checkpoint-2") and sorted(os.listdir(cfg.output_dir)).count("checkpoint-1") == 0
    model = AutoModelForCausalLM.from_pretrained(path)
    AutoTokenizer.from_pretrained(path)
    trained = params(trainer.policy.model)
    for n, p in model.named_parameters():
        np.testing.assert_array_equal(p.numpy(), trained[n])


def test_eval_reports_accuracy_against_the_declared_maximum(workdir, tiny_policy_dir, tmp_path):
    cfg = make_cfg(workdir, tiny_policy_dir, tmp_path / "out", reward_funcs="kk", do_eval=True,
                   eval_datasets=str(workdir / "eval.jsonl"), eval_steps=1, max_steps=1)
    trainer = Trainer(cfg)
    trainer.train()
    rows = read_metrics(cfg.output_dir)
    assert [r["step"] for r in rows] == [0, 1]
    # A random policy never writes a well-formed K&K answer: every sample scores -3, none reaches 3.
    assert rows[0]["eval/reward"] == -3.0 and rows[0]["eval/accuracy"] == 0.0 and rows[0]["eval/samples"] == 4
    cfg2 = make_cfg(workdir, tiny_policy_dir, tmp_path / "out2", reward_funcs="kk", do_eval=True,
                    eval_datasets=str(workdir / "eval.jsonl"), eval_max_reward=-3.0, max_steps=1)
    t2 = Trainer(cfg2)
    assert t2.evaluate()["eval/accuracy"] == 1.0
    samples = [json.loads(line) for line in open(tmp_path / "out" / "rollouts.jsonl")]
    assert {s["kind"] for s in samples} == {"eval", "rollout"}
    srcs = {r["src"] for r in trainer.train_records}
    for s in samples:
        assert s["prompt"] in srcs and isinstance(s["completion"], str) and s["scores"] == {"kk": s["reward"]}
    # one reward function: its score is train/reward, not logged a second time as train/reward/kk
    assert not [k for r in rows for k in r if k.startswith("train/reward/")]


def test_training_against_a_real_reward_server_and_failing_loudly(workdir, tiny_policy_dir, tmp_path):
    from paddle_grpo.rewards import get_reward_fn
    from reward_server import create_app
    from reward_server.serving import BackgroundServer

    fn = get_reward_fn(f"{workdir / 'rewards.py'}:name_reward")
    server = BackgroundServer(create_app([fn]), host="127.0.0.1", port=0).start()
    try:
        cfg = make_cfg(workdir, tiny_policy_dir, tmp_path / "out", use_rm_server=True, reward_funcs="",
                       reward_server=server.url, reward_server_max_retries=1, max_steps=3)
        trainer = Trainer(cfg)
        metrics = trainer.train_step()
        assert math.isfinite(metrics["train/reward"]) and metrics["train/reward_std"] > 0
    finally:
        server.stop()
    trainer.rewarder.backoff = 0.01
    with pytest.raises(RewardServerError, match=server.url.replace(".", r"\.")):
        trainer.train_step()


@pytest.mark.e2e
def test_run_rl_ctrl_c_saves_a_checkpoint_and_exits_130(workdir, tiny_policy_dir, tmp_path, repo_root):
    out = tmp_path / "out"
    cmd = [sys.executable, str(repo_root / "run_rl.py"), "--actor_model_name_or_path", tiny_policy_dir,
           "--use_rm_server", "false", "--reward_funcs", f"{workdir / 'rewards.py'}:name_reward",
           "--train_datasets", str(workdir / "train.jsonl"), "--output_dir", str(out), "--max_prompt_len", "32",
           "--max_dec_len", "8", "--max_length", "40", "--min_dec_len", "1", "--global_batch_size", "4",
           "--rollout_n", "4", "--per_device_train_batch_size", "8", "--max_steps", "100000",
           "--save_steps", "100000", "--disable_tqdm", "true", "--report_to", "none", "--kl_coeff", "0"]
    # SIGINT at its default in the child: a shell's background job (`cmd &`, as CI may start pytest) ignores it, the
    # child inherits the ignore, and Python then installs no KeyboardInterrupt handler at all.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = out / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    output = proc.communicate(timeout=120)[0].decode()
    assert proc.returncode == 130, output[-2000:]
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    saved = int(re.search(r"interrupted at step (\d+)", output).group(1))
    state = json.loads((out / f"checkpoint-{saved}" / "trainer_state.json").read_text())
    assert state["step"] == saved
    # The signal lands either between steps (the checkpoint is the last logged step) or inside an update, which is
    # let finish: then the checkpoint is the step after the last logged one and carries that step's unwritten metrics.
    if saved == steps[-1] + 1:
        assert "train/reward" in state["unlogged"]["metrics"], state.get("unlogged")
    else:
        assert saved == steps[-1], (saved, steps)


def test_sync_ref_model_mixes_the_policy_into_the_reference(workdir, tiny_policy_dir, tmp_path):
    cfg = make_cfg(workdir, tiny_policy_dir, tmp_path / "out", kl_loss_coeff=0.01, sync_ref_model=True,
                   ref_model_sync_steps=2, ref_model_mixup_alpha=0.25, max_steps=2)
    trainer = Trainer(cfg)
    initial = params(trainer.reference.model)
    trainer.train_step()
    assert all(np.array_equal(initial[k], v) for k, v in params(trainer.reference.model).items())  # not yet (step 1)
    trainer.train_step()
    policy, ref = params(trainer.policy.model), params(trainer.reference.model)
    for k in ref:
        # elementwise, 3 roundings of weights <= ~0.1: 3 u 0.1 = 1.8e-8
        np.testing.assert_allclose(ref[k], 0.25 * policy[k] + 0.75 * initial[k], rtol=1e-6, atol=1e-7)


@pytest.mark.numerics
def test_gradient_clipping_matches_paddles_global_norm_clip(workdir, tiny_policy_dir, tmp_path):
    trainer = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out", max_grad_norm=0.5))
    rng = np.random.default_rng(0)
    params_ = [p for p in trainer.policy.model.parameters() if not p.stop_gradient]
    grads = [paddle.to_tensor(rng.normal(size=p.shape).astype("float32") * 0.01) for p in params_]
    expected = paddle.nn.ClipGradByGlobalNorm(0.5)(list(zip(params_, grads)))
    for p, g in zip(params_, grads):
        p.grad = g.clone()
    norm = trainer.par.global_grad_norm(params_)
    # sums of squares (positive terms: relative error <= n u) per tensor of at most 320 x 64 elements, in other
    # orders (numpy_kernels / paddle against paddle's sum), then added in float64
    norm_rtol = f32_sum_tol(320 * 64, 1.0)  # 2.4e-3
    np.testing.assert_allclose(norm, np.sqrt(sum(float((g * g).sum()) for g in grads)), rtol=norm_rtol)
    assert norm > 0.5
    step.clip_gradients(params_, norm, trainer.cfg.max_grad_norm)
    for p, (_, g) in zip(params_, expected):
        # g times a clip coefficient max_norm / norm: the norms' relative difference (above) plus 2 roundings
        np.testing.assert_allclose(p.grad.numpy(), g.numpy(), rtol=norm_rtol, atol=1e-9)


def test_visualdl_receives_every_scalar_of_metrics_jsonl_and_the_samples(workdir, tiny_policy_dir, tmp_path):
    import glob

    from visualdl import LogReader

    from paddle_grpo.logging import format_sample

    # two reward functions: each gets its own scalar beside train/reward
    cfg = make_cfg(workdir, tiny_policy_dir, tmp_path / "out", report_to="visualdl", run_name="run1",
                   reward_funcs="kk,tag_format")
    Trainer(cfg).train()
    files = glob.glob(str(tmp_path / "out" / "vdl" / "run1" / "vdlrecords*"))
    assert len(files) == 1
    reader = LogReader(file_path=files[0])
    tags = reader.get_tags()
    rows = read_metrics(cfg.output_dir)
    assert set(tags["scalar"]) == {k for r in rows for k in r if k != "step"}
    assert all({"train/reward/kk", "train/reward/tag_format"} <= set(r) for r in rows)
    for key in ("train/reward", "train/reward/kk", "train/policy_loss", "perf/step_s"):
        logged = [(d.id, d.value) for d in reader.get_data("scalar", key)]
        assert logged == [(r["step"], pytest.approx(r[key], rel=1e-6)) for r in rows]  # float32 storage: u = 6e-8
    # one text card per sample, holding at each step the row rollouts.jsonl has for it
    samples = [json.loads(line) for line in open(tmp_path / "out" / "rollouts.jsonl", encoding="utf-8")]
    assert [(s["step"], set(s["scores"])) for s in samples] == [(step, {"kk", "tag_format"}) for step in (1, 2)
                                                                 for _ in range(4)]
    assert sorted(tags["text"]) == [f"samples/rollout/{i}" for i in range(4)]
    for i in range(4):
        shown = [(d.id, d.text.encoded_text_string) for d in reader.get_data("text", f"samples/rollout/{i}")]
        assert shown == [(s["step"], format_sample(s)) for s in samples[i::4]]
