"""The held-out evaluation (step/evaluation.py) end to end: a tiny random Qwen2, real files, in-process rewards.

The n-sample metrics in metrics.jsonl are recomputed here from eval_per_problem.jsonl with independent code
(math.comb for the binomials of Chen et al.'s estimator, collections.Counter for the vote); the evaluation's own
sampling keys are checked against runs that reach the same settings through the rollout's keys; the file is cut
back on resume like metrics.jsonl; evaluating (with any n) leaves the training trajectory unchanged.
"""
import json
import logging
import math
from collections import Counter

import numpy as np
import pytest

from paddle_grpo.config import config_from_dict
from paddle_grpo.trainer import Trainer
from resume_helpers import read_metrics

# The reward reads one "answer" per completion, its first character's class: "in" (a character of the reference),
# "out" (another letter or digit) or None (a symbol, or nothing), and pays 1.0 for "in". A random tiny policy gets
# "in" on about a third of its samples, so the counts c per problem spread over 0..n and the vote is not trivial.
REWARD_FILE = '''
def first_class(prompts, completions, tgt=None, **kwargs):
    out = []
    for i, c in enumerate(completions):
        head = c.strip()[:1]
        out.append("in" if head and head in tgt[i] else "out" if head.isalnum() else None)
    return out


def first_class_reward(prompts, completions, tgt=None, **kwargs):
    return [1.0 if a == "in" else 0.0 for a in first_class(prompts, completions, tgt=tgt)]


first_class_reward.max_score = 1.0
first_class_reward.extract_answer = first_class


def no_answer_reward(prompts, completions, tgt=None, **kwargs):
    return first_class_reward(prompts, completions, tgt=tgt)


no_answer_reward.max_score = 1.0


def length_reward(prompts, completions, completion_ids=None, **kwargs):
    return [float(len(ids)) for ids in completion_ids]
'''
NAMES = ["Ann", "Bob", "Cid", "Dan", "Eve", "Fay", "Gus"]
N = 8


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("evaluation")
    rows = [{"src": f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n", "tgt": "aeiouAEIOU0123"}
            for n in NAMES]
    for name in ("train", "eval"):
        (d / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (d / "rewards.py").write_text(REWARD_FILE)
    return d


def make_cfg(workdir, policy, out, **overrides):
    # 7 eval prompts in batches of 3 (the last one short); two training steps of 4 prompts x 4 samples
    values = dict(actor_model_name_or_path=policy, use_rm_server=False,
                  reward_funcs=f"{workdir / 'rewards.py'}:first_class_reward", train_datasets=str(workdir / "train.jsonl"),
                  eval_datasets=str(workdir / "eval.jsonl"), do_eval=True, eval_steps=1, per_device_eval_batch_size=3,
                  eval_do_sample=True, eval_num_samples=N, output_dir=str(out), logging_dir=str(out / "vdl"),
                  max_prompt_len=32, max_dec_len=8, min_dec_len=1, max_length=40, global_batch_size=4, rollout_n=4,
                  per_device_train_batch_size=8, per_device_logprob_batch_size=16, learning_rate=2e-3, max_steps=2,
                  kl_coeff=0.0, save_strategy="no", disable_tqdm=True, seed=7, temperature=1.0)
    values.update(overrides)
    return config_from_dict(values)


def problems(out, step=None):
    with open(out / "eval_per_problem.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return rows if step is None else [r for r in rows if r["step"] == step]


def reference_metrics(rows, n):
    """pass@k, mean@n and maj@n from the file's rows, by the paper's formula in exact integers."""
    c = [r["correct"] for r in rows]
    ks = [k for k in (1, 2, 4, 8, 16) if k < n] + [n]
    out = {f"eval/pass@{k}": sum(1 - math.comb(n - ci, k) / math.comb(n, k) for ci in c) / len(c) for k in ks}
    out[f"eval/mean@{n}"] = sum(ci / n for ci in c) / len(c)
    votes = []
    for r in rows:
        given = Counter(a for a in r["answers"] if a is not None)  # most_common: ties in first-seen order
        top = given.most_common(1)[0][0] if given else None
        votes.append(top is not None and any(a == top and s >= 1.0 - 1e-6 for a, s in zip(r["answers"], r["scores"])))
    out[f"eval/maj@{n}"] = sum(votes) / len(votes)
    return out


def test_n_sample_metrics_equal_the_estimator_on_the_per_problem_file(workdir, tiny_policy_dir, tmp_path):
    out = tmp_path / "out"
    Trainer(make_cfg(workdir, tiny_policy_dir, out)).train()
    evals = [r for r in read_metrics(out) if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 1, 2]
    spread = set()
    for row in evals:
        rows = problems(out, row["step"])
        assert [r["index"] for r in rows] == list(range(len(NAMES)))  # each problem once, in order
        for r in rows:
            assert len(r["scores"]) == len(r["answers"]) == N
            assert r["correct"] == sum(s >= 1.0 - 1e-6 for s in r["scores"])
            assert all((a == "in") == (s == 1.0) for a, s in zip(r["answers"], r["scores"]))
            spread.add(r["correct"])
        assert row["eval/samples"] == len(NAMES) * N
        assert row["eval/accuracy"] == pytest.approx(sum(r["correct"] for r in rows) / (len(NAMES) * N), abs=1e-15)
        want = reference_metrics(rows, N)
        assert set(k for k in row if "@" in k) == set(want)
        # float64: each per-problem value is within 2k roundings (k <= 8) of the exact one, the mean of 7 adds 7
        # more: |difference| < 32 * 2^-53 ~ 3.6e-15 (the reference's own rounding is of the same size)
        for key, value in want.items():
            assert abs(row[key] - value) <= 1e-14, (row["step"], key, row[key], value)
        assert row["eval/pass@1"] == pytest.approx(row["eval/accuracy"], abs=1e-15)
        assert row[f"eval/mean@{N}"] == pytest.approx(row["eval/accuracy"], abs=1e-15)
    assert len(spread) >= 3, spread  # the counts vary: the test exercises the estimator beyond 0 and n
    # VisualDL holds the same scalars at the same steps (stored as float32: relative 2^-24 ~ 6e-8 each)
    from visualdl import LogReader

    reader = LogReader(file_path=str(next((out / "vdl").glob("vdlrecords*"))))
    for key in [f"eval/pass@{k}" for k in (1, 2, 4, 8)] + [f"eval/mean@{N}", f"eval/maj@{N}"]:
        logged = [(d.id, d.value) for d in reader.get_data("scalar", key)]
        assert logged == [(r["step"], pytest.approx(r[key], rel=1e-6, abs=1e-7)) for r in evals], key


def test_evaluation_leaves_training_unchanged_and_final_only_samples_n_at_the_end(workdir, tiny_policy_dir, tmp_path):
    """Evaluating with 8 samples per prompt, with 1, or not at all: the same training metrics, value for value
    (the evaluation draws from its own key stream). With eval_num_samples_final_only the evaluations before the
    last draw one sample per prompt."""
    runs = {}
    for name, extra in (("none", dict(do_eval=False)), ("n8", {}), ("final", dict(eval_num_samples_final_only=True)),
                        ("greedy", dict(eval_do_sample=False, eval_num_samples=1))):
        Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / name, **extra)).train()
        runs[name] = read_metrics(tmp_path / name)
    train = {name: [{k: v for k, v in r.items() if k.startswith("train/")} for r in rows if r["step"] > 0]
             for name, rows in runs.items()}
    assert train["none"] and train["n8"] == train["none"] == train["final"] == train["greedy"]
    final = {r["step"]: r for r in runs["final"] if "eval/samples" in r}
    assert [final[s]["eval/samples"] for s in (0, 1, 2)] == [len(NAMES), len(NAMES), len(NAMES) * N]
    assert not any("@" in k for s in (0, 1) for k in final[s]) and f"eval/pass@{N}" in final[2]
    assert [len(r["scores"]) for r in problems(tmp_path / "final", 1)] == [1] * len(NAMES)
    # the last evaluation of both runs draws the same 8 samples per prompt (same keys, same weights)
    assert problems(tmp_path / "final", 2) == problems(tmp_path / "n8", 2)
    # one sample per prompt: sample 0 of the n-sample evaluation has the one-sample evaluation's key
    one = [r["answers"][0] for r in problems(tmp_path / "final", 0)]
    assert one == [r["answers"][0] for r in problems(tmp_path / "n8", 0)]


def test_the_evaluations_own_sampling_keys_reach_generation(workdir, tiny_policy_dir, tmp_path):
    def answers(name, **extra):
        t = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / name, **extra))
        t.evaluate()
        return [r["answers"] for r in problems(tmp_path / name)]

    # top-k 1 keeps only the most likely token: sampled evaluation equals greedy (one sample, eval_num_samples 1)
    greedy = answers("greedy", eval_do_sample=False, eval_num_samples=1)
    assert answers("top1", eval_top_k=1, eval_num_samples=1) == greedy
    # eval_temperature 0.5 under a rollout temperature of 1.0 samples what temperature 0.5 itself samples
    cold = answers("cold", eval_temperature=0.5)
    assert cold == answers("cold_rollout", temperature=0.5)
    assert cold != answers("warm")  # ... and not what the rollout's 1.0 samples (56 samples: all equal ~never)
    # eval_max_dec_len caps the eval completions (the reward here is the completion's length in tokens)
    t = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "short", eval_max_dec_len=2, eval_max_reward=2.0,
                         reward_funcs=f"{workdir / 'rewards.py'}:length_reward"))
    t.evaluate()
    lengths = [s for r in problems(tmp_path / "short") for s in r["scores"]]
    assert max(lengths) == 2 and min(lengths) >= 1
    assert t.cfg.eval_generation() == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 2}


