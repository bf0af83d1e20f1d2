"""Where each step's batch comes from (docs/async.md): `batch_source(...)` gives the trainer

- `SyncBatches`: the trainer collects (step.collect) with its own weights, the synchronous semantics;
- `AsyncBatches` (`async_rollout: true`): a rollout worker process samples and scores while the trainer updates.
  The samples of step s (0-based, the trainer's `step` before it) come from the weights after
  `version(s) = max(base, s - rollout_lag)` updates (`base`: the step the asynchronous run began from, 0 unless it
  resumed a synchronous checkpoint), so the staleness is `s - version(s)` and the run is deterministic: given the
  weights, the keyed sampling (rollout/sampling.py) gives the same samples in the worker as in the trainer.

Both have one interface: `start(step)` (optional: the worker's start-up overlaps the trainer's),
`next(step) -> (Batch, CollectMetrics)`, `publish(step)` after each update (the worker's
weights: the trainable parameters, under LoRA the adapters only, written once per step; rollout/async_worker.py),
`save(directory, step)` / `restore(path, state, step)` (a checkpoint holds the weight versions the pending steps
sample from, so a resumed run regenerates them exactly), `close()`, `cpu_seconds()`.

The worker process's entry, `worker_main`, is here and not in rollout/: it runs step.collect, and step/ imports
rollout/, never the reverse (rollout/async_worker.py starts it by its name, "paddle_grpo.step.async_rollout:
worker_main"). What the trainer does after collect (reference and old log-probs, a critic's values, advantages, the
updates, evaluation) stays in the trainer.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import time
import weakref
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np
import paddle

from ..config import ConfigError
from ..data import PromptSampler, read_jsonl
from ..parallel import ParallelContext
from ..policy import Policy
from ..rollout.async_worker import (WeightStore, WorkerProcess, oversubscribed, process_cpu_s, stop_requested,
                                     worker_env)
from .batch import BATCH_TENSORS, Batch
from .collection import PromptEncoder, build_rewarder, build_tools, collect
from .experience import reference_logprobs
from .metrics import CollectMetrics

logger = logging.getLogger("paddle_grpo.trainer")

WEIGHTS_DIR = "rollout_weights"   # in a checkpoint: the weight versions the pending steps sample from
WORKER_ENTRY = "paddle_grpo.step.async_rollout:worker_main"


def batch_source(cfg: Any, par: ParallelContext, policy: Policy, encode: PromptEncoder, rewarder: Any,
                 sampler: PromptSampler, records: Any, prompts_per_rank: int, learner: Any,
                 collect: Callable[..., Tuple[Batch, CollectMetrics]]) -> Any:
    """The trainer's source of batches: `AsyncBatches` with `async_rollout`, else `SyncBatches`, which calls
    `collect` (step.collect's arguments) with `learner.amp`, the model precision of the trainer's passes, read at
    each step."""
    if cfg.async_rollout:
        if cfg.rollout_lag > 0 and cfg.correction_mode == "none" and par.is_main:
            # Measured on the quickstart (docs/async.md): one step of staleness without correction collapsed it.
            # Only an explicit `none` gets here: unset, a lag means clip (Config.correction_mode).
            logger.warning("async_rollout with rollout_lag %d and rollout_correction none: the samples are %d "
                           "step(s) stale and uncorrected, which collapsed the quickstart's learning; set "
                           "rollout_correction: clip, or leave it unset (docs/async.md)", cfg.rollout_lag,
                           cfg.rollout_lag)
        elif cfg.rollout_correction is None and par.is_main:
            logger.info("async_rollout: rollout_correction %s (%s)", cfg.correction_mode, cfg.correction_reason)
        if par.is_main:
            warn_oversubscribed(cfg.rollout_worker_threads)
        return AsyncBatches(cfg, par, policy, sampler)
    return SyncBatches(cfg, par, policy, encode, rewarder, sampler, records, prompts_per_rank, learner, collect)


def warn_oversubscribed(worker_threads: int = 0) -> None:
    """Say so when the trainer's threads (OMP_NUM_THREADS) and the worker's (`worker_threads`, 0: the trainer's)
    compete for the cores this process may use (`oversubscribed`)."""
    from ..kernels.numpy_kernels import threads

    trainer, cores = threads(), len(os.sched_getaffinity(0))
    worker = worker_threads or trainer
    if oversubscribed(trainer, worker, cores):
        logger.warning("async_rollout: the trainer runs %d thread(s) (OMP_NUM_THREADS) and the rollout worker %d "
                       "(rollout_worker_threads) on %d usable core(s); they compete: set OMP_NUM_THREADS=%d, or "
                       "rollout_worker_threads 1 beside a multi-threaded trainer (docs/async.md)",
                       trainer, worker, cores, max(1, cores // 2))


def trainable_arrays(policy: Policy) -> Dict[str, np.ndarray]:
    """{structural name: numpy copy} of the parameters an update changes (under LoRA the adapters only)."""
    return {name: p.numpy() for name, p in policy.model.named_parameters() if not p.stop_gradient}


def load_arrays(policy: Policy, arrays: Dict[str, np.ndarray]) -> None:
    """Set `policy`'s parameters named in `arrays` (bit for bit: same dtype)."""
    params = dict(policy.model.named_parameters())
    missing = sorted(set(arrays) - set(params))
    if missing:
        raise KeyError(f"the rollout worker's policy has no parameters {missing[:3]} (of {len(missing)}): it was "
                       "not built like the trainer's")
    for name, value in arrays.items():
        params[name].set_value(value)


def to_wire(batch: Batch) -> Dict[str, Any]:
    """A Batch as picklable numpy and Python values (for the pipe)."""
    out = dict(vars(batch))
    for name in BATCH_TENSORS:
        if out[name] is not None:
            out[name] = out[name].numpy()
    return out


def from_wire(fields: Dict[str, Any]) -> Batch:
    return Batch(**{k: paddle.to_tensor(v) if k in BATCH_TENSORS and v is not None else v for k, v in fields.items()})


class SyncBatches:
    """The synchronous source: step.collect with the trainer's own policy."""

    def __init__(self, cfg: Any, par: ParallelContext, policy: Policy, encode: PromptEncoder, rewarder: Any,
                 sampler: PromptSampler, records: Any, prompts_per_rank: int, learner: Any,
                 collect: Callable[..., Tuple[Batch, CollectMetrics]]):
        self.args = (par, policy, encode, rewarder, sampler, records, cfg, prompts_per_rank)
        self.learner, self.collect = learner, collect

    def start(self, step: int) -> None:
        pass

    def next(self, step: int) -> Tuple[Batch, CollectMetrics]:
        return self.collect(*self.args, step, self.learner.amp)  # the amp as it is now: tests swap it

    def publish(self, step: int) -> None:
        pass

    def state_dict(self) -> Optional[Dict[str, Any]]:
        return None

    def save(self, directory: str, step: int) -> None:
        pass

    def restore(self, path: str, state: Dict[str, Any], step: int) -> None:
        pass

    def close(self) -> None:
        pass

    def cpu_seconds(self) -> Dict[str, float]:
        return {"trainer": process_cpu_s()}


def _shutdown(held: Dict[str, Any], store: WeightStore) -> None:
    if held.get("worker") is not None:
        held["worker"].close()
        held["worker"] = None
    store.remove()


class AsyncBatches:
    """The asynchronous source: a rollout worker process (rollout/async_worker.py) samples and scores step s + 1's
    prompts while the trainer updates on step s's; the weights reach it once per step (`publish`)."""

    def __init__(self, cfg: Any, par: ParallelContext, policy: Policy, sampler: PromptSampler):
        if par.world_size > 1:
            raise ConfigError(
                f"key 'async_rollout' = True: not with {par.world_size} processes (data, tensor or pipeline "
                "parallelism): the collect phase splits prompts, agrees on dynamic sampling and sums tool metrics "
                "over the ranks' process group, which a rollout worker is not part of; use async_rollout on one "
                "process, or the processes without it")
        self.cfg, self.policy, self.sampler = cfg, policy, sampler
        self.lag, self.base = cfg.rollout_lag, 0
        # Up to lag + 1 versions at once, and the one being written; 1.5x to leave the machine some room.
        size = sum(int(np.prod(p.shape)) * p.element_size() for p in policy.model.parameters() if not p.stop_gradient)
        self.store = WeightStore.private(int(1.5 * (self.lag + 2) * size))
        self.log_path = os.path.join(cfg.output_dir, "rollout_worker.log")
        self.held: Dict[str, Any] = {"worker": None}
        self.next_step: Optional[int] = None
        self.worker_cpu_done = 0.0   # CPU seconds of workers already stopped
        self._finalizer = weakref.finalize(self, _shutdown, self.held, self.store)  # train() not called: at exit

    def version(self, step: int) -> int:
        """The weights (updates applied) step `step`'s samples come from."""
        return max(self.base, step - self.lag)

    @property
    def worker(self) -> Optional[WorkerProcess]:
        return self.held["worker"]

    def _start(self, step: int) -> None:
        self.close()
        if not self.store.has(step):  # the trainer's current weights are step's version
            self.store.publish(step, trainable_arrays(self.policy))
        missing = [v for v in range(self.version(step), step + 1) if not self.store.has(v)]
        if missing:
            raise RuntimeError(f"async_rollout: the weights after steps {missing} are not in {self.store.directory}")
        payload = {"cfg": self.cfg, "step": step, "base": self.base, "lag": self.lag,
                   "sampler": self.sampler.state_dict(), "weights_dir": self.store.directory}
        self.held["worker"] = WorkerProcess(WORKER_ENTRY, payload, self.log_path,
                                            env=worker_env(self.cfg.rollout_worker_threads))
        self.next_step = step
        logger.info("rollout worker: pid %d, rollout_lag %d (weights in %s, log %s)", self.worker.pid, self.lag,
                    self.store.directory, self.log_path)

    def start(self, step: int) -> None:
        """Start the worker from `step` now (the trainer's start-up evaluation then overlaps the worker's)."""
        if self.worker is None or self.next_step != step:
            self._start(step)

    def next(self, step: int) -> Tuple[Batch, CollectMetrics]:
        if self.worker is None or self.next_step != step:
            self._start(step)
        t0 = time.perf_counter()
        kind, got, wire, metrics, sampler_state, version, weights_wait_s = self.worker.recv(
            self.cfg.rollout_worker_timeout_s)
        if got != step:
            raise RuntimeError(f"the rollout worker sent step {got}'s samples where step {step}'s were due")
        self.sampler.set_state_dict(sampler_state)  # the data position after this step (checkpoints save it)
        self.next_step = step + 1
        metrics.overlap = {"perf/wait_for_samples_s": time.perf_counter() - t0,
                           "perf/worker_wait_for_weights_s": weights_wait_s, "rollout/staleness": float(step - version)}
        return from_wire(wire), metrics

    def publish(self, step: int) -> None:
        """After the update that made the weights of `step` (updates applied): write them for the worker, and drop
        the versions no pending step samples from (nor a checkpoint needs)."""
        self.store.publish(step, trainable_arrays(self.policy))
        self.store.prune(self.version(step))

    def state_dict(self) -> Dict[str, Any]:
        return {"base": self.base, "lag": self.lag}

    def save(self, directory: str, step: int) -> None:
        """Into checkpoint `directory` (at `step` updates): the weight versions steps step .. step + lag - 1 sample
        from (the trainer's own, `step`, is the checkpoint's model)."""
        self.store.copy_out(range(self.version(step), step), os.path.join(directory, WEIGHTS_DIR))

    def restore(self, path: str, state: Dict[str, Any], step: int) -> None:
        saved = state.get("rollout") or {}
        directory = os.path.join(path, WEIGHTS_DIR)
        base = saved.get("base", step)
        needed = range(max(base, step - self.lag), step)
        if saved and all(os.path.isfile(os.path.join(directory, f"v{v}.npz")) for v in needed):
            self.store.copy_in(directory, needed)
            self.base = base
            return
        self.base = step
        if step > 0 and self.lag > 0:
            logger.warning("%s holds no rollout weights for rollout_lag %d (saved by a synchronous run or another "
                           "lag): the first %d steps of this run sample from its weights", path, self.lag, self.lag)

    def close(self) -> None:
        worker = self.worker
        if worker is not None:
            self.worker_cpu_done += worker.cpu_s() or 0.0
            worker.close()
            self.held["worker"] = None
        self.next_step = None

    def cpu_seconds(self) -> Dict[str, float]:
        live = self.worker.cpu_s() if self.worker is not None else 0.0
        return {"trainer": process_cpu_s(), "rollout worker": self.worker_cpu_done + (live or 0.0)}


# --------------------------------------------------------------------------------------- the worker process

def build_policy(cfg: Any) -> Tuple[Policy, Optional[Policy], Any, Any]:
    """(policy, reference, tokenizer, amp) built as the trainer builds its own (one process: no tensor-parallel
    shard). `reference`: the frozen reference copy when this worker computes the reference log-probs
    (`cfg.reference_in_rollout_worker`) and the policy is not LoRA (whose reference is the policy with its adapters
    disabled); else None."""
    from ..policy import head_chunk_size, load_policy, load_tokenizer, quiet_paddlenlp
    from ..precision import plan_for_run

    quiet_paddlenlp()
    precision = plan_for_run(cfg, announce=False)
    policy = load_policy(cfg.actor_model_name_or_path, **precision.load_kwargs,
                         head_chunk_size=head_chunk_size(cfg, announce=False))
    if cfg.lora:  # the adapters' values come with the weights; only their shapes and names matter here
        if cfg.lora_path:
            policy.load_adapters(cfg.lora_path)
        else:
            policy.apply_lora(cfg.lora_rank, cfg.lora_alpha_value, cfg.lora_dropout, cfg.target_modules or None,
                              base_model_name_or_path=cfg.actor_model_name_or_path)
    reference = None
    if cfg.reference_in_rollout_worker and not cfg.lora:
        reference = load_policy(cfg.actor_model_name_or_path, trainable=False, **precision.load_kwargs,
                                head_chunk_size=head_chunk_size(cfg, announce=False))
    return policy, reference, load_tokenizer(cfg.actor_model_name_or_path), precision.runtime()


def worker_main(conn: Any, payload: Dict[str, Any]) -> None:
    """The rollout worker (run by rollout/async_worker.py in its own process): from `payload["step"]` on, wait for
    the step's weight version, load it, collect (sample and score) the step's batch and send it with the metrics,
    the data position after it, the version and the seconds waited for the weights."""
    cfg, step, base, lag = payload["cfg"], payload["step"], payload["base"], payload["lag"]
    paddle.seed(cfg.seed)
    np.random.seed(cfg.seed)
    par = ParallelContext()
    policy, reference, tokenizer, amp = build_policy(cfg)
    tools = build_tools(cfg, tokenizer, policy, None)
    try:
        encode = PromptEncoder(policy, tokenizer, cfg.chat_template, cfg.max_prompt_len, tools)
        rewarder = build_rewarder(cfg)
        records = read_jsonl(cfg.train_datasets, prompt_key=cfg.prompt_key, response_key=cfg.response_key)
        gen_prompts = cfg.global_batch_size if cfg.global_gen_batch_size == -1 else cfg.global_gen_batch_size
        sampler = PromptSampler(len(records), gen_prompts, shuffle=cfg.dataloader_shuffle, seed=cfg.seed,
                                drop_last=cfg.dataloader_drop_last)
        sampler.set_state_dict(payload["sampler"])
        prompts_per_rank = cfg.batch_geometry(1).prompts_per_rank
        store = WeightStore(payload["weights_dir"])
        # paddle's first operations install its C-level SIGTERM handler, which exits at once: a SIGTERM (from the
        # trainer, or PR_SET_PDEATHSIG when it dies) must end this process through the `finally`s instead.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        loaded = None
        while not stop_requested(conn):
            version = max(base, step - lag)
            waited = 0.0
            if version != loaded:
                waited = store.wait(version, alive=lambda: not stop_requested(conn))
                load_arrays(policy, store.load(version))
                loaded = version
            batch, metrics = collect(par, policy, encode, rewarder, sampler, records, cfg, prompts_per_rank, step,
                                     amp)
            if cfg.reference_in_rollout_worker:  # the trainer's reference pass, moved here (docs/async.md)
                t0 = time.perf_counter()
                batch.ref_logprobs = reference_logprobs(policy, reference, batch, cfg, None, amp)
                metrics.reference_s = time.perf_counter() - t0
            conn.send(("batch", step, to_wire(batch), metrics, sampler.state_dict(), version, waited))
            step += 1
    finally:
        if tools is not None:
            tools.close()
