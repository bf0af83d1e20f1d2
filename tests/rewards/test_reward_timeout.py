"""reward_timeout_s: an in-process reward function that never returns costs its samples' rewards, not the run."""
import logging

import numpy as np

from fault_helpers import make_cfg, read_rows, write_data
from paddle_grpo.data import PromptSampler
from paddle_grpo.trainer import Trainer


def test_a_reward_function_that_sleeps_forever_times_out_and_the_run_finishes(tmp_path, tiny_policy_dir, caplog):
    """`hang` never returns for the prompts about Ann and Bob: with reward_timeout_s 1 the batch call times out,
    the per-sample calls time out for those prompts only, and their samples get reward None; the run trains its
    steps and train/reward_none_frac is the share of their samples, computed from the sampler's own order."""
    data = write_data(tmp_path)
    cfg = make_cfg(data, tiny_policy_dir, tmp_path / "out", max_steps=3, reward_timeout_s=1,
                   reward_funcs=f"{data / 'rewards.py'}:name_reward,{data / 'rewards.py'}:hang")
    trainer = Trainer(cfg)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    rows = read_rows(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    sampler = PromptSampler(12, 4, shuffle=True, seed=cfg.seed, drop_last=cfg.dataloader_drop_last)
    for row in rows:  # the prompts are rows 0..11 = Ann..Lea; Ann and Bob are rows 0 and 1
        drawn = np.asarray(sampler.next_batch())
        assert row["train/reward_none_frac"] == np.isin(drawn, [0, 1]).mean(), (row["step"], drawn)
    assert any(0 < r["train/reward_none_frac"] < 1 for r in rows)  # the seed draws them in some step
    assert "timed out after 1 s" in caplog.text and "hang" in caplog.text
    samples = read_rows(tmp_path / "out" / "rollouts.jsonl")
    for s in samples:
        assert (s["reward"] is None) == ("Ann" in s["prompt"] or "Bob" in s["prompt"])