def test_without_an_answer_extractor_maj_is_not_reported_and_the_log_says_why_once(workdir, tiny_policy_dir,
                                                                                     tmp_path, caplog):
    t = Trainer(make_cfg(workdir, tiny_policy_dir, tmp_path / "out",
                         reward_funcs=f"{workdir / 'rewards.py'}:no_answer_reward"))
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.step.evaluation"):
        first, second = t.evaluate(), t.evaluate()
    for metrics in (first, second):
        assert f"eval/pass@{N}" in metrics and f"eval/mean@{N}" in metrics and f"eval/maj@{N}" not in metrics
    said = [r.getMessage() for r in caplog.records if "maj@n" in r.getMessage()]
    assert len(said) == 1 and "answer extractor" in said[0]
    assert all(r["answers"] is None for r in problems(tmp_path / "out"))


def test_a_resumed_run_writes_each_evaluation_once(workdir, tiny_policy_dir, tmp_path):
    """Resumed from checkpoint-1 (of a run that went on to step 2), the file drops step 2's rows and the resumed
    run writes them again: each (step, problem) once, the same values as the uninterrupted run's. A finished run
    started again leaves the file as it is."""
    saving = dict(save_strategy="steps", save_steps=1)
    full = tmp_path / "full"
    Trainer(make_cfg(workdir, tiny_policy_dir, full, **saving)).train()
    out = tmp_path / "split"
    Trainer(make_cfg(workdir, tiny_policy_dir, out, **saving)).train()
    resumed = Trainer(make_cfg(workdir, tiny_policy_dir, out, resume_from_checkpoint=str(out / "checkpoint-1"),
                               **saving))
    assert resumed.step == 1
    assert sorted({r["step"] for r in problems(out)}) == [0, 1]  # step 2's rows dropped at start
    resumed.train()
    rows = problems(out)
    assert len({(r["step"], r["index"]) for r in rows}) == len(rows) == 3 * len(NAMES)
    assert rows == problems(full)
    Trainer(make_cfg(workdir, tiny_policy_dir, out, **saving)).train()  # finished: nothing to train
    assert problems(out) == rows


def test_greedy_evaluation_refuses_n_samples_and_sampling_keys():
    from paddle_grpo.config import ConfigError

    with pytest.raises(ConfigError, match="key 'eval_num_samples' = 8: needs eval_do_sample: true"):
        config_from_dict(dict(eval_num_samples=8))
    with pytest.raises(ConfigError, match="key 'eval_top_p' = 0.9: applies to sampled evaluation only"):
        config_from_dict(dict(eval_top_p=0.9))
    with pytest.raises(ConfigError, match="'eval_temperature' = 0.0: must be greater than 0"):
        config_from_dict(dict(eval_do_sample=True, eval_temperature=0.0))
    assert np.isclose(config_from_dict(dict(eval_do_sample=True, eval_num_samples=4)).eval_samples_at(False), 4)
