"""Reward models: a tiny random one-label Qwen2ForSequenceClassification built locally, scored in process
(reference: tests/reward_model_helpers.py)."""
import json
import subprocess
import sys

import numpy as np
import paddle
import pytest

from paddle_grpo.rewards import RewardModel, RewardSet, get_reward_fn
from paddle_grpo.rewards.client import InProcessRewarder, make_rewarder
from reward_model_helpers import COMPLETIONS, PROMPTS, REWARD_MODEL_TOL, reference_scores

# Batched, padded scoring against one text at a time: other GEMM shapes, so other kernels (REWARD_MODEL_TOL,
# absolute; a weighted sum of scores within its weights' sum times that).
TOL = dict(rtol=0, atol=REWARD_MODEL_TOL)

@pytest.fixture(scope="module")
def expected(tiny_reward_model_dir):
    return reference_scores(tiny_reward_model_dir, PROMPTS, COMPLETIONS)


@pytest.mark.numerics
@pytest.mark.parametrize("batch_size", [1, 3, len(PROMPTS)])
def test_scores_equal_a_direct_forward_pass_at_the_last_token(tiny_reward_model_dir, expected, batch_size):
    fn = RewardModel(tiny_reward_model_dir, batch_size=batch_size).load()
    scores = fn(PROMPTS, COMPLETIONS, tgt=["47"] * 4, completion_ids=[[1]] * 4)  # extra columns are ignored
    assert all(type(s) is float for s in scores) and scores.errors == [None] * 4
    np.testing.assert_allclose(scores, expected, **TOL)
    assert len(set(np.round(expected, 4))) == 4  # the texts really get different scores
    assert fn.max_score is None and fn.__name__ == "reward_model"


def test_a_text_holding_the_pad_token_is_pooled_at_its_last_token(tiny_reward_model_dir, expected):
    # The model's own unpadded forward pools before the first pad token: for this text not the last token.
    from paddlenlp.transformers import AutoTokenizer, Qwen2ForSequenceClassification

    model = Qwen2ForSequenceClassification.from_pretrained(tiny_reward_model_dir)
    model.eval()
    ids = AutoTokenizer.from_pretrained(tiny_reward_model_dir)(PROMPTS[2] + COMPLETIONS[2])["input_ids"]
    with paddle.no_grad():
        own = float(model(paddle.to_tensor([ids]), return_dict=True).logits[0, 0])
    assert abs(own - expected[2]) > 1e-4
    assert RewardModel(tiny_reward_model_dir).load()([PROMPTS[2]], [COMPLETIONS[2]])[0] == \
        pytest.approx(expected[2], abs=REWARD_MODEL_TOL)


def test_the_spec_name_loads_it_and_combines_with_a_rule_reward_by_weight(tiny_reward_model_dir, expected):
    fn = get_reward_fn(f"reward_model:{tiny_reward_model_dir}")
    assert isinstance(fn, RewardModel) and fn.model is not None  # loaded at resolution, not on the first batch
    result = RewardSet(["gsm8k", f"reward_model:{tiny_reward_model_dir}"], weights=[1.0, 0.5])(
        PROMPTS, COMPLETIONS, tgt=["47", "1", "1", "9"])
    assert list(result.scores_by_function) == ["gsm8k", "reward_model"]
    gsm8k = [1.0, 0.0, 0.0, 1.0]
    assert result.scores_by_function["gsm8k"] == gsm8k
    np.testing.assert_allclose(result.scores, [g + 0.5 * e for g, e in zip(gsm8k, expected)], **TOL)


@pytest.mark.numerics
def test_make_rewarder_adds_the_model_after_the_reward_funcs(tiny_reward_model_dir, expected):
    rewarder = make_rewarder(False, reward_funcs="gsm8k", reward_weights=[2.0, -1.0],
                             reward_model_name_or_path=tiny_reward_model_dir, reward_batch_size=2)
    assert isinstance(rewarder, InProcessRewarder)
    assert rewarder.reward_set.names == ["gsm8k", "reward_model"] and rewarder.reward_set.fns[1].batch_size == 2
    assert rewarder.max_score is None  # the model's maximum is unknown
    scores = rewarder.score(PROMPTS, ["47", "1", "1", "9"], COMPLETIONS)
    np.testing.assert_allclose(scores, [2.0 * g - e for g, e in zip([1, 0, 0, 1], expected)], **TOL)  # weight 1
    alone = make_rewarder(False, reward_funcs="", reward_model_name_or_path=tiny_reward_model_dir)
    np.testing.assert_allclose(alone.score(PROMPTS, [""] * 4, COMPLETIONS), expected, **TOL)


def test_with_the_reward_server_the_model_is_an_error_naming_both_keys(tiny_reward_model_dir):
    with pytest.raises(ValueError, match="reward_model_name_or_path .* use_rm_server is true"):
        make_rewarder(True, "http://127.0.0.1:8731", reward_model_name_or_path=tiny_reward_model_dir)
    with pytest.raises(ValueError, match="reward_funcs .* or reward_model_name_or_path"):
        make_rewarder(False, reward_funcs="")


