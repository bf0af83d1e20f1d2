"""The evaluation under data parallelism: 2 gloo ranks, each sampling every other eval prompt, give the single
process's per-problem results and n-sample metrics (the sampling keys are per global row, step/evaluation.py)."""
import json
import sys

import pytest

from launch_helpers import launch, run, write_config

REWARD_FILE = '''
def first_letter(prompts, completions, **kwargs):
    return [c.strip()[:1].lower() or None for c in completions]


def vowel_first(prompts, completions, **kwargs):
    return [1.0 if a is not None and a in "aeiou0123" else 0.0 for a in first_letter(prompts, completions)]


vowel_first.max_score = 1.0
vowel_first.extract_answer = first_letter
'''


@pytest.mark.e2e
def test_two_ranks_evaluate_as_one_process(tmp_path, tiny_policy_dir, repo_root):
    cfg = write_config(tmp_path, tiny_policy_dir, "grpo")
    (tmp_path / "rewards.py").write_text(REWARD_FILE)
    args = ["--reward_funcs", f"{tmp_path / 'rewards.py'}:vowel_first", "--max_steps", "1", "--do_eval", "true",
            "--eval_datasets", tmp_path / "train.jsonl", "--eval_steps", "1", "--eval_do_sample", "true",
            "--eval_num_samples", "4", "--per_device_eval_batch_size", "3"]
    run_rl = str(repo_root / "run_rl.py")
    run([sys.executable, run_rl, str(cfg), "--output_dir", str(tmp_path / "one"), *map(str, args)], tmp_path)
    run(launch(run_rl, cfg, "--output_dir", tmp_path / "two", *args, log_dir=tmp_path / "log"), tmp_path)

    def read(out, name):
        return [json.loads(line) for line in (tmp_path / out / name).read_text().splitlines()]

    one, two = read("one", "eval_per_problem.jsonl"), read("two", "eval_per_problem.jsonl")
    assert [(r["step"], r["index"]) for r in one] == [(s, i) for s in (0, 1) for i in range(8)]
    # the same tokens (rewards and answers are functions of them), gathered into the same order by rank 0
    assert two == one
    assert len({r["correct"] for r in one}) >= 2
    evals = [[r for r in read(out, "metrics.jsonl") if "eval/samples" in r] for out in ("one", "two")]
    for a, b in zip(*evals):
        keys = [k for k in a if k.startswith("eval/")]
        assert {"eval/pass@4", "eval/mean@4", "eval/maj@4"} <= set(keys) and keys == [k for k in b if "eval/" in k]
        # rank 0 computes them from the gathered rows, sorted by problem: the single process's arrays, the same sums
        assert {k: b[k] for k in keys} == {k: a[k] for k in keys}
