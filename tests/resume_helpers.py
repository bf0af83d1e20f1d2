"""Shared by the in-process resume tests (tests/test_trainer.py, tests/policy/test_lora.py)."""
from paddle_grpo.trainer import Trainer


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
    resumed = Trainer(make_cfg(out_dir / "split", resume_from_checkpoint=True, **common))
    assert resumed.step == steps_before_stop
    resumed.train()
    return full, resumed