def test_non_finite_output_and_too_long_texts_fail_their_samples_with_a_reason(tiny_reward_model_dir, expected):
    fn = RewardModel(tiny_reward_model_dir, batch_size=2).load()
    fn.max_positions = len(fn.tokenizer(PROMPTS[0] + COMPLETIONS[0])["input_ids"]) - 1  # only sample 0 too long
    scores = fn(PROMPTS, COMPLETIONS)
    assert scores[0] is None and "more than the reward model's max_position_embeddings" in scores.errors[0]
    np.testing.assert_allclose(scores[1:], expected[1:], **TOL)
    weight = fn.model.score.weight
    weight.set_value(paddle.full(weight.shape, float("nan"), dtype=weight.dtype))
    result = RewardSet([fn])(PROMPTS[1:], COMPLETIONS[1:])
    assert result.scores == [None] * 3
    assert result.errors == ["reward_model: the reward model returned nan"] * 3


def test_bad_models_are_refused_at_load_naming_the_model(tmp_path, tiny_reward_model_dir):
    with pytest.raises(FileNotFoundError, match=f"reward model '{tmp_path}/nope'.*does not exist"):
        get_reward_fn(f"reward_model:{tmp_path}/nope")
    from paddlenlp.transformers import AutoTokenizer, Qwen2Config, Qwen2ForSequenceClassification

    config = Qwen2Config.from_pretrained(tiny_reward_model_dir)
    config.num_labels = 2
    Qwen2ForSequenceClassification(config).save_pretrained(str(tmp_path / "two"))
    AutoTokenizer.from_pretrained(tiny_reward_model_dir).save_pretrained(str(tmp_path / "two"))
    with pytest.raises(ValueError, match="one output \\(num_labels 1\\), this one has 2"):
        RewardModel(str(tmp_path / "two")).load()
    with pytest.raises(ValueError, match="batch size must be >= 1"):
        RewardModel(tiny_reward_model_dir, batch_size=0)


def test_importing_the_rewards_and_the_server_does_not_import_paddle():
    code = ("import sys, paddle_grpo.rewards, paddle_grpo.rewards.reward_model, reward_server; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('paddle', 'paddlenlp'))))")
    done = subprocess.run([sys.executable, "-c", "import json; " + code], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_a_trainer_step_scores_with_the_reward_model(tmp_path, tiny_policy_dir, tiny_reward_model_dir):
    import math

    from paddle_grpo.config import config_from_dict
    from paddle_grpo.trainer import Trainer

    rows = [{"src": f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n", "tgt": n}
            for n in ["Ann", "Bob", "Cid", "Dan"]]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    cfg = config_from_dict(dict(
        actor_model_name_or_path=tiny_policy_dir, use_rm_server=False, reward_funcs="",
        reward_model_name_or_path=tiny_reward_model_dir, per_device_reward_batch_size=3,
        train_datasets=str(tmp_path / "train.jsonl"), output_dir=str(out), logging_dir=str(out / "vdl"),
        max_prompt_len=32, max_dec_len=8, min_dec_len=1, max_length=40, global_batch_size=4, rollout_n=4,
        per_device_train_batch_size=8, per_device_logprob_batch_size=16, learning_rate=2e-3, max_steps=1,
        kl_coeff=0.0, save_strategy="no", disable_tqdm=True, seed=7))
    trainer = Trainer(cfg)
    reward_set = trainer.rewarder.reward_set
    model = reward_set.fns[0]
    assert reward_set.names == ["reward_model"] and model.batch_size == 3
    seen = []

    def recording(prompts, completions, **kwargs):  # what the trainer asked the model to score
        seen.append((list(prompts), list(completions)))
        return model(prompts, completions, **kwargs)

    reward_set.fns[0] = recording
    trainer.train()
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 1 and all(math.isfinite(v) for v in metrics[0].values())
    (prompts, completions), = seen
    assert len(completions) == 16 and set(prompts) == {r["src"] for r in rows}
    expected = reference_scores(tiny_reward_model_dir, prompts, completions)
    assert metrics[0]["train/reward"] == pytest.approx(float(np.mean(expected)), abs=REWARD_MODEL_TOL)
    assert metrics[0]["train/reward_none_frac"] == 0.0


@pytest.mark.e2e
def test_two_data_parallel_ranks_each_score_their_rows_like_one_process(tmp_path, tiny_policy_dir,
                                                                       tiny_reward_model_dir, repo_root):
    """Every rank loads the reward model and scores its own rows; the step's rewards equal a single process's."""
    from launch_helpers import launch, run, write_config

    cfg = write_config(tmp_path, tiny_policy_dir, "grpo")
    overrides = ["--reward_funcs", "length_similarity", "--reward_model_name_or_path", tiny_reward_model_dir,
                 "--reward_weights", "1,2", "--per_device_reward_batch_size", "3", "--max_steps", "1"]
    run_rl = str(repo_root / "run_rl.py")
    run([sys.executable, run_rl, str(cfg), "--output_dir", str(tmp_path / "one"), *overrides], tmp_path)
    run(launch(run_rl, cfg, "--output_dir", tmp_path / "two", *overrides, log_dir=tmp_path / "log"), tmp_path)
    one, two = ([json.loads(line) for line in open(tmp_path / d / "metrics.jsonl")] for d in ("one", "two"))
    for key in ("train/reward", "train/reward_std", "train/reward/reward_model", "train/reward/length_similarity"):
        # reward weights 1, 2: the model's part of a reward is within 2 REWARD_MODEL_TOL, its std too
        assert two[0][key] == pytest.approx(one[0][key], abs=2 * REWARD_MODEL_TOL), key
    assert one[0]["train/reward_std"] > 0 and one[0]["train/reward_none_frac"] == 0.0
    assert "Traceback" not in (tmp_path / "log" / "workerlog.1").read_text()
