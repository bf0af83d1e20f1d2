"""normalize_reward / normalize_advantage with rl_algorithm grpo (review defect 2): PaddleNLP's RL config sets both to
False for GRPO whatever the file says (paddlenlp/rl/utils/config_utils.py, TrainingArguments.__post_init__; its
REINFORCE++ keeps them), so a PaddleNLP GRPO config that sets them (32cae05c...grpo_argument.yaml sets both true)
must train here as there: neither applies, and one warning line per key says why. The other estimators keep both."""
import logging
import pathlib

import numpy as np
import pytest

from paddle_grpo import step
from paddle_grpo.config import config_from_dict, load_config

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

REPO = pathlib.Path(__file__).resolve().parent.parent
PADDLENLP_GRPO = REPO.parent / "shared" / "paddlenlp_configs" / "32cae05c_llm__config__qwen__grpo_argument.yaml"
BASE = dict(actor_model_name_or_path="unused", use_rm_server=False, reward_funcs="kk", train_datasets="unused",
            rollout_n=3, global_batch_size=2, max_dec_len=4, min_dec_len=1, max_prompt_len=16, max_length=20,
            kl_coeff=0.0, normalize_reward=True, normalize_advantage=True)


@pytest.mark.parametrize("algorithm, applies", [("grpo", False), ("reinforce_plus_plus", True),
                                                ("reinforce_plus_plus_baseline", True), ("rloo", True)])
def test_only_grpo_drops_both_normalizations(algorithm, applies):
    cfg = config_from_dict({**BASE, "rl_algorithm": algorithm})
    assert cfg.normalize_reward and cfg.normalize_advantage  # the file's values are kept (and written back)
    assert cfg.reward_normalization is applies and cfg.advantage_normalization is applies
    off = config_from_dict({**BASE, "rl_algorithm": algorithm, "normalize_reward": False,
                            "normalize_advantage": False})
    assert not off.reward_normalization and not off.advantage_normalization


def rows_and_rewards():
    """Two prompts x 3 samples; completions of 4, 2, 3 / 1, 4, 2 tokens."""
    lengths = np.array([4, 2, 3, 1, 4, 2])
    mask = (np.arange(4)[None, :] < lengths[:, None]).astype(np.int64)
    rewards = np.array([1.0, 0.0, 2.0, 3.0, 1.0, 1.0])
    rows = step.GlobalRows(rewards=rewards, valid=np.ones(6, dtype=bool), lengths=lengths,
                           truncated=np.zeros(6, dtype=bool), scores_by_function=[{"f": list(rewards)}], mask=mask,
                           old=None, ref=None, offset=0)
    return rows, rewards.astype(np.float32), mask


def test_grpo_advantages_are_not_whitened():
    rows, rewards, mask = rows_and_rewards()
    adv, _ = step.compute_advantages(rows, rewards, config_from_dict({**BASE, "rl_algorithm": "grpo"}))
    groups = rewards.astype(np.float64).reshape(2, 3)
    expected = ((groups - groups.mean(1, keepdims=True)) / (groups.std(1, ddof=1, keepdims=True) + 1e-6)).reshape(-1)
    # float32 maths on values of order 1: a few roundings of 2^-24 each
    np.testing.assert_allclose(adv, expected[:, None] * mask, rtol=0, atol=1e-6)


def test_rloo_advantages_are_whitened():
    rows, rewards, mask = rows_and_rewards()
    adv, _ = step.compute_advantages(rows, rewards, config_from_dict({**BASE, "rl_algorithm": "rloo"}))
    groups = rewards.astype(np.float64).reshape(2, 3)
    loo = (groups - (groups.sum(1, keepdims=True) - groups) / 2).reshape(-1)
    tokens = np.broadcast_to(loo[:, None], mask.shape)[mask.astype(bool)]
    expected = (loo[:, None] - tokens.mean()) / (tokens.std(ddof=1) + 1e-8) * mask
    np.testing.assert_allclose(adv, expected, rtol=0, atol=1e-6)


def test_one_line_per_key_says_why_it_has_no_effect(tmp_path, caplog):
    path = tmp_path / "grpo.yaml"
    path.write_text("rl_algorithm: grpo\nnormalize_reward: true\nnormalize_advantage: true\n")
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.config"):
        load_config(path, device="cpu")
    lines = [r.getMessage() for r in caplog.records if "normaliz" in r.getMessage()]
    assert [line.split(": key ")[0] for line in lines] == [f"{path}:2", f"{path}:3"]
    assert "key 'normalize_reward' has no effect here: rl_algorithm 'grpo'" in lines[0]
    assert "key 'normalize_advantage' has no effect here" in lines[1]
    assert all("PaddleNLP" in line and "\n" not in line for line in lines)
    caplog.clear()
    path.write_text("rl_algorithm: reinforce_plus_plus\nnormalize_reward: true\nnormalize_advantage: true\n")
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.config"):
        load_config(path, device="cpu")
    assert not [r for r in caplog.records if "normaliz" in r.getMessage()]


def test_paddlenlps_grpo_config_that_sets_both_trains_without_them():
    if not PADDLENLP_GRPO.is_file():
        pytest.skip(f"{PADDLENLP_GRPO} not found (only present beside the project's own checkout)")
    cfg = load_config(PADDLENLP_GRPO, device="cpu", warn=False)
    assert cfg.rl_algorithm == "grpo" and cfg.normalize_reward and cfg.normalize_advantage
    assert not cfg.reward_normalization and not cfg.advantage_normalization


def test_the_trainer_keeps_no_reward_statistics_for_grpo(tiny_policy_dir, tmp_path):
    from paddle_grpo.trainer import Trainer

    (tmp_path / "train.jsonl").write_text('{"src": "Who?", "tgt": "A"}\n{"src": "Why?", "tgt": "B"}\n')
    (tmp_path / "rewards.py").write_text("def r(prompts, completions, **kw):\n    return [1.0] * len(completions)\n")
    common = dict(BASE, actor_model_name_or_path=tiny_policy_dir, reward_funcs=f"{tmp_path / 'rewards.py'}:r",
                  train_datasets=str(tmp_path / "train.jsonl"), save_strategy="no", disable_tqdm=True,
                  report_to="none", per_device_train_batch_size=6)
    grpo = Trainer(config_from_dict({**common, "rl_algorithm": "grpo", "output_dir": str(tmp_path / "a")}))
    assert grpo.normalizer is None
    rpp = Trainer(config_from_dict({**common, "rl_algorithm": "reinforce_plus_plus",
                                    "output_dir": str(tmp_path / "b")}))
    assert rpp.normalizer is not None
