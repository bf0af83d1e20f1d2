"""Validation: ranges, choices and combinations of keys, each error naming the key, its value and where it was set."""
from __future__ import annotations

import math
import os
import re
from typing import Dict, Optional

from .effects import CONSTANT_SCHEDULES, SHARDING_OPTIONS, sharding_options
from .evaluation import check_evaluation, check_evaluation_combinations
from .distillation import distillation_refusal
from .fields import ConfigError, field_choices, logger, raise_errors
from .flat import FIELDS, Config
from .policy_loss import apply_policy_loss, check_policy_loss_values

# ------------------------------------------------------------------------------------------------- validation

def validate(cfg: Config, given: Optional[Dict[str, str]] = None) -> Config:
    """Check ranges, choices and combinations; raise ConfigError naming the key, its value and where it was set:
    every key out of range or not one of its choices in one error, then the first bad combination."""
    known = given is not None  # the loader says where each key was set: an unset key is at its default
    given = given or {}
    bad_values: Dict[str, str] = {}  # key -> its first range/choice error, raised together after those checks

    def message(key, msg):
        where = given.get(key)
        prefix = f"{where}: " if where else ""
        default = " (the default)" if known and not where else ""
        return f"{prefix}key '{key}' = {getattr(cfg, key)!r}{default}: {msg}"

    def bad(key, msg):
        """A range or choice error of one key: collected, so that one run names them all."""
        bad_values.setdefault(key, message(key, msg))

    def fail(key, msg):
        """A combination error: at once (the checks after it may assume it holds)."""
        raise ConfigError(message(key, msg))

    def ref(key):
        """`key (value, where it was set)`: the other key of a combination, so both sides can be found."""
        where = given.get(key) or ("the default" if known else "")
        return f"{key} ({getattr(cfg, key)}{', ' + where if where else ''})"

    # First: a config for an algorithm this trainer does not have says so before anything else.
    algorithms = field_choices(FIELDS["rl_algorithm"])
    if cfg.rl_algorithm not in algorithms:
        fail("rl_algorithm", f"is not supported: the supported algorithms are {', '.join(algorithms)}")

    for key, f in FIELDS.items():
        choices = field_choices(f)
        if choices is not None and getattr(cfg, key) is not None and getattr(cfg, key) not in choices:
            bad(key, f"must be one of {', '.join(repr(c) for c in choices)}")
        value = getattr(cfg, key)
        if isinstance(value, float) and not math.isfinite(value):
            bad(key, "must be a finite number")

    positive = ("global_batch_size", "rollout_n", "update_iters", "per_device_logprob_batch_size",
                "per_device_train_batch_size", "per_device_eval_batch_size", "max_prompt_len", "max_dec_len",
                "rollout_max_num_seqs", "logging_steps", "tensor_parallel_degree", "pipeline_parallel_degree",
                "virtual_pp_degree", "max_gen_batches", "max_consecutive_nonfinite", "ref_model_sync_steps",
                "overlong_reward_buffer", "max_length", "lora_rank", "fused_head_chunk_size",
                "per_device_value_batch_size", "max_turns", "tool_max_workers", "max_tool_response_len",
                "per_device_reward_batch_size")
    for key in positive:
        if getattr(cfg, key) < 1:
            bad(key, "must be at least 1")
    non_negative = ("learning_rate", "weight_decay", "max_grad_norm", "clip_range_ratio", "clip_range_score",
                    "kl_coeff", "kl_loss_coeff", "pg_loss_coeff", "entropy_coeff", "min_dec_len", "warmup_steps",
                    "overlong_penalty_factor", "adam_epsilon", "reward_server_timeout",
                    "reward_server_max_wait_s", "reward_timeout_s", "seed", "max_tokens_per_micro_batch",
                    "min_learning_rate", "critic_learning_rate", "critic_min_learning_rate", "critic_weight_decay",
                    "pretrain_critic_steps", "clip_range_value", "positive_example_lm_coeff")
    for key in non_negative:
        if getattr(cfg, key) is not None and getattr(cfg, key) < 0:
            bad(key, "must not be negative")
    for key in ("rollout_lag", "rollout_worker_timeout_s", "rollout_worker_threads"):
        if getattr(cfg, key) < 0:
            bad(key, "must not be negative")
    if cfg.reward_server_max_retries < -1:
        bad("reward_server_max_retries", "must be -1 (no limit: reward_server_max_wait_s ends the retries) or >= 0")
    for key in ("clip_range_ratio_low", "clip_range_ratio_high"):
        if getattr(cfg, key) is not None and getattr(cfg, key) < 0:
            bad(key, "must not be negative")
    if cfg.eps_low >= 1:
        bad("clip_range_ratio_low" if cfg.clip_range_ratio_low is not None else "clip_range_ratio",
            "the lower clip range must be below 1 (the ratio is clipped to [1 - low, 1 + high])")
    if cfg.clip_ratio_c is not None and cfg.clip_ratio_c <= 1:
        bad("clip_ratio_c", "the dual-clip constant must be greater than 1 (leave it unset to disable dual-clip)")
    if cfg.correction_mode in ("tis", "mis") and not cfg.rollout_correction_cap > 1:
        bad("rollout_correction_cap", f"must be greater than 1 with rollout_correction {cfg.correction_mode!r} "
            "(the ratio of an on-policy token is 1: a cap at or below it would cap or drop them all)")
    if cfg.correction_mode == "mis" and not 0 <= cfg.rollout_correction_min < 1:
        bad("rollout_correction_min", "must be in [0, 1) with rollout_correction 'mis' (0: no lower bound; from 1 "
            "up the band of kept ratios would drop the on-policy tokens, whose ratio is 1)")
    if not 0 < cfg.top_p <= 1:
        bad("top_p", "must be in (0, 1]")
    if cfg.top_k < 0:
        bad("top_k", "must not be negative (0 turns top-k sampling off)")
    if cfg.temperature <= 0:
        bad("temperature", "must be greater than 0")
    if cfg.repetition_penalty <= 0:
        bad("repetition_penalty", "must be greater than 0")
    for key in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(cfg, key) < 1:
            bad(key, "must be in [0, 1)")
    for key in ("warmup_ratio", "critic_warmup_ratio"):
        if getattr(cfg, key) is not None and not 0 <= getattr(cfg, key) < 1:
            bad(key, "must be in [0, 1)")
    for key in ("gamma", "lam", "lam_critic"):
        if not 0 <= getattr(cfg, key) <= 1:
            bad(key, "must be in [0, 1]")
    if cfg.vapo_alpha <= 0:
        bad("vapo_alpha", "must be greater than 0 (lam_policy = 1 - 1 / (vapo_alpha * length))")
    if not 0 <= cfg.ref_model_mixup_alpha <= 1:
        bad("ref_model_mixup_alpha", "must be in [0, 1]")
    for key in ("global_mini_batch_size", "global_gen_batch_size", "sharding_parallel_degree",
                "rollout_tensor_parallel_degree", "save_total_limit"):
        if getattr(cfg, key) != -1 and getattr(cfg, key) < 1:
            bad(key, "must be -1 (automatic) or at least 1")
    if cfg.max_steps == 0 or cfg.max_steps < -1:
        bad("max_steps", "must be -1 (from num_train_epochs) or at least 1")
    if cfg.num_train_epochs < 0 and cfg.max_steps < 1:  # PaddleNLP: max_steps > 0 overrides num_train_epochs
        bad("num_train_epochs", "must not be negative unless max_steps (which then sets the length) is at least 1")
    unknown = [x for x in sharding_options(cfg) if x not in SHARDING_OPTIONS]
    if unknown:
        bad("sharding_parallel_config", f"unknown option {unknown[0]!r}; the options are "
                                        f"{', '.join(sorted(SHARDING_OPTIONS))}")
    if cfg.do_eval and cfg.eval_steps < 1:
        bad("eval_steps", "must be at least 1")
    if not cfg.opd_kl_coeff > 0:
        bad("opd_kl_coeff", "must be > 0 (leave teacher_model_name_or_path empty to train without distillation)")
    if cfg.save_strategy == "steps" and cfg.save_steps < 1:
        bad("save_steps", "must be at least 1")
    if cfg.lora_alpha <= 0 and cfg.lora_alpha != -1:
        bad("lora_alpha", "must be positive (or -1: 2 x lora_rank)")
    if not 0 <= cfg.lora_dropout < 1:
        bad("lora_dropout", "must be in [0, 1)")
    for pattern in cfg.target_modules:
        try:
            re.compile(pattern)
        except re.error as e:
            bad("target_modules", f"'{pattern}' is not a valid regular expression ({e})")
    if cfg.tool_timeout_s <= 0:
        bad("tool_timeout_s", "must be greater than 0")
    if cfg.tool_server_max_unanswered < 0:
        bad("tool_server_max_unanswered", "must be 0 (never stop) or more")
    if cfg.tool_server.strip():
        bad_url = url_problem(cfg.tool_server)
        if bad_url:
            bad("tool_server", bad_url)
    check_evaluation(cfg, bad)
    check_policy_loss_values(cfg, bad)
    raise_errors(list(bad_values.values()), "bad values")

    # Combinations: one key against others, checked once each key alone is valid.
    if cfg.lr_scheduler_type not in CONSTANT_SCHEDULES and cfg.min_learning_rate > cfg.learning_rate:
        fail("min_learning_rate", f"must not exceed {ref('learning_rate')}: the {cfg.lr_scheduler_type} schedule "
                                  "(lr_scheduler_type) decays from learning_rate down to it")
    # The critic's keys left unset take the policy's (Config.critic_setting): the message says where each came from.
    critic = {key: cfg.critic_setting(key) for key in ("critic_min_learning_rate", "critic_learning_rate",
                                                       "critic_lr_scheduler_type")}
    if cfg.needs_critic and critic["critic_lr_scheduler_type"] not in CONSTANT_SCHEDULES and \
            critic["critic_min_learning_rate"] > critic["critic_learning_rate"]:
        peak = "critic_learning_rate" if cfg.critic_learning_rate is not None else \
            "learning_rate (critic_learning_rate is unset and takes it)"
        schedule = critic["critic_lr_scheduler_type"]
        if cfg.critic_min_learning_rate is not None:
            fail("critic_min_learning_rate", f"must not exceed {peak} ({critic['critic_learning_rate']}): the "
                                             f"critic's {schedule} schedule decays from its learning rate down to it")
        fail("min_learning_rate", f"is the critic's floor too (critic_min_learning_rate is unset and takes it) and "
                                  f"must not exceed {peak} ({critic['critic_learning_rate']}): the critic's "
                                  f"{schedule} schedule decays from its learning rate down to it; set "
                                  "critic_min_learning_rate")
    apply_policy_loss(cfg, given, known, fail)
    if cfg.clip_cov_lb >= cfg.clip_cov_ub:
        fail("clip_cov_lb", f"must be below {ref('clip_cov_ub')}: Clip-Cov draws its tokens from the band between")
    if cfg.min_dec_len > cfg.max_dec_len:
        fail("min_dec_len", f"must not exceed {ref('max_dec_len')}; set min_dec_len to at most {cfg.max_dec_len}")
    if cfg.max_length < cfg.max_prompt_len + cfg.max_dec_len:
        fail("max_length", f"must be at least max_prompt_len + max_dec_len = {cfg.max_prompt_len} + "
                           f"{cfg.max_dec_len} = {cfg.max_prompt_len + cfg.max_dec_len}; set max_length to "
                           f"{cfg.max_prompt_len + cfg.max_dec_len} or more")
    if cfg.global_batch_size % cfg.mini_batch_prompts:
        divisors = [d for d in range(1, cfg.global_batch_size + 1) if cfg.global_batch_size % d == 0]
        fail("global_mini_batch_size", f"must divide {ref('global_batch_size')}: each rollout is split into whole "
                                       f"mini-batches; set global_mini_batch_size to "
                                       f"{max(d for d in divisors if d <= cfg.mini_batch_prompts)} (its divisors: "
                                       f"{', '.join(map(str, divisors[:12]))}{', ...' if len(divisors) > 12 else ''}"
                                       "; -1: one mini-batch)")
    if cfg.global_gen_batch_size != -1 and cfg.global_gen_batch_size < cfg.global_batch_size and \
            not cfg.dynamic_sampling:
        fail("global_gen_batch_size", f"is smaller than {ref('global_batch_size')}; it only "
                                      "differs from it with dynamic_sampling")
    if cfg.enable_overlong_reward_buffer and cfg.overlong_reward_buffer > cfg.max_dec_len:
        fail("overlong_reward_buffer", f"must not exceed {ref('max_dec_len')}")
    from ..algorithms import advantage_estimator_spec  # paddle: see _from_algorithms
    estimator = advantage_estimator_spec(cfg.rl_algorithm)
    if cfg.rollout_n < estimator.min_group_size:
        fail("rollout_n", f"{cfg.rl_algorithm} needs at least {estimator.min_group_size} samples per prompt (its "
                          "advantage compares each sample with the others of its group)")
    unknown_options = [k for k in estimator.config_keys if k not in FIELDS]
    unknown_options += [k for k, _ in estimator.key_defaults if k not in FIELDS]
    if unknown_options:
        fail("rl_algorithm", f"the estimator takes config option {unknown_options[0]!r}, which is not a config key")
    if estimator.needs_values:
        critic_refusals(cfg, given)
    has_rm = bool(cfg.reward_model_name_or_path.strip())
    if has_rm and cfg.use_rm_server:
        fail("reward_model_name_or_path", "is set while use_rm_server is true: the reward server hosts the reward "
                                          "model (python -m reward_server --reward-model DIR); set use_rm_server: "
                                          "false to score with it in-process")
    if cfg.use_rm_server and not cfg.reward_server.strip():
        fail("reward_server", "is empty while use_rm_server is true")
    if not cfg.use_rm_server and not cfg.reward_funcs.strip() and not has_rm:
        fail("reward_funcs", "is empty while use_rm_server is false: name the reward functions to run in-process "
                             "(for example reward_funcs: kk), or set reward_model_name_or_path (or "
                             "use_rule_reward: true, PaddleNLP's GSM8K rule reward)")
    if cfg.reward_weights is not None:
        n_funcs = len([r for r in cfg.reward_funcs.split(",") if r.strip()]) + has_rm
        listed = f"{cfg.reward_funcs}, then the reward model, whose weight comes last" if has_rm else cfg.reward_funcs
        if not cfg.use_rm_server and len(cfg.reward_weights) != n_funcs:
            fail("reward_weights", f"has {len(cfg.reward_weights)} weights for {n_funcs} reward functions "
                                   f"({listed.lstrip(', ')})")
        if cfg.use_rm_server:
            fail("reward_weights", "applies to in-process reward functions; with use_rm_server the server "
                                   "weighs its functions (python -m reward_server --weights ...)")
    if cfg.do_eval and cfg.evaluation_strategy == "steps" and not cfg.eval_datasets.strip():
        fail("eval_datasets", "is empty while do_eval is true")
    check_evaluation_combinations(cfg, fail)
    if cfg.fp16 and cfg.bf16:
        fail("fp16", "fp16 and bf16 cannot both be true")
    if cfg.lora and cfg.sync_ref_model:
        fail("sync_ref_model", "cannot be used with lora: the reference model is the base model with the adapters "
                               "disabled; there is no separate copy to mix the policy into")
    if cfg.tools and cfg.max_turns == 1:  # docs/tools.md: the last turn's calls are recorded, never run
        fail("max_turns", f"with tools ({', '.join(map(str, cfg.tools))}) no tool call could run: the last assistant "
                          "turn ends the sample and its calls are not run, and with max_turns 1 the only turn is "
                          "the last (docs/tools.md, The rollout); set max_turns to 2 or more (a call, then the "
                          "answer that reads its result), or leave tools empty")
    refusal = distillation_refusal(cfg, given) or build_target_refusal(cfg, given)
    if refusal:
        raise ConfigError(refusal)
    # The tools themselves load where the trainer builds them (step.build_tools) and in --dry_run, as the reward
    # functions do: an unknown name is refused there with the registered tools listed (config/ imports no tools).
    return cfg


