"""The critic of a critic run (rl_algorithm ppo, vapo): what it loads and its keys, resolved."""
from __future__ import annotations

import os
from typing import List, Optional, Tuple

from ..config import Config, ConfigError, yaml_value
from .keys import keyed
from .models import holdings, resolve_model


CRITIC_KEY = "critic_model_name_or_path"


def critic_spec(cfg: Config) -> List[Tuple[str, str]]:
    """[(critic_model_name_or_path, name)] when the run trains a critic and it is not the policy that
    build_actor_if_missing builds first (checked with it); else []."""
    name = cfg.critic_model_name_or_path.strip()
    if not cfg.needs_critic or critic_is_built_actor(cfg):
        return []
    return [(CRITIC_KEY, name)]


def critic_is_built_actor(cfg: Config) -> bool:
    """The critic starts from the policy that build_actor_if_missing builds at start-up (quickstart_ppo.yaml)."""
    return bool(cfg.build_actor_if_missing) and not os.path.isdir(cfg.actor_model_name_or_path) and \
        os.path.normpath(cfg.critic_model_name_or_path.strip()) == os.path.normpath(cfg.actor_model_name_or_path)


def critic_dir_problems(path: str, key: str = CRITIC_KEY) -> List[str]:
    """What a local critic directory lacks: config.json and its weight files. No tokenizer: the critic reads the
    policy's token ids (a critic checkpoint need not hold one)."""
    from ..policy import hub

    missing = [m for m in hub.missing_files(path) if m != hub.TOKENIZER_CONFIG_FILE]
    if not missing:
        from ..policy import hf_weights

        try:  # PyTorch-written safetensors convert as the policy's do; anything else PaddleNLP refuses is named
            hf_weights.plan(path)
        except (hf_weights.WeightFormatError, OSError, ValueError) as e:
            return [keyed(key, str(e))]
        return []
    return [f"{key}: '{path}' is not a whole model directory: it lacks {', '.join(missing)} {holdings(path)}"]


def check_critic(cfg: Config, policy_vocab: Optional[int]) -> List[str]:
    """Problems with the critic of a critic run (nothing for other runs): critic_model_name_or_path resolves as the
    policy's does (a local directory with config.json and weights, or a hub ID in PaddleNLP's cache; never
    downloaded), its config.json loads, and its vocabulary covers the policy's token ids (`policy_vocab`: the
    policy tokenizer's size, None when unknown). Prints one line about the critic."""
    if not cfg.needs_critic:
        return []
    name = cfg.critic_model_name_or_path.strip()
    if critic_is_built_actor(cfg):
        print(f"  {CRITIC_KEY}: the policy '{name}', built first by the '{cfg.build_actor_if_missing}' recipe: "
              "a causal LM: its backbone with a new value head initialised to zeros")
        return []
    try:
        path, note = resolve_model(name, CRITIC_KEY)
    except (OSError, ValueError, ConfigError) as e:
        return [keyed(CRITIC_KEY, str(e))]
    if path is None:
        print(f"  note: {note}")
        return []
    problems = critic_dir_problems(path)
    if problems:
        return problems
    from paddlenlp.transformers import AutoConfig

    from ..policy import quiet_paddlenlp

    quiet_paddlenlp()
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:  # noqa: BLE001  PaddleNLP raises many types; the message is what the user needs
        return [f"{CRITIC_KEY}: '{path}' does not load with PaddleNLP's AutoConfig: {type(e).__name__}: {e}"]
    vocab = getattr(config, "vocab_size", None)
    if policy_vocab is not None and vocab is not None and vocab < policy_vocab:
        return [f"{CRITIC_KEY}: '{path}' has a vocabulary of {vocab} tokens, the policy's tokenizer {policy_vocab}: "
                "the critic reads the policy's token ids, so it needs the policy's vocabulary"]
    if getattr(config, "is_encoder_decoder", False):
        return [f"{CRITIC_KEY}: '{path}' is an encoder-decoder model; the critic is a decoder backbone"]
    from ..policy.critic import critic_plan  # load_critic's own kind, start-up text and refusals

    try:
        _, start = critic_plan(config, path, key=CRITIC_KEY)
    except (ValueError, FileNotFoundError) as e:
        return [keyed(CRITIC_KEY, str(e))]
    print(f"  {CRITIC_KEY}: {path} ({type(config).__name__}, vocabulary {vocab}): {start}")
    return []


