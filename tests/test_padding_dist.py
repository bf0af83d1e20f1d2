"""balance_batch over two gloo ranks (one `paddle.distributed.launch`) against one process without it.

Prompts of very different lengths make the ranks' token counts differ; with balance_batch each global mini-batch's
rows are reassigned to the ranks (step.balance), micro-batches are sorted, trimmed and cut by a token budget
(use_remove_padding, max_tokens_per_micro_batch). Sampling is keyed by global row and the loss uses global
denominators, so every metric and the trained parameters must equal the plain single-process run up to float
rounding.
"""
import json
import sys

import pytest
from launch_helpers import assert_checkpoints_match, assert_metrics_match, launch, run, write_config

SUBJECTS = ["Ann", "Bob and the tall knight from the northern hills who never lies", "Cid",
            "Dan, Eve and Fay, three knaves who always lie about each other", "Gus", "Hal the knave", "Ivy",
            "Jon, a knight who tells the truth about every island"]


@pytest.mark.e2e
def test_two_balanced_ranks_match_one_unbalanced_process(tmp_path, tiny_policy_dir, repo_root):
    cfg = write_config(tmp_path, tiny_policy_dir, "grpo")
    rows = [{"src": f"<|im_start|>user\nWho is {s}?<|im_end|>\n<|im_start|>assistant\n<think>",
             "tgt": f"(1) {s} is a knight"} for s in SUBJECTS]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run_rl = str(repo_root / "run_rl.py")
    common = ["--global_mini_batch_size", "2", "--max_prompt_len", "40", "--max_length", "48"]
    run([sys.executable, run_rl, str(cfg), "--output_dir", str(tmp_path / "one"), *common], tmp_path)
    run(launch(run_rl, cfg, "--output_dir", tmp_path / "two", *common, "--balance_batch", "true",
               "--use_remove_padding", "true", "--max_tokens_per_micro_batch", "60", log_dir=tmp_path / "log"),
        tmp_path)
    one = [json.loads(line) for line in open(tmp_path / "one" / "metrics.jsonl")]
    two = [json.loads(line) for line in open(tmp_path / "two" / "metrics.jsonl")]
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
    # float32 sums in another order (launch_helpers.TINY_REL_TOL); rewards and lengths are exactly equal
    assert assert_metrics_match(one, two) > 30 and one[0]["train/reward_std"] > 0
    # 2 steps x 2 mini-batches: 4 Adam steps of lr 1e-3 (numerics.assert_adam_close)
    assert_checkpoints_match(tmp_path / "one", tmp_path / "two", tiny_policy_dir, 4)
    log = (tmp_path / "log" / "workerlog.0").read_text() + (tmp_path / "log" / "workerlog.1").read_text()
    assert "Traceback" not in log
