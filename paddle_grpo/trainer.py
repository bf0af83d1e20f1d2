"""The RL step: rollout -> rewards -> log-probs -> advantages -> mini-batch updates; evaluation; checkpoints.

One `Trainer` serves one process; with several data-parallel processes each samples its share of the prompts and
the per-sequence data (rewards, lengths, masks) is gathered so that group statistics, reward normalisation,
REINFORCE++ whitening and the `token-mean` denominators are computed over the global batch (ALGORITHMS.md).
What it deliberately leaves out: reward *models* (rewards come from functions or a reward server) and a critic.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import time

import numpy as np
import paddle

from . import checkpoint as ckpt
from . import run_dir, summary
from .parallel import ParallelContext, build_once_per_node
from .policy import seq2seq
from .algorithms import (
    RunningRewardNormalizer,
    aggregate_loss,
    clip_reward,
    compute_policy_loss,
    get_advantage_estimator,
    global_denominators,
    kl_penalty,
    masked_mean,
    normalize_advantage,
    overlong_penalty,
    scalar_to_token_level,
)
from .data import (PromptSampler, apply_chat_template, collate_prompts, read_json_rows, read_jsonl,
                   tokenize_prompts)
from .experience import merge_groups, sample_rows, split_groups
from .config import write_config
from .logging import MetricsLogger
from .policy.lora import adapters_disabled, apply_lora, load_adapters, trainable_parameters
from .policy.causal import (
    completion_logprobs,
    freeze,
    load_causal_lm,
    load_tokenizer,
    logprobs_from_completion_logits,
    mix_into,
    parameters_by_decay,
    position_ids_from_mask,
    quiet_paddlenlp,
)
from .rewards.client import make_rewarder
from .rollout import generate
from .sampling import row_keys

logger = logging.getLogger("paddle_grpo.trainer")


class TrainingError(RuntimeError):
    """The run cannot go on (for example too many non-finite updates in a row)."""


def lr_lambda(kind, warmup, total):
    """Multiplier of the peak learning rate at optimizer step s: linear warm-up, then constant/linear/cosine."""
    def f(s):
        if warmup > 0 and s < warmup:
            return (s + 1) / warmup
        if kind in ("constant", "constant_with_warmup"):
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        if kind == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine
    return f


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        # Before anything slow: an output_dir holding a run is resumed, replaced (overwrite_output_dir) or refused.
        self.run_dir = run_dir.plan(cfg.output_dir, cfg.resume_from_checkpoint, cfg.overwrite_output_dir)
        if cfg.build_actor_if_missing and not os.path.isdir(cfg.actor_model_name_or_path):
            _build_actor(cfg)                # before the process groups form: no collective waits for a build
        self.par = ParallelContext.from_config(cfg)
        self.world = self.par.dp_world       # data-parallel ranks: each samples different prompts
        self.rank = self.par.dp_rank
        self.geometry = cfg.batch_geometry(self.par.world_size)
        if self.run_dir.reason and self.par.is_main:
            logger.info(self.run_dir.reason)
        paddle.seed(cfg.seed + self.rank)
        np.random.seed(cfg.seed + self.rank)

        quiet_paddlenlp()
        self.tokenizer = load_tokenizer(cfg.actor_model_name_or_path)
        self.eos_ids = sorted({self.tokenizer.eos_token_id})
        shard = self.par.model_load_kwargs()
        # An encoder-decoder policy (its config says is_encoder_decoder) is loaded, sampled and scored by seq2seq.py.
        enc_dec = seq2seq.is_encoder_decoder(cfg.actor_model_name_or_path)
        load = seq2seq.load_seq2seq_lm if enc_dec else load_causal_lm
        self._generate = seq2seq.generate if enc_dec else generate
        self._completion_logprobs = seq2seq.completion_logprobs if enc_dec else completion_logprobs
        self._encoder_decoder = enc_dec
        self.model = load(cfg.actor_model_name_or_path, recompute=cfg.recompute, **shard)
        if cfg.lora:  # the reference is then self.model with its adapters disabled (_reference_logprobs)
            self.model = load_adapters(self.model, cfg.lora_path) if cfg.lora_path else apply_lora(
                self.model, cfg.lora_rank, cfg.lora_alpha_value, cfg.lora_dropout, cfg.target_modules or None,
                base_model_name_or_path=cfg.actor_model_name_or_path)
        self.reference = None
        if cfg.needs_reference_model and not cfg.lora:
            self.reference = load(cfg.actor_model_name_or_path, trainable=False, **shard)
        self.vocab_parallel = self.par.vocab_parallel
        # Pipeline parallel: self.model stays the full policy, frozen (generation, old/reference log-probs,
        # checkpoints); self.pipeline trains this rank's stage and copies the weights back after each update.
        self.pipeline = None
        if self.par.pp_world > 1:
            if enc_dec:
                raise NotImplementedError("pipeline_parallel_degree > 1 supports decoder-only policies only")
            self.pipeline = self.par.pipeline(self.model, cfg.virtual_pp_degree)
            freeze(self.model)

        self.train_records = read_jsonl(cfg.train_datasets, prompt_key=cfg.prompt_key,
                                        response_key=cfg.response_key)
        self.eval_records = (read_jsonl(cfg.eval_datasets, prompt_key=cfg.prompt_key, response_key=cfg.response_key)
                             if cfg.do_eval and cfg.eval_datasets else [])
        gen_prompts = cfg.global_batch_size if cfg.global_gen_batch_size == -1 else cfg.global_gen_batch_size
        self.sampler = PromptSampler(len(self.train_records), gen_prompts, shuffle=cfg.dataloader_shuffle,
                                     seed=cfg.seed, drop_last=cfg.dataloader_drop_last)
        self.max_steps = cfg.max_steps if cfg.max_steps > 0 else max(
            1, int(cfg.num_train_epochs * len(self.sampler)))
        self._token_cache = {}

        self.rewarder = make_rewarder(cfg.use_rm_server, reward_server=cfg.reward_server,
                                      reward_funcs=cfg.reward_funcs, reward_weights=cfg.reward_weights,
                                      token=cfg.reward_server_token or None, read_timeout=cfg.reward_server_timeout,
                                      max_retries=cfg.reward_server_max_retries) \
            if cfg.use_rm_server else make_rewarder(False, reward_funcs=cfg.reward_funcs,
                                                    reward_weights=cfg.reward_weights)
        self.estimator = get_advantage_estimator(cfg.rl_algorithm)
        self.normalizer = RunningRewardNormalizer() if cfg.normalize_reward else None

        total_opt_steps = self.max_steps * self.geometry.optimizer_steps_per_step
        warmup = cfg.warmup_steps or int(cfg.warmup_ratio * total_opt_steps)
        self.scheduler = paddle.optimizer.lr.LambdaDecay(cfg.learning_rate,
                                                         lr_lambda(cfg.lr_scheduler_type, warmup, total_opt_steps))
        trained = self.pipeline.layers if self.pipeline is not None else self.model
        decay = parameters_by_decay(trained)
        self.optimizer = self.par.wrap_optimizer(paddle.optimizer.AdamW(
            learning_rate=self.scheduler,
            parameters=trainable_parameters(self.model) if cfg.lora else trained.parameters(),
            weight_decay=cfg.weight_decay,
            beta1=cfg.adam_beta1, beta2=cfg.adam_beta2, epsilon=cfg.adam_epsilon,
            apply_decay_param_fun=lambda name: name in decay))  # clipping: _clip_gradients (TP-aware norm)

        self.step = 0
        self.nonfinite_in_a_row = 0
        self.nonfinite_total = 0
        self.optimizer_steps = 0
        if self.par.is_main:
            run_dir.apply(self.run_dir, cfg.output_dir)
            write_config(cfg, os.path.join(cfg.output_dir, "config.yaml"))
        if self.run_dir.resume:
            self._resume(self.run_dir.resume)
        self.steps_at_start = self.step
        self.last_checkpoint = ckpt.latest_checkpoint(cfg.output_dir)
        finished = self.step >= self.max_steps  # a finished run resumed: no bar for the steps it will not take
        self.log = MetricsLogger(cfg.output_dir, cfg.logging_dir, cfg.report_to, cfg.run_name,
                                 cfg.disable_tqdm or finished, total_steps=self.max_steps, initial_step=self.step,
                                 enabled=self.par.is_main)

    # ------------------------------------------------------------------------------------------------ data

    def _encode(self, records, indices):
        """Left-padded prompt ids [B, L] and mask for the given dataset rows (tokenisation cached per row)."""
        token_lists = []
        for i in indices:
            key = (id(records), i)
            if key not in self._token_cache:
                text = apply_chat_template(records[i]["src"], self.tokenizer, mode=self.cfg.chat_template)
                ids = tokenize_prompts(self.tokenizer, [text])[0]
                self._token_cache[key] = seq2seq.encoder_input_ids(self.tokenizer, ids) if self._encoder_decoder \
                    else ids
            token_lists.append(self._token_cache[key])
        collated = collate_prompts(token_lists, self.tokenizer.pad_token_id, self.cfg.max_prompt_len)
        return collated[0], collated[1]

    def _responses(self, rollout):
        """Completion texts without the EOS token (what reward functions and the server see)."""
        ids = rollout.completion_ids.numpy()
        texts = []
        for row, n, cut in zip(ids, rollout.lengths, rollout.truncated):
            keep = row[:n] if cut else row[:max(0, n - 1)]
            # clean_up_tokenization_spaces would rewrite the text (" ..." -> "..."); rewards see it verbatim.
            texts.append(self.tokenizer.decode(keep.tolist(), skip_special_tokens=False,
                                               clean_up_tokenization_spaces=False))
        return texts

    def _score(self, records, indices, rollout, texts, G):
        """Rewards for this rank's rows; under tensor or pipeline parallelism one request per group, shared."""
        return self.par.share_within_model_parallel_group(lambda: self._request_rewards(records, indices, rollout,
                                                                                    texts, G))

    def _request_rewards(self, records, indices, rollout, texts, G):
        rows = [records[i] for i in indices for _ in range(G)]
        extra = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("src", "tgt")} if rows else {}
        if self.cfg.use_rm_server:
            result = self.rewarder.score_detailed([r["src"] for r in rows], [r.get("tgt") or "" for r in rows],
                                                  texts)
        else:
            ids = rollout.completion_ids.numpy()
            extra["completion_ids"] = [ids[j, :rollout.lengths[j]].tolist() for j in range(len(rows))]
            result = self.rewarder.score_detailed([r["src"] for r in rows], [r.get("tgt") for r in rows], texts,
                                                  **extra)
        return result

    # ---------------------------------------------------------------------------------------------- rollout

    def _rollout_round(self, indices, G, do_sample=True, records=None, row_keys=None):
        cfg = self.cfg
        records = self.train_records if records is None else records
        prompt_ids, prompt_mask = self._encode(records, indices)
        rollout = self._generate(self.model, prompt_ids, prompt_mask, num_samples=G,
                                 max_new_tokens=cfg.max_dec_len, min_new_tokens=cfg.min_dec_len,
                                 eos_token_ids=self.eos_ids, pad_token_id=self.tokenizer.pad_token_id,
                                 temperature=cfg.temperature, top_p=cfg.top_p,
                                 repetition_penalty=cfg.repetition_penalty, do_sample=do_sample,
                                 max_num_seqs=cfg.rollout_max_num_seqs, row_keys=row_keys)
        return rollout

    def _collect(self, metrics):
        """Sample the step's prompts (with DAPO dynamic sampling: more rounds until enough groups have reward
        variance) and score them. Returns (rollout, per-rank rewards info) for this rank's rows."""
        cfg, G, geo = self.cfg, self.cfg.rollout_n, self.geometry
        kept, dropped, rounds = [], 0, 0
        t_roll = t_rew = 0.0
        while True:
            rounds += 1
            global_indices = self.sampler.next_batch()
            positions = self.par.prompt_positions(len(global_indices), cfg.mini_batch_prompts)
            mine = [global_indices[p] for p in positions]
            # Sampling noise keyed by (seed, step, round, global row): the same samples on 1 or N ranks.
            rows = (np.asarray(positions)[:, None] * G + np.arange(G)[None, :]).reshape(-1)
            keys = row_keys(cfg.seed, self.step * 1000 + rounds, rows)
            t0 = time.perf_counter()
            rollout = self._rollout_round(mine, G, row_keys=keys)
            t1 = time.perf_counter()
            texts = self._responses(rollout)
            result = self._score(self.train_records, mine, rollout, texts, G)
            t_rew += time.perf_counter() - t1
            t_roll += t1 - t0
            groups = split_groups(mine, rollout, texts, result, G)
            if not cfg.dynamic_sampling:
                kept = groups
                break
            informative = [g for g in groups if g["informative"]]
            dropped += len(groups) - len(informative)
            kept.extend(informative)
            # every rank must agree whether to continue: count kept groups globally
            enough = min(self.par.all_gather_object(len(kept))) >= geo.prompts_per_rank
            if enough or rounds >= cfg.max_gen_batches:
                if not enough:  # fill with the zero-variance groups of the last round (their advantage is 0)
                    kept.extend(g for g in groups if not g["informative"])
                break
        kept = kept[:geo.prompts_per_rank]
        metrics["perf/rollout_s"] = t_roll
        metrics["perf/reward_s"] = t_rew
        if cfg.dynamic_sampling:
            metrics["train/dynamic_sampling_dropped_groups"] = float(sum(self.par.all_gather_object(dropped)))
            metrics["train/dynamic_sampling_rounds"] = float(rounds)
        return merge_groups(kept, self.tokenizer.pad_token_id)

    # --------------------------------------------------------------------------------------------- log-probs

    @paddle.no_grad()
    def _logprobs(self, model, b, with_entropy=False):
        """In eval mode (no dropout: lora_dropout), as the rollout that sampled the completions."""
        out, ent = [], []
        n, mb = b["completion_ids"].shape[0], self.cfg.per_device_logprob_batch_size
        was_training = model.training
        model.eval()
        try:
            for s in range(0, n, mb):
                lp, e = self._completion_logprobs(model, b["prompt_ids"][s:s + mb], b["prompt_mask"][s:s + mb],
                                                  b["completion_ids"][s:s + mb], b["completion_mask"][s:s + mb],
                                                  temperature=self.cfg.temperature, with_entropy=with_entropy,
                                                  vocab_parallel=self.vocab_parallel)
                out.append(lp)
                ent.append(e)
        finally:
            if was_training:
                model.train()
        return paddle.concat(out, 0), (paddle.concat(ent, 0) if with_entropy else None)

    def _reference_logprobs(self, b):
        """Log-probs under the reference model: the frozen copy, or under LoRA the policy with its adapters
        disabled (the base model, exactly); None when no KL term needs them."""
        if self.reference is not None:
            return self._logprobs(self.reference, b)[0]
        if self.cfg.lora and self.cfg.needs_reference_model:
            with adapters_disabled(self.model):
                return self._logprobs(self.model, b)[0]
        return None

    # ------------------------------------------------------------------------------------------- advantages

    def _shape_rewards(self, local, metrics):
        """Global rewards after combination, None handling, clipping, overlong shaping and normalisation."""
        cfg = self.cfg
        gathered = self.par.all_gather_object({k: local[k] for k in ("rewards", "valid", "lengths", "by_function")})
        rewards = np.concatenate([g["rewards"] for g in gathered]).astype(np.float64)
        valid = np.concatenate([g["valid"] for g in gathered])
        lengths = np.concatenate([g["lengths"] for g in gathered])
        metrics["train/reward"] = float(rewards[valid].mean()) if valid.any() else 0.0
        metrics["train/reward_std"] = float(rewards[valid].std(ddof=1)) if valid.sum() > 1 else 0.0
        metrics["train/reward_none_frac"] = float(1.0 - valid.mean())
        # Per function only with several: a single function's mean would repeat train/reward under another tag.
        names = list(gathered[0]["by_function"]) if len(gathered[0]["by_function"]) > 1 else []
        for name in names:
            vals = [v for g in gathered for v in g["by_function"][name] if v is not None]
            if vals:
                metrics[f"train/reward/{name}"] = float(np.mean(vals))
        if cfg.clip_range_score > 0:
            rewards = clip_reward(rewards, cfg.clip_range_score)
        if cfg.enable_overlong_reward_buffer:
            rewards = rewards + np.asarray(overlong_penalty(lengths, cfg.max_dec_len, cfg.overlong_reward_buffer,
                                                            cfg.overlong_penalty_factor), dtype=np.float64)
        if self.normalizer is not None and valid.any():
            self.normalizer.update(rewards[valid])
            rewards = np.asarray(self.normalizer.normalize(rewards), dtype=np.float64)
        rewards = np.where(valid, rewards, 0.0)
        return rewards.astype(np.float32), valid

    def _advantages(self, b, rewards, valid, old_for_reward, ref_lp, metrics):
        """Advantages of the global batch (gathered), returned for this rank's rows. [n_local, T_local]."""
        cfg, G = self.cfg, self.cfg.rollout_n
        mask = b["completion_mask"]
        local = {"mask": mask.numpy()}
        if old_for_reward is not None:
            local["old"] = old_for_reward.numpy()
            local["ref"] = ref_lp.numpy()
        gathered = self.par.all_gather_object(local)
        T = max(g["mask"].shape[1] for g in gathered)
        pad = lambda a: np.pad(a, ((0, 0), (0, T - a.shape[1])))  # noqa: E731
        g_mask = np.concatenate([pad(g["mask"]) for g in gathered]) * valid[:, None]
        index = np.repeat(np.arange(len(rewards) // G), G)
        options = {}
        seq_rewards = rewards.copy()
        if old_for_reward is not None:
            old = np.concatenate([pad(g["old"]) for g in gathered])
            ref = np.concatenate([pad(g["ref"]) for g in gathered])
            if cfg.rl_algorithm.startswith("reinforce_plus_plus"):
                options = dict(kl_coeff=cfg.kl_coeff, old_log_probs=paddle.to_tensor(old),
                               ref_log_probs=paddle.to_tensor(ref), kl_estimator=cfg.kl_estimator)
            else:
                # Sequence-level form of the KL-shaped reward for group estimators: R - kl_coeff * sum_t KL_t.
                kl = kl_penalty(paddle.to_tensor(old), paddle.to_tensor(ref), cfg.kl_estimator).numpy()
                seq_rewards = rewards - cfg.kl_coeff * (kl * g_mask).sum(-1)
        if cfg.rl_algorithm == "grpo":
            options["norm_adv_by_std"] = cfg.norm_adv_by_std
        g_mask_t = paddle.to_tensor(g_mask.astype(np.float32))
        token_rewards = scalar_to_token_level(paddle.to_tensor(seq_rewards.astype(np.float32)), g_mask_t)
        adv, _ = self.estimator(token_rewards, g_mask_t, index, **options)
        if cfg.normalize_advantage:
            adv = normalize_advantage(adv, g_mask_t)
        adv_np = adv.numpy()
        m = g_mask.astype(bool)
        metrics["train/advantage_mean"] = float(adv_np[m].mean()) if m.any() else 0.0
        metrics["train/advantage_std"] = float(adv_np[m].std()) if m.any() else 0.0
        grouped = rewards.reshape(-1, G)
        metrics["train/frac_reward_zero_std"] = float((grouped.std(axis=1) < 1e-6).mean())
        start = self.rank * mask.shape[0]
        return paddle.to_tensor(adv_np[start:start + mask.shape[0], :mask.shape[1]])

    # -------------------------------------------------------------------------------------------- the step

    def train_step(self):
        cfg, geo = self.cfg, self.geometry
        metrics = {}
        t_start = time.perf_counter()
        b = self.par.from_first_stage(self._collect(metrics))
        rewards, valid = self._shape_rewards(b, metrics)

        t0 = time.perf_counter()
        on_policy = geo.optimizer_steps_per_step == 1
        ref_lp = self._reference_logprobs(b)
        old_lp = None if on_policy else self._logprobs(self.model, b)[0]
        # The reward's KL uses the sampling policy's log-probs: recomputed when off-policy, else the rollout's own
        # (equal to a recomputation up to float rounding, and free).
        old_for_reward = None
        if cfg.kl_coeff > 0 and ref_lp is not None:
            old_for_reward = old_lp if old_lp is not None else b["sample_logprobs"]
        metrics["perf/logprob_s"] = time.perf_counter() - t0

        advantages = self._advantages(b, rewards, valid, old_for_reward, ref_lp, metrics)
        # Rows whose reward no function could judge are left out of every loss (advantage 0 and masked).
        local_valid = valid[self.rank * len(b["lengths"]):(self.rank + 1) * len(b["lengths"])]
        b["completion_mask_loss"] = b["completion_mask"] * paddle.to_tensor(local_valid.astype("int64"))[:, None]
        if ref_lp is not None:
            k3 = kl_penalty(b["sample_logprobs"], ref_lp, "k3")
            mask = b["completion_mask"].astype("float32")
            kl_sum, tokens = self.par.all_reduce_sum([float((k3 * mask).sum()), float(mask.sum())])
            metrics["train/kl"] = float(kl_sum / max(tokens, 1.0))

        t0 = time.perf_counter()
        self._update(b, advantages, old_lp, ref_lp, on_policy, metrics)
        metrics["perf/update_s"] = time.perf_counter() - t0

        lengths = np.concatenate(self.par.all_gather_object(b["lengths"]))
        truncated = np.concatenate(self.par.all_gather_object(b["truncated"]))
        metrics.update({"response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
                        "response_length/min": float(lengths.min()),
                        "response_length/clip_ratio": float(truncated.mean())})
        metrics["train/lr"] = float(self.optimizer.get_lr())
        metrics["perf/step_s"] = time.perf_counter() - t_start
        metrics["perf/completion_tokens_per_s"] = float(lengths.sum()) / max(metrics["perf/rollout_s"], 1e-9)
        self.step += 1
        if self.reference is not None and cfg.sync_ref_model and self.step % cfg.ref_model_sync_steps == 0:
            mix_into(self.reference, self.model, cfg.ref_model_mixup_alpha)
        return metrics, b, rewards

    def _update(self, b, advantages, old_lp, ref_lp, on_policy, metrics):
        cfg, geo = self.cfg, self.geometry
        n = b["completion_ids"].shape[0]
        per_mini, mb = geo.sequences_per_mini_batch, cfg.per_device_train_batch_size
        per_mini_metrics = []
        self.model.train()
        params = (self.pipeline if self.pipeline is not None else self.model).parameters()
        for _ in range(cfg.update_iters):
            for m0 in range(0, n, per_mini):
                mini_mask = b["completion_mask_loss"][m0:m0 + per_mini]
                local = global_denominators(mini_mask, cfg.loss_agg_mode)
                keys = sorted(local)
                denominators = dict(zip(keys, self.par.all_reduce_sum([local[k] for k in keys]).tolist()))
                agg = {k: v for k, v in denominators.items()}
                if cfg.loss_agg_mode == "seq-mean-token-sum-norm":
                    agg["max_dec_len"] = cfg.max_dec_len
                finite = True
                sums = np.zeros(len(_SHARE_KEYS) + len(_TOKEN_MEAN_KEYS) + 1)
                if self.pipeline is not None:
                    sums, finite = self._pipeline_mini_batch(b, advantages, old_lp, ref_lp,
                                                             slice(m0, m0 + per_mini), agg)
                else:
                    for s in range(m0, m0 + per_mini, mb):
                        micro_sums, micro_finite = self._micro_step(b, advantages, old_lp, ref_lp, slice(s, s + mb),
                                                                    agg)
                        sums += micro_sums
                        finite = finite and micro_finite
                per_mini_metrics.append(_mini_batch_metrics(self.par.all_reduce_sum(sums)))
                # Every rank takes the same branch: a rank whose loss was not finite skipped its backward, so
                # gradients are summed only when all ranks have them.
                finite = self.par.all_true(finite)
                if finite:
                    self.par.sum_gradients(params)
                grad_norm = self.par.global_grad_norm(params) if finite else float("nan")
                finite = finite and math.isfinite(grad_norm)
                if finite:
                    self._clip_gradients(grad_norm, params)
                per_mini_metrics[-1]["train/grad_norm"] = grad_norm
                if finite:
                    self.optimizer.step()
                    self.nonfinite_in_a_row = 0
                else:
                    self.nonfinite_total += 1
                    self.nonfinite_in_a_row += 1
                    logger.warning("step %d: non-finite loss or gradient, optimizer step skipped (%d in a row)",
                                   self.step + 1, self.nonfinite_in_a_row)
                    if self.nonfinite_in_a_row >= cfg.max_consecutive_nonfinite:
                        raise TrainingError(
                            f"{self.nonfinite_in_a_row} consecutive updates had a non-finite loss or gradient "
                            f"(max_consecutive_nonfinite = {cfg.max_consecutive_nonfinite}); stopping. Lower "
                            "learning_rate, set max_grad_norm, or check the rewards for inf/NaN.")
                self.optimizer.clear_grad(set_to_zero=False)
                self.scheduler.step()
                self.optimizer_steps += 1
        if self.pipeline is not None:  # the next rollout, log-probs and checkpoint use the full copy
            self.pipeline.copy_to(self.model)
        for k in per_mini_metrics[0]:
            values = [m[k] for m in per_mini_metrics if math.isfinite(m[k])]
            metrics[k] = float(np.mean(values)) if values else float("nan")
        if cfg.kl_loss_coeff == 0:
            metrics.pop("train/kl_loss", None)
        metrics["train/nonfinite_updates"] = float(self.nonfinite_total)
        metrics["train/optimizer_steps"] = float(self.optimizer_steps)

    def _micro_step(self, b, advantages, old_lp, ref_lp, sl, agg):
        """Forward + backward of one micro-batch. Returns (sums, finite): the loss shares and the token-weighted
        statistics of `_SHARE_KEYS`, `_TOKEN_MEAN_KEYS` and the token count, to be summed over micro-batches and
        ranks (`_mini_batch_metrics`)."""
        cfg = self.cfg
        mask = b["completion_mask_loss"][sl]
        need_entropy = True  # logged every step (train/entropy); its cost is one pass over the logits
        lp, entropy = self._completion_logprobs(self.model, b["prompt_ids"][sl], b["prompt_mask"][sl],
                                                b["completion_ids"][sl], b["completion_mask"][sl],
                                                temperature=cfg.temperature, with_entropy=need_entropy,
                                                vocab_parallel=self.vocab_parallel)
        old = lp.detach() if old_lp is None else old_lp[sl]
        loss, sums = self._rl_loss(lp, entropy, old, advantages[sl], mask, None if ref_lp is None else ref_lp[sl],
                                   agg)
        finite = bool(paddle.isfinite(loss))
        if finite:
            loss.backward()
        return sums, finite

    def _rl_loss(self, lp, entropy, old, advantages, mask, ref, agg):
        """The micro-batch's share of the mini-batch loss (policy loss + KL loss - entropy bonus, global
        denominators `agg`) and its metric sums (`_micro_step`). All inputs [mb, T]; `ref` None without KL loss."""
        cfg = self.cfg
        out = compute_policy_loss(lp, old, advantages, mask, clip_ratio_low=cfg.eps_low,
                                  clip_ratio_high=cfg.eps_high, clip_ratio_c=cfg.clip_ratio_c,
                                  importance_sampling_level=cfg.importance_sampling_level,
                                  loss_agg_mode=cfg.loss_agg_mode, **agg)
        loss = cfg.pg_loss_coeff * out["pg_loss"]
        kl_loss = paddle.zeros([])
        if cfg.kl_loss_coeff > 0:
            kl_loss = aggregate_loss(kl_penalty(lp, ref, cfg.kl_loss_estimator), mask, cfg.loss_agg_mode, **agg)
            loss = loss + cfg.kl_loss_coeff * kl_loss
        if cfg.entropy_coeff > 0:
            loss = loss - cfg.entropy_coeff * aggregate_loss(entropy, mask, cfg.loss_agg_mode, **agg)
        tokens = float(mask.astype("float32").sum())
        token_means = (masked_mean(entropy.detach(), mask), out["clip_frac_low"], out["clip_frac_high"],
                       out["clip_frac_dual"], out["approx_kl_old"])
        sums = np.array([float(out["pg_loss"]), float(kl_loss)] + [float(v) * tokens for v in token_means]
                        + [tokens])
        return loss, sums

    def _pipeline_mini_batch(self, b, advantages, old_lp, ref_lp, sl, agg):
        """Forward + backward of the mini-batch rows `sl` through the pipeline (fleet splits them into the
        micro-batches); the loss of `_rl_loss` on the last stage. Returns (sums, finite) as `_micro_step` summed
        over the micro-batches, on every stage."""
        cfg = self.cfg
        ids = paddle.concat([b["prompt_ids"][sl], b["completion_ids"][sl]], axis=1)
        attention_mask = paddle.concat([b["prompt_mask"][sl], b["completion_mask"][sl]], axis=1).astype("int64")
        T = b["completion_ids"].shape[1]
        labels = (b["completion_ids"][sl], b["completion_mask_loss"][sl], advantages[sl],
                  None if old_lp is None else old_lp[sl], None if ref_lp is None else ref_lp[sl])
        micro = []

        def loss_fn(logits, labels):
            completion_ids, mask, adv, old, ref = labels
            # The token at position L + t is predicted from the logits at L + t - 1.
            lp, entropy = logprobs_from_completion_logits(logits[:, -T - 1:-1], completion_ids, cfg.temperature)
            loss, sums = self._rl_loss(lp, entropy, lp.detach() if old is None else old, adv, mask, ref, agg)
            micro.append(np.append(sums, float(bool(paddle.isfinite(loss)))))
            return loss

        self.pipeline.forward_backward((ids, attention_mask, None, position_ids_from_mask(attention_mask)), labels,
                                       loss_fn)
        out = self.pipeline.from_last_stage(np.sum(micro, axis=0) if micro else
                                            np.zeros(len(_SHARE_KEYS) + len(_TOKEN_MEAN_KEYS) + 2))
        return out[:-1], bool(out[-1] == self.geometry.grad_accum_steps)  # every micro-batch's loss finite

    def _clip_gradients(self, grad_norm, params=None):
        """Scale gradients by max_grad_norm / max(norm, max_grad_norm) (as ClipGradByGlobalNorm, but with the norm
        of the whole model under tensor parallelism, not of this rank's shard)."""
        if self.cfg.max_grad_norm <= 0 or grad_norm <= self.cfg.max_grad_norm:
            return
        scale = self.cfg.max_grad_norm / grad_norm
        with paddle.no_grad():
            for p in self.model.parameters() if params is None else params:
                if p.grad is not None:
                    p.grad.scale_(scale)

    # ------------------------------------------------------------------------------------------ evaluation

    def evaluate(self):
        """Greedy (or sampled, `eval_do_sample`) completions for the eval set: eval/reward and eval/accuracy
        (share of samples with the maximal reward the reward functions can give)."""
        cfg = self.cfg
        shard = list(range(self.rank, len(self.eval_records), self.world))
        rewards, samples = [], []
        t0 = time.perf_counter()
        for s in range(0, len(shard), cfg.per_device_eval_batch_size):
            idx = shard[s:s + cfg.per_device_eval_batch_size]
            keys = row_keys(cfg.seed + 1, self.step, np.asarray(idx)) if cfg.eval_do_sample else None
            rollout = self._rollout_round(idx, 1, do_sample=cfg.eval_do_sample, records=self.eval_records,
                                          row_keys=keys)
            texts = self._responses(rollout)
            result = self._score(self.eval_records, idx, rollout, texts, 1)
            rewards.extend(result.scores)
            if not samples:
                samples = [{"prompt": self.eval_records[i]["src"], "completion": texts[j], "reward": result.scores[j],
                            "scores": {name: v[j] for name, v in result.scores_by_function.items()},
                            "length": int(rollout.lengths[j])}
                           for j, i in enumerate(idx[:2])]
        everything = [r for part in self.par.all_gather_object(rewards) for r in part]
        scores = np.array([np.nan if r is None else r for r in everything], dtype=np.float64)
        best = self._max_reward()
        judged = scores[~np.isnan(scores)]
        metrics = {"eval/reward": float(judged.mean()) if judged.size else 0.0,
                   "eval/samples": float(len(scores)), "perf/eval_s": time.perf_counter() - t0}
        if best is not None:  # unjudged samples (None) count as wrong
            metrics["eval/accuracy"] = float((np.nan_to_num(scores, nan=-np.inf) >= best - 1e-6).mean())
        self.log.log_samples(self.step, samples, tag="eval")
        return metrics

    def _max_reward(self):
        """The reward that counts as correct: eval_max_reward, else the maximum the reward functions declare
        (None when unknown, e.g. a PaddleNLP server; eval/accuracy is then not reported)."""
        if self.cfg.eval_max_reward is not None:
            return self.cfg.eval_max_reward
        best = self.rewarder.max_score
        if best is None and not getattr(self, "_warned_max", False):
            self._warned_max = True
            logger.warning("eval/accuracy is not reported: the reward functions do not declare a maximum score; "
                           "set eval_max_reward")
        return best

    # ------------------------------------------------------------------------------------------ checkpoints

    def trainer_state(self):
        return {"sampler": self.sampler.state_dict(),
                "normalizer": self.normalizer.state_dict() if self.normalizer is not None else None,
                "scheduler": self.scheduler.state_dict(), "nonfinite_total": self.nonfinite_total,
                "nonfinite_in_a_row": self.nonfinite_in_a_row, "optimizer_steps": self.optimizer_steps}

    def save(self):
        """Every rank calls this: rank 0 writes; under tensor parallelism the shards of data-parallel rank 0's
        group are merged (a collective); each part of the optimizer state (per pipeline stage, TP rank and
        sharding rank) is written by one of the ranks that hold it."""
        full = not self.cfg.ignore_save_lr_and_optim
        shard, saves = self.par.optimizer_shard()
        path = ckpt.save_checkpoint(
            self.cfg.output_dir, self.step, self.model, self.tokenizer, trainer_state=self.trainer_state(),
            optimizer=self.optimizer, full=full, total_limit=self.cfg.save_total_limit,
            reference=self.reference if (self.cfg.sync_ref_model and full) else None,
            writer=self.par.is_main, participant=self.rank == 0, tp_world=self.par.tp_world,
            pp_world=self.par.pp_world, optimizer_shard=shard, saves_optimizer=saves,
            optimizer_model=self._optimizer_model(), sync=self.par.barrier)
        self.last_checkpoint = path
        if self.par.is_main:
            logger.info("saved %s", path)

    def _optimizer_model(self):
        """The layers the optimizer trains: under pipeline parallelism this stage's pipeline layers (its optimizer
        state is keyed by their names; the model itself is saved from the synchronised full copy)."""
        return self.pipeline.layers if self.pipeline is not None else self.model

    def _resume(self, path):
        state = ckpt.load_trainer_state(path)
        shard = self.par.model_load_kwargs()
        ckpt.load_weights(self.model, path, **shard)
        if self.reference is not None and os.path.isdir(os.path.join(path, ckpt.REFERENCE_DIR)):
            ckpt.load_weights(self.reference, os.path.join(path, ckpt.REFERENCE_DIR), **shard)
        if self.pipeline is not None:
            self.pipeline.load_from(self.model)
        ckpt.load_optimizer_and_rng(path, self.par.inner_optimizer(self.optimizer), self._optimizer_model(),
                                    shard=self.par.optimizer_shard()[0])
        self.scheduler.set_state_dict(state["scheduler"])
        self.sampler.set_state_dict(state["sampler"])
        if self.normalizer is not None and state.get("normalizer"):
            self.normalizer.set_state_dict(state["normalizer"])
        self.nonfinite_total = state["nonfinite_total"]
        self.nonfinite_in_a_row = state["nonfinite_in_a_row"]
        self.optimizer_steps = state["optimizer_steps"]
        self.step = state["step"]
        logger.info("resumed from %s at step %d", path, self.step)

    # ------------------------------------------------------------------------------------------- main loop

    def _should_eval(self):
        return self.cfg.do_eval and self.cfg.evaluation_strategy == "steps" and self.eval_records and (
            self.step % self.cfg.eval_steps == 0 or self.step == self.max_steps)

    def train(self):
        """Run to max_steps. Ctrl-C saves a checkpoint and stops cleanly. Returns the last step's metrics."""
        cfg = self.cfg
        metrics = {}
        interrupted = False
        if self.step >= self.max_steps:  # a finished run: re-running its command must not re-save its checkpoint
            if self.par.is_main:
                logger.info("%s already holds this run up to step %d (max_steps %d): nothing to train; set "
                            "overwrite_output_dir: true to train again from scratch", cfg.output_dir, self.step,
                            self.max_steps)
            self.log.close()
            return metrics
        previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            if self.step == 0 and self._should_eval_at_start():
                first = self.evaluate()
                self.log.log(0, first)
            while self.step < self.max_steps:
                metrics, b, _ = self.train_step()
                if self._should_eval():
                    metrics.update(self.evaluate())
                self.log.log(self.step, metrics)
                self.log.advance(self.step, metrics)
                if self.step % cfg.logging_steps == 0:
                    self.log.log_samples(self.step, sample_rows(b, self.train_records))
                if cfg.save_strategy == "steps" and self.step % cfg.save_steps == 0 and self.step < self.max_steps:
                    self.save()
        except KeyboardInterrupt:
            interrupted = True
            logger.warning("interrupted at step %d: saving a checkpoint before stopping", self.step)
        finally:
            signal.signal(signal.SIGTERM, previous)
        if cfg.save_strategy == "steps" or interrupted:
            self.save()
        self.log.close()
        if interrupted:
            raise KeyboardInterrupt
        return metrics

    def _should_eval_at_start(self):
        return self.cfg.do_eval and self.cfg.evaluation_strategy == "steps" and bool(self.eval_records)


# Per-mini-batch metrics: loss shares add up to the mini-batch loss (global denominators); the others are
# token-weighted sums divided by the mini-batch's token count. Summed over micro-batches and ranks.
_SHARE_KEYS = ("train/policy_loss", "train/kl_loss")
_TOKEN_MEAN_KEYS = ("train/entropy", "train/clip_frac_low", "train/clip_frac_high", "train/clip_frac_dual",
                    "train/approx_kl_old")


def _mini_batch_metrics(sums):
    n_share = len(_SHARE_KEYS)
    tokens = max(sums[-1], 1.0)
    out = dict(zip(_SHARE_KEYS, sums[:n_share].tolist()))
    out.update({k: float(v) / tokens for k, v in zip(_TOKEN_MEAN_KEYS, sums[n_share:-1])})
    return out


def _build_actor(cfg):
    """Make the missing policy directory with the named recipe, once per node (local rank 0 builds, the other ranks
    wait on the file system): the quickstart build takes about a minute, longer than gloo's 30 s collective
    timeout, so it runs before `ParallelContext.from_config` and nobody waits for it in a collective."""
    def build(directory):
        from .recipes.quickstart import build_quickstart_policy

        build_quickstart_policy(directory, seed=cfg.seed, progress=not cfg.disable_tqdm)

    build_once_per_node(cfg.actor_model_name_or_path, build, f"the '{cfg.build_actor_if_missing}' recipe")


def _raise_interrupt(*_):
    """SIGTERM (a scheduler stopping the job) is handled like Ctrl-C: save, then stop."""
    raise KeyboardInterrupt


def train(cfg):
    """Entry point used by run_rl.py: build the trainer and run it; returns a process exit status."""
    t0 = time.time()
    trainer = Trainer(cfg)
    if trainer.par.is_main:
        logger.info("%d training prompts, %d eval prompts, %d steps; batch geometry %s",
                    len(trainer.train_records), len(trainer.eval_records), trainer.max_steps, trainer.geometry)
    try:
        trainer.train()
    except KeyboardInterrupt:
        return 130
    if trainer.par.is_main:
        s = summary.run_summary(read_json_rows(os.path.join(cfg.output_dir, "metrics.jsonl")),
                                output_dir=cfg.output_dir,
                                logging_dir=cfg.logging_dir if cfg.report_to in ("visualdl", "all") else "",
                                checkpoint=trainer.last_checkpoint, wall_s=time.time() - t0,
                                steps_this_run=trainer.step - trainer.steps_at_start, last_step=trainer.step)
        if s["steps_this_run"] > 0:  # re-running a finished run keeps the summary of the run that trained
            summary.write_summary(s, cfg.output_dir)
        print(summary.format_summary(s), end="", flush=True)
    return 0
