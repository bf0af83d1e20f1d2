"""Shared by the fault tests (tests/run/test_faults.py, tests/run/test_faults_e2e.py,
tests/reward_server/test_restart_mid_run.py, tests/rewards/test_reward_timeout.py): a tiny training setup, the run_rl.py arguments for it, and the comparison of
two runs' histories.

Exactness: a resumed run loads the checkpoint's float32 weights, optimizer moments and generator states bit for
bit, and samples with keys fixed by (seed, step, row) (rollout/sampling.py), so on one machine, where both runs use
the same kernels, every logged value and every final weight equals the uninterrupted run's exactly (`==`). Only the
timings (perf/*) differ."""
import json
import os

import numpy as np

NAMES = ["Ann", "Bob", "Cid", "Dan", "Eve", "Fay", "Gus", "Hal", "Ivy", "Jon", "Kim", "Lea"]

# 1 for a completion naming the prompt's person, plus a small length term: a reward with variance under a random
# policy. `hang` never returns for the prompts about Ann and Bob (and scores 0 elsewhere).
REWARD_FILE = '''
import threading


def name_reward(prompts, completions, tgt=None, **kwargs):
    return [float(t.split()[1] in c) + 0.01 * len(c) for c, t in zip(completions, tgt)]


def hang(prompts, completions, **kwargs):
    if any("Ann" in p or "Bob" in p for p in prompts):
        threading.Event().wait()  # forever
    return [0.0] * len(prompts)
'''


def write_data(directory):
    """train.jsonl (12 prompts), eval.jsonl (4) and rewards.py in `directory`."""
    rows = [{"src": f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n<think>",
             "tgt": f"(1) {n} is a knight"} for n in NAMES]
    (directory / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (directory / "eval.jsonl").write_text("\n".join(json.dumps(r) for r in rows[:4]) + "\n")
    (directory / "rewards.py").write_text(REWARD_FILE)
    return directory


def settings(data, policy, out, **overrides):
    """The configuration of a tiny run (a dict of keys), `overrides` applied."""
    values = dict(actor_model_name_or_path=str(policy), use_rm_server=False,
                  reward_funcs=f"{data / 'rewards.py'}:name_reward", train_datasets=str(data / "train.jsonl"),
                  output_dir=str(out), max_prompt_len=32, max_dec_len=8, min_dec_len=1, max_length=40,
                  global_batch_size=4, rollout_n=4, per_device_train_batch_size=8, per_device_logprob_batch_size=16,
                  learning_rate=2e-3, max_steps=4, kl_coeff=0.0, save_strategy="steps", save_steps=100,
                  disable_tqdm=True, report_to="none", seed=7, temperature=1.0, dataloader_shuffle=True)
    values.update(overrides)
    return values


def make_cfg(data, policy, out, **overrides):
    from paddle_grpo.config import config_from_dict

    return config_from_dict(settings(data, policy, out, **overrides))


def command_line(values):
    """`--key value` arguments of run_rl.py for a settings() dict."""
    args = []
    for key, value in values.items():
        args += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return args


def read_rows(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def assert_same_history(out, reference):
    """metrics.jsonl of `out` has every step of `reference`'s once, with the same values (timings aside), and
    rollouts.jsonl the same rows."""
    got, want = read_rows(os.path.join(out, "metrics.jsonl")), read_rows(os.path.join(reference, "metrics.jsonl"))
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want):
        assert sorted(a) == sorted(b), (a["step"], set(a) ^ set(b))
        for key in b:
            if not key.startswith("perf/"):
                assert a[key] == b[key], (a["step"], key, a[key], b[key])
    assert read_rows(os.path.join(out, "rollouts.jsonl")) == read_rows(os.path.join(reference, "rollouts.jsonl"))


def checkpoint_params(path):
    import paddle

    return {k: v.numpy() for k, v in paddle.load(os.path.join(path, "model_state.pdparams")).items()}


def assert_same_weights(a, b):
    pa, pb = checkpoint_params(a), checkpoint_params(b)
    assert sorted(pa) == sorted(pb)
    for key in pa:
        assert np.array_equal(pa[key], pb[key]), key
