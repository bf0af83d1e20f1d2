"""Faults do not lose work: what the trainer keeps at the start of each step, and what it saves when a step fails.

A step advances the prompt sampler, draws random numbers, updates the running reward statistics, the learning-rate
schedule and the update counters, applies its optimizer steps, and is then evaluated (when due) and logged.
`StepGuard` keeps at the start of every step what changes before the first optimizer step (small: positions,
counters, generator states), counts the optimizer steps the step applies, and knows which phase failed:

- before the step's first optimizer step (rollout, rewards, log-probs; e.g. the reward server gone for good): the
  kept state is restored, so the trainer is at the end of the last completed, logged step, and that is saved
  (unless the latest checkpoint already holds it);
- after the update (evaluation or logging failed, e.g. the disk is full): the trainer is at the end of this step;
  that state is saved together with the step's metrics and samples (`unlogged`), which the resumed run writes
  first, so metrics.jsonl gets every step once;
- between the step's first optimizer step and the end of its update (possible with several optimizer steps per
  step): the weights of the last completed step are gone (keeping a copy would cost the model and optimizer state
  again in memory), so nothing is saved and the run resumes from the latest checkpoint, computing the steps since
  again with the same values. Ctrl-C and SIGTERM therefore wait for a running update to end (a second one does
  not), and never interrupt a checkpoint being written.

Saving must not corrupt the previous checkpoint: checkpoints are written beside and renamed into place
(run/checkpoint.py), and a failed save says so. With several processes the fault path uses no collective (the other
ranks may be anywhere): under data parallelism alone rank 0 holds the whole state and saves it by itself; otherwise
only an interrupt that reaches every rank in the same state saves (collectively), and a fatal error saves nothing.
"""
from __future__ import annotations

import copy
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from . import checkpoint as ckpt

if TYPE_CHECKING:
    from ..trainer import Trainer

logger = logging.getLogger("paddle_grpo.run.faults")

# How long a rank other than 0 waits after its own fatal error before exiting under a launch: paddle's launcher
# stops every rank about 3 s after one exits, and rank 0 needs the time to notice (its own error, or a collective's
# timeout) and write its checkpoint.
FAULT_GRACE_S = 60.0


@dataclass
class Snapshot:
    """What a step changes before its first optimizer step, as it was at the step's start."""
    step: int
    sampler: Dict[str, Any]
    normalizer: Optional[Dict[str, float]]
    scheduler: Dict[str, Any]
    counters: Any
    rng: Dict[str, Any]
    loss_scale: Any
    critic: Optional[Dict[str, Any]] = None   # PPO / VAPO: the critic's schedule, counters, loss scale