def url_problem(url: str) -> Optional[str]:
    """Why `url` is not an http(s) URL with a host (None when it is)."""
    from urllib.parse import urlparse
    try:
        parts = urlparse(url.strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as e:
        return f"is not a URL ({e})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:8731"
    return None


def critic_refusals(cfg: Config, given: Dict[str, str]) -> None:
    """Raise ConfigError for what a critic run (Config.needs_critic) refuses, naming the keys and where they were
    set: no critic model, pipeline stages (the critic is built whole on each rank: policy/critic.py has no pipeline
    layers). An encoder-decoder policy is refused by `encoder_decoder_refusal` where the policy's config.json is
    read (dry run, start-up)."""
    algorithm = f"rl_algorithm {cfg.rl_algorithm!r} trains a critic (value model)"
    place = given.get("critic_model_name_or_path") or given.get("rl_algorithm")
    if not cfg.critic_model_name_or_path.strip():
        raise ConfigError(f"{place + ': ' if place else ''}key 'critic_model_name_or_path' is empty: {algorithm} "
                          f"(rl_algorithm: {cfg.rl_algorithm}); name its directory or hub ID (PaddleNLP's configs "
                          "use the policy's, e.g. Qwen/Qwen2.5-1.5B-Instruct)")
    if cfg.pipeline_parallel_degree > 1:
        place = given.get("pipeline_parallel_degree")
        raise ConfigError(f"{place + ': ' if place else ''}key 'pipeline_parallel_degree' = "
                          f"{cfg.pipeline_parallel_degree}: must be 1: {algorithm}, and the critic is not built for "
                          "pipeline stages; use tensor_parallel_degree and sharding instead "
                          f"(critic_model_name_or_path {cfg.critic_model_name_or_path!r})")


def encoder_decoder_refusal(cfg: Config, is_encoder_decoder: bool) -> Optional[str]:
    """The refusal (a message naming the keys) of a run an encoder-decoder policy cannot do, or None: a critic
    (a decoder backbone reading prompt + completion as one sequence: an encoder-decoder policy's completions have
    no such decoder states to value), or tools (the multi-turn rollout appends tool turns to the model's own
    sequence; an encoder-decoder's decoder holds the answer alone)."""
    if not is_encoder_decoder:
        return None
    if cfg.tools:
        return (f"actor_model_name_or_path: '{cfg.actor_model_name_or_path}' is an encoder-decoder model, and tools "
                f"({', '.join(cfg.tools)}) make rollouts multi-turn, whose tool turns continue the model's own "
                "sequence: not supported for encoder-decoder policies (use a decoder-only policy, or leave tools "
                "empty)")
    if not cfg.needs_critic:
        return None
    return (f"actor_model_name_or_path: '{cfg.actor_model_name_or_path}' is an encoder-decoder model, and "
            f"rl_algorithm {cfg.rl_algorithm!r} trains a critic (critic_model_name_or_path), which is a decoder "
            "backbone valuing the policy's prompt + completion as one sequence: not supported for encoder-decoder "
            "policies (use a decoder-only policy, or an estimator without a critic)")


def resolve_rollout_correction(cfg: Config, given: Dict[str, str]) -> None:
    """rollout_correction left out of the file and the command line, with a lagged sampler (async_rollout,
    rollout_lag >= 1), becomes `clip`: uncorrected, one step of lag collapsed the quickstart while clip kept it
    within the synchronous range (docs/async.md); with a reduced rollout_precision, `tis`. An explicit value, `none`
    included, is kept (`given`: a YAML `none` reads the same as the default, so the key's presence decides). Recorded in `cfg._derived` for the
    resolved configuration and the dry run (Config.correction_reason)."""
    cfg._derived = {}
    if "rollout_correction" in given:
        return
    if cfg.async_rollout and cfg.rollout_lag >= 1:
        cfg.rollout_correction = "clip"
        cfg._derived["rollout_correction"] = (f"not set: the default for async_rollout with rollout_lag "
                                              f"{cfg.rollout_lag} (docs/async.md); none turns it off")
    elif cfg.rollout_precision != "float32":
        # The sampler's bf16 products give other log-probs than the float32 trainer's: truncated importance
        # weights (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL training").
        cfg.rollout_correction = "tis"
        cfg._derived["rollout_correction"] = (f"not set: the default for rollout_precision {cfg.rollout_precision} "
                                              f"(the sampler's products round otherwise than the trainer's); none "
                                              f"turns it off")


def resolve_rule_reward(cfg: Config, given: Dict[str, str]) -> None:
    """PaddleNLP's `use_rule_reward: true` (its PPO configs' GSM8K rule reward, scored in-process) becomes
    `reward_funcs: gsm8k`, logged; combinations PaddleNLP would resolve by ignoring a key are refused, naming both."""
    if not cfg.use_rule_reward:
        return
    where = given.get("use_rule_reward")
    prefix = f"{where}: " if where else ""
    if cfg.use_rm_server:
        raise ConfigError(f"{prefix}key 'use_rule_reward' = True: scores in-process with the GSM8K rule reward, "
                          "while use_rm_server is true (the reward server would be ignored); set use_rm_server: "
                          "false, or use_rule_reward: false to score with the server")
    if cfg.reward_funcs.strip() not in ("", "gsm8k"):
        raise ConfigError(f"{prefix}key 'use_rule_reward' = True: means reward_funcs: gsm8k, while reward_funcs is "
                          f"{cfg.reward_funcs!r}; set one of the two")
    if cfg.reward_model_name_or_path.strip():
        raise ConfigError(f"{prefix}key 'use_rule_reward' = True: scores with the GSM8K rule reward, while "
                          f"reward_model_name_or_path is {cfg.reward_model_name_or_path!r} (it would be ignored, as "
                          "in PaddleNLP); set one of the two")
    if not cfg.reward_funcs.strip():
        cfg.reward_funcs = "gsm8k"
        logger.info("%suse_rule_reward: true: completions are scored in-process with PaddleNLP's GSM8K rule reward, "
                    "reward_funcs: gsm8k", prefix)


# What names a real model's directory or hub ID: a parameter count (1.5B, 7b, 125M) or a model family's name.
_MODEL_SIZE = re.compile(r"(?<![a-z0-9])\d+(?:\.\d+)?[bm](?![a-z])", re.I)
_MODEL_FAMILY = re.compile(r"(?<![a-z])(qwen|llama|mistral|mixtral|gemma|phi|deepseek|baichuan|chatglm|glm|internlm|"
                           r"ernie|gpt|bloom|falcon|t5|bart|instruct)(?![a-z])", re.I)


def real_model_name_marks(path: str) -> list:
    """The parts of the last component of `path` that name a real model (a parameter count such as 1.5B, a model
    family such as Qwen), [] when none do (build/quickstart_policy, build/qs_s1)."""
    name = os.path.basename(os.path.normpath(path))
    return [m.group(0) for m in _MODEL_FAMILY.finditer(name)] + [m.group(0) for m in _MODEL_SIZE.finditer(name)]


def build_target_refusal(cfg: Config, given: Dict[str, str]) -> Optional[str]:
    """Why build_actor_if_missing must not build at actor_model_name_or_path, or None. The recipes build a tiny toy
    policy (about 0.6 M parameters) wherever the path does not exist yet: a config copied from quickstart.yaml
    keeps the key, and a mistyped path to a real model (.../Qwen2.5-1.5B-Instruc) or a hub ID would get that toy
    built there and trained. So a missing path whose name looks like a real model's is refused, not built."""
    path = cfg.actor_model_name_or_path.strip()
    if not cfg.build_actor_if_missing or not path or os.path.isdir(path):
        return None
    marks = real_model_name_marks(path)
    if not marks:
        return None
    where = given.get("actor_model_name_or_path")
    recipe_where = given.get("build_actor_if_missing")
    relative = "" if os.path.isabs(path) else f" (relative to the working directory {os.getcwd()})"
    return (f"{where + ': ' if where else ''}key 'actor_model_name_or_path' = {path!r}: does not exist{relative}, "
            f"and build_actor_if_missing: {cfg.build_actor_if_missing}"
            f"{' (' + recipe_where + ')' if recipe_where else ''} would build the {cfg.build_actor_if_missing!r} "
            "recipe's tiny toy policy (about 0.6 M parameters) there and train it; its name looks like a real "
            f"model's ({', '.join(repr(m) for m in marks)}), so it is not built. Check the path (a directory written "
            "by save_pretrained, or a hub ID such as Qwen/Qwen2.5-1.5B-Instruct) and set build_actor_if_missing: '' "
            "for your own model; to build the toy policy, name a path that does not look like a model's (the "
            "quickstart's is build/quickstart_policy)")
