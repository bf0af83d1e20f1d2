"""Shared by the in-process trainer tests (tests/test_trainer.py, tests/test_ppo.py, tests/policy/test_lora.py, ...)."""
import json
import os

import numpy as np

from paddle_grpo.trainer import Trainer


def tiny_run(policy_dir, reward_funcs, train_datasets, out, **overrides):
    """The config values of a short in-process run of the tiny policy (rewards `reward_funcs`, prompts
    `train_datasets`, outputs in `out`): 2 steps of 2 prompts x 4 samples, completions of 1-8 tokens; `overrides`
    win."""
    values = dict(actor_model_name_or_path=policy_dir, use_rm_server=False, reward_funcs=reward_funcs,
                  train_datasets=str(train_datasets), output_dir=str(out), logging_dir=str(out / "vdl"),
                  max_prompt_len=32, max_dec_len=8, min_dec_len=1, max_length=40, global_batch_size=2, rollout_n=4,
                  per_device_train_batch_size=4, per_device_logprob_batch_size=16, learning_rate=2e-3, max_steps=2,
                  kl_coeff=0.0, save_strategy="no", disable_tqdm=True, seed=7, temperature=1.0)
    values.update(overrides)
    return values


NAMES = ["Ann", "Bob", "Cid", "Dan", "Eve", "Fay", "Gus", "Hal"]


def name_prompts_dir(directory, reward_source):
    """`directory` with train.jsonl (8 chat prompts `Who is <name>?`) and rewards.py (`reward_source`, defining
    `reward`): the inputs of a tiny_run whose reward is `<directory>/rewards.py:reward`. Returns `directory`."""
    rows = [{"src": f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n", "tgt": "x"} for n in NAMES]
    (directory / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "rewards.py").write_text(reward_source)
    return directory


def params(model):
    """{name: numpy copy} of a model's parameters (a snapshot: later updates do not change it)."""
    return {n: p.numpy().copy() for n, p in model.named_parameters()}


def trained(trainer):
    """Train `trainer` to its end; (whether any parameter changed, the rows of its metrics.jsonl)."""
    before = params(trainer.policy.model)
    trainer.train()
    after = params(trainer.policy.model)
    return any(not np.array_equal(before[k], after[k]) for k in before), read_metrics(trainer.cfg.output_dir)


def assert_resumed_exactly(out_dir, full, resumed, steps):
    """`full_and_resumed`'s two runs logged the same metrics (perf/ aside) at `steps` and ended with equal
    parameters."""
    a = {r["step"]: r for r in read_metrics(out_dir / "full")}
    b = {r["step"]: r for r in read_metrics(out_dir / "split")}
    for n in steps:
        for key in a[n]:
            if not key.startswith("perf/"):
                assert a[n][key] == b[n][key], (n, key)
    pa, pb = params(full.policy.model), params(resumed.policy.model)
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)


def read_metrics(out):
    """The rows of a run's metrics.jsonl, in order."""
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def full_and_resumed(make_cfg, out_dir, steps_before_stop, **common):
    """Two runs of one config: `full` trains to max_steps into out_dir/full; the other trains `steps_before_stop`
    steps into out_dir/split, saves a checkpoint there (what a run stopped at that step leaves behind) and is then
    resumed from it to max_steps. `make_cfg(output_dir, **overrides)` builds the config. Returns (full, resumed)."""
    full = Trainer(make_cfg(out_dir / "full", **common))
    full.train()
    first = Trainer(make_cfg(out_dir / "split", **common))
    for _ in range(steps_before_stop):
        metrics = first.train_step()
        first.log.log(first.step, metrics)
    first.save()
    first.batches.close()  # what train() does on its way out: an async run's rollout worker stops here, not at exit
    first.log.close()
    resumed = Trainer(make_cfg(out_dir / "split", resume_from_checkpoint=True, **common))
    assert resumed.step == steps_before_stop
    resumed.train()
    return full, resumed