def critic_run_lines(cfg: Config) -> Tuple[List[str], List[str], List[str]]:
    """(lines, warnings, problems) of what a critic run (ppo, vapo) does with its keys as resolved, each saying
    where an unset key's value comes from: value pretraining, the policy's clip range, the critic's optimizer (its
    unset keys take the policy's), the positive-example LM loss and what counts as correct for it, and VAPO's
    lam_policy on short completions."""
    lines: List[str] = []
    warnings: List[str] = []
    problems: List[str] = []

    def origin(key: str) -> str:  # where the value of an Optional key comes from
        note = cfg.unset_note(key)
        return key if getattr(cfg, key) is not None else f"{key} unset: {note.removeprefix('null = ')}"

    if cfg.needs_critic:
        steps = cfg.critic_pretrain_steps
        lines.append(f"value pretraining: {steps} step{'s' if steps != 1 else ''} update only the critic "
                     f"({origin('pretrain_critic_steps')}); the policy's schedule spans the "
                     f"{max(0, cfg.max_steps - steps) if cfg.max_steps > 0 else 'remaining'} steps after them")
        from ..config.critic import CRITIC_INHERITS

        settings = ", ".join(f"{key} {yaml_value(cfg.critic_setting(key))}" +
                             ("" if getattr(cfg, key) is not None else f" (unset: the policy's {CRITIC_INHERITS[key]})")
                             for key in ("critic_learning_rate", "critic_min_learning_rate",
                                         "critic_lr_scheduler_type", "critic_weight_decay"))
        warmup = (f"critic_warmup_ratio {cfg.critic_warmup_ratio}" if cfg.critic_warmup_ratio is not None else
                  f"{cfg.unset_note('critic_warmup_ratio').removeprefix('null = ')} (critic_warmup_ratio unset)")
        lines.append(f"critic optimizer: {settings}; warm-up: {warmup}")
    if (cfg.needs_critic or cfg.clip_range_ratio_high is not None) and cfg.policy_loss is None:  # else: loss.py
        lines.append(f"policy clip range: [1 - {cfg.eps_low}, 1 + {cfg.eps_high}] "
                     f"({origin('clip_range_ratio_high')})")
    if cfg.positive_lm_coeff > 0:
        declared, where = None, "asked from the reward server's /health at start-up"
        from ..rewards.reward_model import REWARD_MODEL_PREFIX

        names = [r.strip() for r in cfg.reward_funcs.split(",") if r.strip()]
        if not cfg.use_rm_server and not any(n.startswith(REWARD_MODEL_PREFIX) for n in names):
            from ..rewards.combine import RewardSet  # functions only: no model weights are read
            try:
                declared = RewardSet(cfg.reward_funcs, cfg.reward_weights).max_score
                where = "the reward functions declare none" if declared is None else \
                    f"the maximum the reward functions declare, {declared}, minus 1e-6"
            except Exception:  # noqa: BLE001  check_rewards reports a function that does not load
                where = "the reward functions do not load"
        threshold = cfg.positive_min_reward(declared)
        if cfg.positive_example_min_reward is not None:
            where = "positive_example_min_reward"
        elif cfg.eval_max_reward is not None:
            where = f"eval_max_reward {cfg.eval_max_reward} minus 1e-6"
        coeff = (f"{cfg.positive_lm_coeff} ({origin('positive_example_lm_coeff')})")
        if threshold is None and not cfg.use_rm_server:
            problems.append("positive_example_lm_coeff: the positive-example LM loss is on "
                            f"({coeff}) but no reward counts as correct ({where}): set positive_example_min_reward "
                            "or eval_max_reward, or positive_example_lm_coeff: 0")
        shown = "unknown" if threshold is None else f">= {threshold!r}"
        lines.append(f"positive-example LM loss: coefficient {coeff}, on every completion of the batch with a reward "
                     f"{shown} ({where}), whatever its group scored")
    if cfg.rl_algorithm == "vapo":
        shortest = 1.0 / cfg.vapo_alpha
        lines.append(f"lam_policy = max(0, 1 - 1 / (vapo_alpha {cfg.vapo_alpha} x l)) is 0 for completions of "
                     f"l <= {shortest:g} tokens: their advantages are one-step TD errors, and the policy learns "
                     "only as fast as the critic's values become informative")
        if cfg.max_dec_len <= shortest:
            warnings.append(f"vapo: max_dec_len {cfg.max_dec_len} <= 1 / vapo_alpha = {shortest:g}: lam_policy is 0 "
                            "for every completion (one-step TD advantages only); choose vapo_alpha of the order of "
                            "1 / (typical answer length) for short answers")
    return lines, warnings, problems
