"""Orchestration: build the run's parts from the config, then loop over steps (step/), evaluate, save and log.

One `Trainer` serves one process. With several data-parallel processes each samples its share of the prompts; the
phases of step/ gather what the global statistics need (docs/algorithms.md). PPO / VAPO (an estimator that takes
values) add a critic, built and updated by step/critic_update.py.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Dict, Optional

import numpy as np
import paddle

from .run import checkpoint as ckpt
from . import step, summary
from .run import directory as run_dir
from .run import state as run_state
from .algorithms import RunningRewardNormalizer, lr_lambda
from .config import Config, write_config
from .data import PromptSampler, read_json_rows, read_jsonl
from .logging import MetricsLogger
from .run.faults import StepGuard
from .parallel import ParallelContext, build_once, plan_storage
from .policy import (decoder_path, freeze, head_chunk_size, load_policy, load_tokenizer, mix_into,
                     parameters_by_decay, quiet_paddlenlp, resolve_model_dir)
from .precision import plan_for_run
from .step import TrainingError

__all__ = ["PolicyBuilder", "Trainer", "TrainingError", "train"]  # TrainingError: step/'s, caught by callers

logger = logging.getLogger("paddle_grpo.trainer")

PolicyBuilder = Callable[[str], None]


class Trainer:
    """`Trainer(cfg, build_policy)`: `build_policy(directory)` makes a missing policy when `build_actor_if_missing`
    names a recipe (run_rl.py passes `paddle_grpo.recipes.policy_builder(cfg)`; the core never imports recipes)."""

    def __init__(self, cfg: Config, build_policy: Optional[PolicyBuilder] = None):
        self.cfg = cfg
        # Before anything slow: an output_dir holding a run is resumed, replaced (overwrite_output_dir) or refused.
        self.run_dir = run_dir.plan(cfg.output_dir, cfg.resume_from_checkpoint, cfg.overwrite_output_dir,
                                    config_text=cfg.format())
        if cfg.build_actor_if_missing and not os.path.isdir(cfg.actor_model_name_or_path):
            if build_policy is None:
                raise FileNotFoundError(f"actor_model_name_or_path {cfg.actor_model_name_or_path} does not exist and "
                                        f"no builder for build_actor_if_missing: {cfg.build_actor_if_missing} was "
                                        "given (run_rl.py passes paddle_grpo.recipes.policy_builder(cfg))")
            # Before the process groups form: a build (a minute) outlasts gloo's 30 s collective timeout.
            build_once(cfg.actor_model_name_or_path, build_policy, f"the '{cfg.build_actor_if_missing}' recipe")
        resolve_model_dir(cfg.actor_model_name_or_path)  # hub ID: cache or download; a miss fails here, early
        self.par = par = ParallelContext.from_config(cfg)
        self.storage = plan_storage(par, cfg.output_dir, cfg.save_on_each_node)  # shared output_dir or each node
        self.run_dir = run_dir.agree(par, self.run_dir, cfg.output_dir, cfg.resume_from_checkpoint)
        self.precision = plan_for_run(cfg, announce=par.is_main)  # logs `precision: ...` (docs/precision.md)
        self.geometry = cfg.batch_geometry(par.world_size)
        if self.run_dir.reason and par.is_main:
            logger.info(self.run_dir.reason)
        paddle.seed(cfg.seed + par.dp_rank)
        np.random.seed(cfg.seed + par.dp_rank)

        quiet_paddlenlp()
        self.tokenizer = load_tokenizer(cfg.actor_model_name_or_path)
        load = {**par.model_load_kwargs(), **self.precision.load_kwargs,  # TP shard; dtype and kernels (if not default)
                "head_chunk_size": head_chunk_size(cfg, announce=par.is_main)}  # chunked LM head (unset: by vocab)
        self.policy = load_policy(cfg.actor_model_name_or_path, recompute=cfg.recompute, **load,
                                  recompute_granularity=cfg.recompute_granularity,
                                  recompute_use_reentrant=cfg.recompute_use_reentrant)
        if cfg.lora:  # the reference is then the policy with its adapters disabled (step.reference_logprobs)
            if cfg.lora_path:
                self.policy.load_adapters(cfg.lora_path)
            else:
                self.policy.apply_lora(cfg.lora_rank, cfg.lora_alpha_value, cfg.lora_dropout,
                                       cfg.target_modules or None, base_model_name_or_path=cfg.actor_model_name_or_path)
        if par.is_main and not self.policy.is_encoder_decoder:  # after LoRA, which changes the path
            for line in decoder_path(self.policy.model, cfg.rollout_precision).splitlines():  # + the engine's
                logger.info(line)
        self.reference = None
        # (With async_rollout the rollout worker may compute the reference log-probs: no copy here.)
        if cfg.needs_reference_model and not cfg.lora and not cfg.reference_in_rollout_worker:
            self.reference = load_policy(cfg.actor_model_name_or_path, trainable=False, **load)
        self.teacher = step.load_teacher(cfg, self.policy, load)  # on-policy distillation's (None: off)
        # Pipeline parallel: the policy stays whole and frozen (generation, old/reference log-probs, checkpoints);
        # the pipeline trains this rank's stage and copies the weights back after each update.
        pipeline = None
        if par.pp_world > 1:
            if self.policy.is_encoder_decoder:
                raise NotImplementedError("pipeline_parallel_degree > 1 supports decoder-only policies only")
            pipeline = par.pipeline(self.policy.model, cfg.virtual_pp_degree)
            freeze(self.policy.model)

        read = lambda path: read_jsonl(path, prompt_key=cfg.prompt_key, response_key=cfg.response_key)  # noqa: E731
        self.train_records = read(cfg.train_datasets)
        self.eval_records = read(cfg.eval_datasets) if cfg.do_eval and cfg.eval_datasets else []
        gen_prompts = cfg.global_batch_size if cfg.global_gen_batch_size == -1 else cfg.global_gen_batch_size
        self.sampler = PromptSampler(len(self.train_records), gen_prompts, shuffle=cfg.dataloader_shuffle,
                                     seed=cfg.seed, drop_last=cfg.dataloader_drop_last)
        self.max_steps = cfg.max_steps if cfg.max_steps > 0 else max(1, int(cfg.num_train_epochs * len(self.sampler)))
        self.tools = step.build_tools(cfg, self.tokenizer, self.policy, par)  # None: single-turn; train() closes
        self.encode = step.PromptEncoder(self.policy, self.tokenizer, cfg.chat_template, cfg.max_prompt_len, self.tools)
        self.rewarder = step.build_rewarder(cfg)  # also the evaluation's (and the rollout worker builds its own)
        self.normalizer = RunningRewardNormalizer() if cfg.reward_normalization else None

        total_opt_steps = self.max_steps * self.geometry.optimizer_steps_per_step
        # The policy is stepped only after the value pretraining (critic_pretrain_steps): its schedule spans the
        # steps that update it, so warm-up and decay run in full and the last step reaches min_learning_rate.
        policy_opt_steps = cfg.policy_optimizer_steps(self.max_steps, self.geometry.optimizer_steps_per_step)
        warmup = cfg.warmup_steps or int(cfg.warmup_ratio * policy_opt_steps)
        scheduler = paddle.optimizer.lr.LambdaDecay(cfg.learning_rate, lr_lambda(cfg.lr_scheduler_type, warmup,
                                                                                 policy_opt_steps, cfg.min_lr_ratio))
        trained = pipeline.layers if pipeline is not None else self.policy.model
        decay = parameters_by_decay(trained)
        optimizer = par.wrap_optimizer(self.precision.decorate(trained, paddle.optimizer.AdamW(
            learning_rate=scheduler,
            parameters=self.policy.trainable_parameters() if cfg.lora else trained.parameters(),
            weight_decay=cfg.weight_decay, beta1=cfg.adam_beta1, beta2=cfg.adam_beta2, epsilon=cfg.adam_epsilon,
            apply_decay_param_fun=lambda name: name in decay)))  # clipping: step.clip_gradients (TP-aware norm)
        self.learner = step.Learner(self.policy, pipeline, optimizer, scheduler, amp=self.precision.runtime())
        self.critic_learner = step.build_critic_learner(cfg, par, self.precision, load, total_opt_steps,
                                                        self.policy.is_encoder_decoder)  # None: no critic
        # VAPO's positive examples: the rewards that count as correct (None: the loss is off).
        self.positive_min_reward = step.positive_threshold(cfg, self.rewarder)  # None: the loss is off
        # The step's batches: the trainer's own collect, or the rollout worker's (async_rollout, docs/async.md).
        # step.collect is looked up at each call: tools and tests wrap it after the trainer is built
        # (tools/gpu_check.py replays batches).
        self.batches = step.batch_source(cfg, par, self.policy, self.encode, self.rewarder, self.sampler,
                                         self.train_records, self.geometry.prompts_per_rank, self.learner,
                                         lambda *args: step.collect(*args))
        self.step, self.unlogged = 0, None
        self.guard = StepGuard(self)  # the state at each step's start, signals, saving on a fault (run/faults.py)
        if par.is_main:
            run_dir.apply(self.run_dir, cfg.output_dir)
            write_config(cfg, os.path.join(cfg.output_dir, "config.yaml"))
        if self.run_dir.resume:
            run_state.restore(self, self.run_dir.resume)
        self.steps_at_start = self.step
        self.last_checkpoint = ckpt.latest_checkpoint(cfg.output_dir)
        finished = self.step >= self.max_steps  # a finished run resumed: no bar for the steps it will not take
        self.log = MetricsLogger(cfg.output_dir, cfg.logging_dir, cfg.report_to, cfg.run_name,
                                 cfg.disable_tqdm or finished, total_steps=self.max_steps, initial_step=self.step,
                                 enabled=par.is_main)
        self.evaluator = step.Evaluator(cfg, par, self.policy, self.encode, self.rewarder, self.eval_records,
                                        self.log, self.tools)

    # -------------------------------------------------------------------------------------------- the step

    def train_step(self) -> Dict[str, float]:
        """One step of step/'s phases; returns its metrics (docs/algorithms.md section 7). The step's batch is
        kept as `self.batch`."""
        cfg, par, geo, amp = self.cfg, self.par, self.geometry, self.learner.amp  # amp: step.model_precision
        t_start = time.perf_counter()
        batch, collected = self.batches.next(self.step)
        batch = par.from_first_stage(batch)  # pipeline stages train on the first stage's batch
        batch = step.balance(par, batch, cfg, geo.sequences_per_mini_batch, self.tokenizer.pad_token_id)

        t0 = time.perf_counter()
        ref_lp = step.reference_logprobs(self.policy, self.reference, batch, cfg, par.vocab_parallel, amp)
        if batch.ref_logprobs is not None:  # the rollout worker's pass (async_rollout), overlapping the trainer's
            reference_s = collected.reference_s
        else:
            reference_s = time.perf_counter() - t0 if ref_lp is not None else 0.0
        # None where the loss reads none: on-policy, or with clip (verl's bypass mode; step.old_logprobs)
        old_lp = step.old_logprobs(self.policy, batch, cfg, geo, par.vocab_parallel, amp)
        logprob_s = time.perf_counter() - t0
        critic, t0 = self.critic_learner, time.perf_counter()
        values = step.values(critic.critic, batch, cfg, critic.amp) if critic is not None else None
        critic_metrics = {"perf/value_s": time.perf_counter() - t0} if critic is not None else {}

        # The reward's KL: the sampler's log-probs, whatever the mini-batching (step.reward_kl_logprobs)
        rows = step.gather(par, batch, step.reward_kl_logprobs(batch, ref_lp, cfg), ref_lp, values)
        rewards, reward_metrics = step.shape_rewards(rows, cfg, self.normalizer)
        estimate = step.estimate_advantages(rows, rewards, cfg)
        inputs, critic_inputs = step.update_inputs(rows, estimate, batch, old_lp, ref_lp, values, cfg,
                                                   self.positive_min_reward)
        metrics = {**collected.as_dict(), **reward_metrics.as_dict(), "perf/logprob_s": logprob_s,
                   "perf/reference_s": reference_s, **estimate.metrics.as_dict(), **critic_metrics,
                   **(estimate.value_metrics.as_dict() if critic is not None else {})}
        if ref_lp is not None:
            metrics["train/kl"] = step.reference_kl(par, batch, ref_lp)
        if self.teacher is not None:  # the advantages take the teacher's per-token reverse KL
            metrics.update(step.distill(par, self.teacher, batch, inputs, cfg, par.vocab_parallel, amp))

        t0 = time.perf_counter()
        if critic is None or self.step >= cfg.critic_pretrain_steps:  # VAPO's value pretraining: critic only first
            metrics.update(step.update(par, self.learner, inputs, cfg, geo, self.step, par.vocab_parallel).as_dict())
        if critic is not None:
            metrics.update(step.update_critic(critic, critic_inputs, cfg, geo, self.step).as_dict())
        metrics["perf/update_s"] = time.perf_counter() - t0
        metrics.update(step.LengthMetrics.of(rows).as_dict())
        metrics["train/lr"] = float(self.learner.optimizer.get_lr())
        metrics["perf/step_s"] = time.perf_counter() - t_start
        metrics["perf/completion_tokens_per_s"] = float(rows.lengths.sum()) / max(collected.rollout_s, 1e-9)
        self.step += 1
        self.batches.publish(self.step)  # async_rollout: the weights after this update, for the rollout worker
        self.batch = batch
        if self.reference is not None and cfg.sync_ref_model and self.step % cfg.ref_model_sync_steps == 0:
            mix_into(self.reference.model, self.policy.model, cfg.ref_model_mixup_alpha)
        return metrics

    # ------------------------------------------------------------------------------------------ evaluation

    def evaluate(self) -> Dict[str, float]:
        """The held-out evaluation at the current step (step.Evaluator: eval/reward, eval/accuracy, with
        eval_num_samples > 1 eval/pass@k, mean@n, maj@n; eval_per_problem.jsonl)."""
        return self.evaluator(self.step, final=self.step == self.max_steps, amp=self.learner.amp)

    # ------------------------------------------------------------------------------------------ checkpoints

    def save(self, unlogged: Optional[Dict[str, Any]] = None, solo: bool = False) -> None:
        """Write checkpoint-<step> (run_state.save: every rank calls it; `solo`: rank 0 alone after a fault)."""
        run_state.save(self, unlogged=unlogged, solo=solo)

    # ------------------------------------------------------------------------------------------- main loop

    def _evaluating(self) -> bool:
        return self.cfg.do_eval and self.cfg.evaluation_strategy == "steps" and bool(self.eval_records)

    def _finish_step(self, metrics: Dict[str, Any], samples: Optional[list]) -> None:
        """Evaluate when due, then write the step's metrics line and its samples (rank 0)."""
        if self._evaluating() and (self.step % self.cfg.eval_steps == 0 or self.step == self.max_steps):
            metrics.update(self.evaluate())
        self.log.log(self.step, metrics)
        self.log.advance(self.step, metrics)
        if samples is not None:
            self.log.log_samples(self.step, samples)
        self.guard.logged()

    def train(self) -> Dict[str, float]:
        """Run to max_steps; returns the last step's metrics. Ctrl-C, SIGTERM and errors save the last consistent
        state before the exception goes on (run/faults.py); an error gets a note saying what was saved."""
        cfg, guard = self.cfg, self.guard
        metrics: Dict[str, float] = {}
        if self.step >= self.max_steps and self.unlogged is None:  # a finished run: re-running must not re-save
            if self.par.is_main:
                logger.info("%s already holds this run up to step %d (max_steps %d): nothing to train; set "
                            "overwrite_output_dir: true to train again from scratch", cfg.output_dir, self.step,
                            self.max_steps)
            self.log.close()
            self.par.barrier()  # ranks leave together: rank 0 (the TCP store's host) aborted leaving first (exit -6)
            return metrics
        previous = guard.install()
        try:
            self.batches.start(self.step)  # async_rollout: the worker starts (about 5 s) while the trainer evaluates
            if self.unlogged is not None:
                guard.phase, guard.unlogged = "finish", self.unlogged
                self._finish_step(dict(self.unlogged["metrics"]), self.unlogged["samples"])
                self.unlogged = None
                guard.save()  # the same step again, without the metrics it no longer lacks
            elif self.step == 0 and self._evaluating():
                self.log.log(0, self.evaluate())
            while self.step < self.max_steps:
                guard.begin()
                metrics = self.train_step()
                due = self.step % cfg.logging_steps == 0
                guard.stepped(metrics, self.batch.sample_rows(self.train_records) if due else None)
                self._finish_step(metrics, guard.unlogged["samples"] if guard.unlogged else None)
                if cfg.save_strategy == "steps" and self.step % cfg.save_steps == 0 and self.step < self.max_steps:
                    guard.save()
                guard.raise_deferred()
            if cfg.save_strategy == "steps" and os.path.basename(self.last_checkpoint or "") != \
                    f"checkpoint-{self.step}":  # the last step's (unless save_steps just wrote it)
                guard.save()
        except BaseException as caught:
            error = guard.as_interrupt(caught)
            try:
                note = guard.on_fault(error)
            except Exception as failure:  # noqa: BLE001 - the original error is the one to report
                note = f"the fault handling failed too ({type(failure).__name__}: {failure}); nothing saved"
                logger.exception("saving after %s failed", type(error).__name__)
            if not isinstance(error, KeyboardInterrupt):  # run_rl.py prints __notes__ (add_note is 3.11+)
                said = f"{type(error).__name__} at step {self.step}: {note}"
                error.__notes__ = [*getattr(error, "__notes__", ()), said]
            if error is caught:
                raise
            raise error from caught
        finally:
            guard.uninstall(previous)
            self.batches.close()  # the rollout worker, if any: stopped (nothing left running)
            self.log.close()
            if self.tools is not None:  # the tool-call pool (step.build_tools)
                self.tools.close()
        return metrics


def train(cfg: Config, build_policy: Optional[PolicyBuilder] = None) -> int:
    """Entry point used by run_rl.py: build the trainer and run it; returns a process exit status."""
    t0 = time.time()
    trainer = Trainer(cfg, build_policy)
    main = trainer.par.is_main
    if main:
        logger.info("%d training prompts, %d eval prompts, %d steps; batch geometry %s",
                    len(trainer.train_records), len(trainer.eval_records), trainer.max_steps, trainer.geometry)
    try:
        trainer.train()
    except KeyboardInterrupt:
        return 130
    if main:
        s = summary.run_summary(read_json_rows(os.path.join(cfg.output_dir, "metrics.jsonl")),
                                output_dir=cfg.output_dir,
                                logging_dir=cfg.logging_dir if cfg.report_to != "none" else "",
                                checkpoint=trainer.last_checkpoint, wall_s=time.time() - t0,
                                steps_this_run=trainer.step - trainer.steps_at_start, last_step=trainer.step,
                                cpu_s=trainer.batches.cpu_seconds())
        if s["steps_this_run"] > 0:  # re-running a finished run keeps the summary of the run that trained
            summary.write_summary(s, cfg.output_dir)
        print(summary.format_summary(s), end="", flush=True)
    return 0
