"""Shared by the in-process trainer tests (tests/test_trainer.py, tests/test_ppo.py, tests/policy/test_lora.py, ...)."""
import json
import os

from paddle_grpo.trainer import Trainer


def params(model):
    """{name: numpy copy} of a model's parameters (a snapshot: later updates do not change it)."""
    return {n: p.numpy().copy() for n, p in model.named_parameters()}


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