def jsonable(value: Any) -> Any:
    """`value` with numpy / paddle scalars as Python numbers (as MetricsLogger writes them), for trainer_state.json."""
    return json.loads(json.dumps(value, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


class StepGuard:
    """Tracks one trainer's step (phase, optimizer steps applied, the state at its start), handles Ctrl-C / SIGTERM,
    and saves the last consistent state when the run stops on an error (`on_fault`)."""

    def __init__(self, trainer: Trainer) -> None:
        self.t = trainer
        self.phase = "idle"          # "step" (until the update ends), "finish" (evaluate, log), "idle"
        self.applied = 0             # optimizer steps this step has applied
        self.saving = False
        self.deferred = False        # an interrupt waiting for the update or a save to end
        self.interrupted = False     # a signal raised KeyboardInterrupt (see `as_interrupt`)
        self.snapshot: Optional[Snapshot] = None
        self.unlogged: Optional[Dict[str, Any]] = None
        critic = getattr(trainer, "critic_learner", None)
        for optimizer in [trainer.learner.optimizer] + ([critic.optimizer] if critic is not None else []):
            self._count_steps(optimizer)

    def _count_steps(self, optimizer: Any) -> None:
        apply = optimizer.step

        # The calls that change the weights (step.update; step.update_critic for the critic's optimizer).
        def counted_step(*args: Any, **kwargs: Any) -> Any:
            self.applied += 1
            return apply(*args, **kwargs)

        optimizer.step = counted_step

    # ---------------------------------------------------------------------------------------------- phases

    def begin(self) -> None:
        t = self.t
        scale = t.learner.amp.loss_scale if t.learner.amp else None
        self.snapshot = Snapshot(
            t.step, copy.deepcopy(t.sampler.state_dict()),
            t.normalizer.state_dict() if t.normalizer is not None else None,
            copy.deepcopy(t.learner.scheduler.state_dict()), copy.copy(t.learner.state), ckpt.rng_state(),
            copy.deepcopy(scale), copy.deepcopy(t.critic_learner.state_dict()) if self._critic() else None)
        self.applied, self.phase = 0, "step"

    def stepped(self, metrics: Dict[str, Any], samples: Optional[List[dict]]) -> None:
        """The update is done: from here the trainer's state is this step's end; `metrics` (before evaluation) and
        the train `samples` (None when not logged this step) are what a fault would leave unwritten."""
        self.phase = "finish"
        self.unlogged = {"metrics": jsonable(metrics), "samples": jsonable(samples)}
        self.raise_deferred()

    def logged(self) -> None:
        self.phase, self.unlogged = "idle", None

    def restore(self) -> None:
        """Back to the state at the start of the step (only before its first optimizer step)."""
        t, s = self.t, self.snapshot
        t.step = s.step
        t.sampler.set_state_dict(s.sampler)
        if t.normalizer is not None:
            t.normalizer.set_state_dict(s.normalizer)
        t.learner.scheduler.set_state_dict(s.scheduler)
        t.learner.state = s.counters
        ckpt.set_rng_state(s.rng)
        if s.loss_scale is not None:
            t.learner.amp.loss_scale = s.loss_scale
        if s.critic is not None:
            t.critic_learner.set_state_dict(s.critic)
        self.phase = "idle"

    def _critic(self) -> bool:
        return getattr(self.t, "critic_learner", None) is not None

    # --------------------------------------------------------------------------------------------- signals

    def install(self) -> Dict[int, Any]:
        """Handle SIGTERM and SIGINT (when Python's default handler has it) as an interrupt; returns the previous
        handlers for `uninstall`. Only the main thread can set handlers: elsewhere nothing changes."""
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {signal.SIGTERM: signal.getsignal(signal.SIGTERM)}
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # an ignored SIGINT stays ignored
            previous[signal.SIGINT] = signal.SIG_DFL
        for sig in previous:
            previous[sig] = signal.signal(sig, self._on_signal)
        return previous

    @staticmethod
    def uninstall(previous: Dict[int, Any]) -> None:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if (self.saving or (self.phase == "step" and self.applied)) and not self.deferred:
            self.deferred = True
            logger.warning("%s: stopping after the %s", signal.Signals(signum).name,
                           "checkpoint being written" if self.saving else "update of the running step (a second "
                           "signal stops at once, losing the steps since the latest checkpoint)")
            return
        self.interrupted = True
        raise KeyboardInterrupt

    def raise_deferred(self) -> None:
        if self.deferred and not self.saving:
            self.deferred = False
            self.interrupted = True
            raise KeyboardInterrupt

    def as_interrupt(self, error: BaseException) -> BaseException:
        """`error`, or the KeyboardInterrupt it stands for. The handler's KeyboardInterrupt can be raised while
        Python code runs inside paddle's backward (the `PyLayer` backward of kernels/, e.g. RMSNorm's), and paddle
        hands an exception from there back as an `OSError` naming it; after a signal, that is the interrupt."""
        if self.interrupted and not isinstance(error, KeyboardInterrupt):
            return KeyboardInterrupt(f"interrupted inside paddle's backward ({type(error).__name__})")
        return error

    # ---------------------------------------------------------------------------------------------- faults

    def save(self, **kwargs: Any) -> None:
        """Trainer.save with signals deferred (an interrupt must not cut a checkpoint short)."""
        self.saving = True
        try:
            self.t.save(**kwargs)
        finally:
            self.saving = False

    def on_fault(self, error: BaseException) -> str:
        """Save the last consistent state after `error` stopped the loop, as far as possible; returns one line
        for the user saying what was saved and how the same command resumes (also logged)."""
        t, par = self.t, self.t.par
        interrupt = isinstance(error, KeyboardInterrupt)
        latest = ckpt.latest_checkpoint(t.cfg.output_dir)
        resume = (f"re-running the same command resumes from {latest}" if latest else
                  "re-running the same command starts the run again")
        if self.phase == "step" and self.applied:
            message = (f"no checkpoint saved: the error came during the update of step {self.snapshot.step + 1}, "
                       f"after {self.applied} of its optimizer steps changed the weights, so the state after step "
                       f"{self.snapshot.step} is gone; {resume} (the steps after it are computed again, with the "
                       "same values)")
            return self._report(message, error)
        if self.phase == "step":
            self.restore()
        solo = par.world_size > 1 and par.tp_world == 1 and par.pp_world == 1 and par.sharding_world == 1
        if par.world_size > 1 and not solo and not (interrupt and self._every_rank_agrees()):
            return self._report(f"no checkpoint saved: under tensor or pipeline parallelism or sharding a checkpoint "
                                f"takes every rank, and they may not all have stopped; {resume}", error)
        if par.world_size > 1 and not par.is_main and solo:
            self._report(f"waiting up to {FAULT_GRACE_S:g} s for rank 0 to save a checkpoint", error)
            time.sleep(FAULT_GRACE_S)  # the launcher stops this rank once rank 0 has exited
            return "rank 0 saves the checkpoint"
        held = os.path.basename(latest or "") == f"checkpoint-{t.step}"
        if self.unlogged is None and (held or t.step == 0):
            where = f"{latest} holds it" if held else "no step was completed"
            return self._report(f"nothing new to save: the last completed step is {t.step} and {where}; {resume}",
                                error)
        try:
            self.save(unlogged=self.unlogged, solo=solo)
        except Exception as exc:  # noqa: BLE001 - e.g. no space left: say so; the previous checkpoint is intact
            return self._report(f"saving a checkpoint of step {t.step} failed ({type(exc).__name__}: {exc}); the "
                                f"latest complete checkpoint is untouched: {resume}", error)
        return self._report(f"saved a checkpoint of the last completed step, {t.last_checkpoint}: re-running the "
                            "same command resumes from it with nothing lost", error)

    def _every_rank_agrees(self) -> bool:
        """An interrupt under tensor/pipeline parallelism or sharding: save collectively only when every rank
        stopped at the same consistent step (they all got the signal)."""
        t = self.t
        mine = (t.step, self.unlogged is not None)
        from ..parallel import collectives

        try:
            return len(set(collectives.gather_objects(mine))) == 1
        except Exception:  # noqa: BLE001 - a rank that is gone: no collective save
            return False

    def _report(self, message: str, error: BaseException) -> str:
        what = "interrupted" if isinstance(error, KeyboardInterrupt) else f"stopped by {type(error).__name__}"
        logger.error("%s at step %d: %s", what, self.t.step, message)
        return message
