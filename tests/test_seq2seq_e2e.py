"""End-to-end: GRPO on the project's synthetic summarization data with a tiny random T5 and the rouge_l reward,
through configs/summarization_grpo.yaml and the real Trainer.

Needs the encoder-decoder wiring: `policy.load_policy` picks `Seq2SeqPolicy` when the model config says
is_encoder_decoder, and checkpoint.load_weights resumes encoder-decoders; without it the Trainer would load the T5
policy with AutoModelForCausalLM and fail.
"""
import json
import math

import numpy as np
import pytest

from paddle_grpo.config import load_config
from paddle_grpo.recipes.seq2seq import build_summarization_policy
from paddle_grpo.trainer import Trainer


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory, repo_root):
    path = str(tmp_path_factory.mktemp("summarization_t5"))
    # A brief warm start on the references: a random policy's samples all score ROUGE-L 0 (no group variance).
    build_summarization_policy(path, str(repo_root / "data" / "summarization_train.jsonl"), seed=0,
                                       sft_steps=40, sft_batch_size=8)
    return path


def make_cfg(repo_root, policy_dir, out, **overrides):
    values = dict(actor_model_name_or_path=policy_dir, output_dir=out, logging_dir=f"{out}/vdl", report_to="none",
                  train_datasets=repo_root / "data" / "summarization_train.jsonl",
                  eval_datasets=repo_root / "data" / "summarization_eval.jsonl", max_steps=3, global_batch_size=4,
                  rollout_n=4, max_dec_len=12, per_device_train_batch_size=8, per_device_logprob_batch_size=16,
                  per_device_eval_batch_size=20, learning_rate=1e-3, eval_steps=3, save_steps=2, disable_tqdm=True)
    values.update(overrides)
    args = [f"--{k}={v}" for k, v in values.items()]
    return load_config(repo_root / "configs" / "summarization_grpo.yaml", args, device="cpu", warn=False)


def params(model):
    return {n: p.numpy().copy() for n, p in model.named_parameters()}


def read_metrics(out):
    with open(out / "metrics.jsonl") as f:
        return {r["step"]: r for r in map(json.loads, f)}


@pytest.mark.e2e
def test_grpo_trains_a_t5_summarizer_and_resumes(repo_root, policy_dir, tmp_path):
    from paddlenlp.transformers import AutoModelForConditionalGeneration

    trainer = Trainer(make_cfg(repo_root, policy_dir, tmp_path / "full"))
    assert type(trainer.policy.model).__name__ == "T5ForConditionalGeneration" and trainer.reference is not None
    before, ref_before = params(trainer.policy.model), params(trainer.reference.model)
    trainer.train()
    metrics = read_metrics(tmp_path / "full")
    assert sorted(metrics) == [0, 1, 2, 3]  # step 0: evaluation before training
    for step in (1, 2, 3):
        m = metrics[step]
        assert "train/reward/rouge_l" not in m  # a single reward function's score is train/reward itself
        for key in ("train/reward", "train/policy_loss", "train/kl", "train/kl_loss",
                    "train/entropy", "train/grad_norm", "response_length/mean"):
            assert math.isfinite(m[key]), (step, key, m[key])
        assert 0.0 <= m["train/reward"] <= 1.0 and m["response_length/max"] <= 12
    # policy == reference before the first update: the two passes differ only by rounding (batch shapes), whose mean
    # over the tokens (random signs, ~sqrt(n) u each of log-probs ~5) is far below 1e-5
    assert metrics[1]["train/kl"] == pytest.approx(0.0, abs=1e-5)
    assert metrics[3]["train/kl"] > 0
    assert 0.0 <= metrics[3]["eval/reward"] <= 1.0 and metrics[3]["eval/samples"] == 40
    after = params(trainer.policy.model)
    assert any(not np.array_equal(before[k], after[k]) for k in before)
    assert all(np.array_equal(ref_before[k], v) for k, v in params(trainer.reference.model).items())

    # The checkpoint is a plain encoder-decoder directory holding the trained weights.
    loaded = AutoModelForConditionalGeneration.from_pretrained(str(tmp_path / "full" / "checkpoint-3"))
    assert all(np.array_equal(after[k], v) for k, v in params(loaded).items())

    # Resuming from step 2 reproduces step 3 exactly (counter-based sampling, restored optimizer and sampler).
    resumed = Trainer(make_cfg(repo_root, policy_dir, tmp_path / "resumed",
                               resume_from_checkpoint=tmp_path / "full" / "checkpoint-2"))
    assert resumed.step == 2
    resumed.train()
    again = read_metrics(tmp_path / "resumed")[3]
    for key, value in metrics[3].items():
        if not key.startswith("perf/"):
            assert again[key] == value, key
    assert all(np.array_equal(after[k], v) for k, v in params(resumed.policy.model).items())
