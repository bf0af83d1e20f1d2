"""What a key does in a run: its statement per device, the keys this run's choices make inert (critic keys without
a critic, tool keys without tools, ...), and the one-line warnings for keys that have no effect here."""
from __future__ import annotations

from typing import Dict, List

from .fields import VISUALDL_STANDS_IN, Effect, off
from .flat import FIELDS, Config


def key_effect(key: str, device: str) -> Effect:
    """The effect of config key `key` on `device` ("cpu" or "gpu")."""
    return FIELDS[key].metadata["effect"][device]


# PaddleNLP's `sharding_parallel_config` options -> what they do here (None: what this trainer always does).
SHARDING_OPTIONS = {
    "enable_release_grads": None,  # gradients are released (not zeroed) after every optimizer step anyway
    "enable_stage1_tensor_fusion": "a GPU communication optimisation; gradients are reduced parameter by parameter",
    "enable_stage1_overlap": "a GPU communication optimisation; the reduction runs after the backward pass",
    "enable_stage1_broadcast_overlap": "a GPU communication optimisation; parameters are broadcast after the step",
    "enable_stage1_allgather_overlap": "applies to split_param (sharding V2), which is not supported",
    "enable_stage2_overlap": "applies to sharding stage2, which is not supported",
    "disable_stage1_reduce_avg": "gradients are summed with the trainer's own scaling (docs/distributed.md)",
    "enable_fuse_optimizer_states": "fleet's stage1 optimizer does not support it",
    "split_param": None,  # rejected at start-up with more than one process (distributed.unsupported_layout)
}


def sharding_options(cfg: Config) -> List[str]:
    """The options in `sharding_parallel_config`, split as PaddleNLP splits them (by commas if any, else spaces)."""
    text = cfg.sharding_parallel_config
    return [x.strip() for x in (text.split(",") if "," in text else text.split(" ")) if x.strip()]


def inert_key_messages(cfg: Config, given: Dict[str, str], device: str) -> List[str]:
    """One line per key set (file or command line) that does not do here what it says on `device`, and why.

    Keys with no effect are reported when set to a non-default value (they default to off, so setting one on is
    always reported); so are the values that run as something else (report_to wandb, sharding stage2) and kl_coeff
    under a GRPO-family estimator without use_kl_in_reward."""
    defaults = Config()
    out = []
    for key, where in given.items():
        if where.startswith("$"):  # a token taken from an exported variable: the shell's, not this config's
            continue
        effect = run_key_effect(cfg, key, device)
        if not effect.active and getattr(cfg, key) != getattr(defaults, key):
            out.append(f"{where}: key '{key}' has no effect here: {effect.note}")
    if cfg.report_to in VISUALDL_STANDS_IN:
        out.append(f"{given.get('report_to', 'report_to')}: report_to '{cfg.report_to}' is not available here; "
                   "metrics go to VisualDL (logging_dir) and metrics.jsonl instead")
    if cfg.sharding == "stage2":
        out.append(f"{given.get('sharding', 'sharding')}: sharding 'stage2' runs as stage1 (optimizer states "
                   "sharded): stage2 would also shard the gradients, saving (n-1)/n of their memory on each of n "
                   "sharding ranks, and is not implemented here")
    if "sharding_parallel_config" in given:
        for option in sharding_options(cfg):
            if SHARDING_OPTIONS.get(option):
                out.append(f"{given['sharding_parallel_config']}: key 'sharding_parallel_config': option "
                           f"'{option}' has no effect here: {SHARDING_OPTIONS[option]}")
    out.extend(reward_kl_notes(cfg, given))
    out.extend(group_size_notes(cfg, given))
    for key in ("normalize_reward", "normalize_advantage"):  # PaddleNLP forces both off for GRPO
        if key in given and getattr(cfg, key) and not cfg._normalization_keys_apply:
            out.append(f"{given[key]}: key '{key}' has no effect here: rl_algorithm {cfg.rl_algorithm!r} normalises "
                       "each group's rewards itself, and PaddleNLP sets normalize_reward and normalize_advantage to "
                       "false for GRPO whatever the config says (its TrainingArguments.__post_init__); so does "
                       "paddle_grpo, so that a PaddleNLP GRPO config trains the same")
    return out


# The critic's keys: they have an effect only when the estimator takes values (Config.needs_critic).
CRITIC_KEYS = ("critic_model_name_or_path", "critic_learning_rate", "critic_min_learning_rate",
               "critic_lr_scheduler_type", "critic_weight_decay", "critic_warmup_ratio", "pretrain_critic_steps",
               "per_device_value_batch_size", "clip_range_value")
CONSTANT_SCHEDULES = ("constant", "constant_with_warmup")
# The tool keys other than `tools`: an effect only with tools (multi-turn rollouts).
TOOL_KEYS = ("max_turns", "tool_timeout_s", "tool_max_workers", "tool_format", "max_tool_response_len",
             "tool_server", "tool_server_token", "tool_server_max_unanswered", "tool_sandbox")


def run_key_notes(cfg: Config) -> Dict[str, str]:
    """Key -> why it has no effect in this run, whatever the device: the critic's keys when the estimator trains no
    critic, an estimator option (gamma, lam, norm_adv_by_std, ...) the chosen estimator does not take, a decay floor
    under a schedule that does not decay, the positive examples' threshold without their loss, the rollout
    correction's bounds its mode does not read. Read from the estimator registry's specs, not from algorithm
    names."""
    from ..algorithms import advantage_estimator_spec, available_advantage_estimators  # paddle: see _from_algorithms
    specs = [advantage_estimator_spec(name) for name in available_advantage_estimators()]
    algorithm, notes = repr(cfg.rl_algorithm), {}
    users: Dict[str, List[str]] = {}
    for spec in specs:
        for key in spec.config_keys:
            users.setdefault(key, []).append(spec.name)
    mine = cfg._estimator.config_keys
    for key, names in users.items():
        if key not in mine:
            notes[key] = f"rl_algorithm {algorithm} does not take it (an option of rl_algorithm {', '.join(names)})"
    if not cfg.needs_critic:
        with_critic = ", ".join(spec.name for spec in specs if spec.needs_values)
        for key in CRITIC_KEYS:
            notes[key] = (f"rl_algorithm {algorithm} trains no critic (value model): its advantages need no values "
                          f"(rl_algorithm {with_critic} train one)")
    elif cfg.critic_setting("critic_lr_scheduler_type") in CONSTANT_SCHEDULES:
        schedule = cfg.critic_setting("critic_lr_scheduler_type")
        source = (f"critic_lr_scheduler_type {schedule!r}" if cfg.critic_lr_scheduler_type else
                  f"the critic's schedule, lr_scheduler_type {schedule!r} (critic_lr_scheduler_type is unset),")
        notes["critic_min_learning_rate"] = f"{source} does not decay (linear and cosine decay to it)"
    if cfg.lr_scheduler_type in CONSTANT_SCHEDULES:
        notes["min_learning_rate"] = (f"lr_scheduler_type {cfg.lr_scheduler_type!r} does not decay (linear and "
                                      "cosine decay to it)")
    if not cfg.tools:
        for key in TOOL_KEYS:
            notes[key] = "tools is empty: rollouts are single-turn (one completion per prompt, no tool calls)"
    elif not cfg.tool_server.strip():
        for key in ("tool_server_token", "tool_server_max_unanswered"):
            notes[key] = "tool_server is empty: the tools run in the trainer's process"
    else:
        notes["tool_sandbox"] = "the tools run on tool_server: its own --sandbox sets their isolation"
    mode = cfg.correction_mode  # unset: from async_rollout and rollout_lag (Config.correction_mode)
    if mode == "none":
        for key in ("rollout_correction_cap", "rollout_correction_min", "rollout_correction_level"):
            notes[key] = "rollout_correction is 'none': the policy loss is not weighted by the sampler's ratio"
    elif mode == "clip":
        for key in ("rollout_correction_cap", "rollout_correction_min", "rollout_correction_level"):
            notes[key] = ("rollout_correction 'clip' takes PPO's ratio against the sampler's log-probs: "
                          "clip_range_ratio (_low, _high) bounds it, no weight is applied")
    elif mode != "mis":
        notes["rollout_correction_min"] = (f"rollout_correction {mode!r} only caps the ratio from "
                                           "above (rollout_correction mis drops the tokens below this bound)")
    if not cfg.async_rollout:
        for key in ("rollout_lag", "rollout_worker_timeout_s", "rollout_worker_reference", "rollout_worker_threads"):
            notes[key] = "async_rollout is off: the trainer samples each step's batch itself"
    elif cfg.rollout_worker_reference and not cfg.needs_reference_model:
        notes["rollout_worker_reference"] = ("no KL term (kl_loss_coeff and reward_kl_coeff are 0): no reference "
                                             "log-probs are computed")
    elif cfg.rollout_worker_reference and cfg.sync_ref_model:
        notes["rollout_worker_reference"] = ("sync_ref_model mixes the policy into the trainer's reference: the "
                                             "trainer computes the reference log-probs")
    notes.update(policy_loss_notes(cfg))
    if not cfg.teacher_model_name_or_path.strip():
        for key in ("opd_kl_coeff", "opd_only", "opd_kl_estimator"):
            notes[key] = "teacher_model_name_or_path is empty: no on-policy distillation"
    if cfg.positive_lm_coeff <= 0:
        notes["positive_example_min_reward"] = ("the positive-example LM loss is off (positive_example_lm_coeff "
                                                "0; rl_algorithm vapo turns it on)")
    return notes


def policy_loss_notes(cfg: Config) -> Dict[str, str]:
    """Key -> why it has no effect with this run's policy loss: another loss's options, the clip keys the loss does
    not read (PolicyLossSpec.clip_keys), entropy_coeff_lr without entropy_target."""
    from ..algorithms import available_policy_losses, policy_loss_spec, resolve_policy_loss
    spec = resolve_policy_loss(cfg.policy_loss, cfg.importance_sampling_level)
    notes, users = {}, {}
    for name in available_policy_losses():
        for key in policy_loss_spec(name).config_keys:
            users.setdefault(key, []).append(name)
    for key, names in users.items():
        if key not in spec.config_keys:
            notes[key] = f"policy_loss {spec.name} does not take it (an option of policy_loss {', '.join(names)})"
    for key in ("clip_range_ratio_low", "clip_range_ratio_high"):
        if key not in spec.clip_keys:
            notes[key] = f"policy_loss {spec.name} does not read it ({spec.summary})"
    if not spec.clip_keys:
        notes["clip_range_ratio"] = f"policy_loss {spec.name} has no clip range ({spec.summary})"
    if cfg.entropy_target is None:
        notes["entropy_coeff_lr"] = "entropy_target is unset: the entropy coefficient is the fixed entropy_coeff"
    return notes


def run_key_effect(cfg: Config, key: str, device: str) -> Effect:
    """The effect of `key` in the run `cfg` configures on `device`: its device statement (key_effect) when that
    says no effect, else off with run_key_notes' reason when it has one, else the device statement."""
    effect = key_effect(key, device)
    if not effect.active:
        return effect
    note = run_key_notes(cfg).get(key)
    return off(note) if note else effect


def reward_kl_notes(cfg: Config, given: Dict[str, str]) -> List[str]:
    """One line for each of `kl_coeff` / `use_kl_in_reward` set (file or command line) where it has no effect on
    the reward: `kl_coeff` with a group estimator (grpo, rloo) without `use_kl_in_reward`, as in PaddleNLP's GRPO;
    `use_kl_in_reward` with an estimator that always takes the KL per token, or with `kl_coeff` 0."""
    from ..algorithms import advantage_estimator_spec  # paddle: see _from_algorithms
    out = []
    per_token = advantage_estimator_spec(cfg.rl_algorithm).reward_kl_per_token
    if "kl_coeff" in given and cfg.kl_coeff != 0 and cfg.reward_kl_coeff == 0:
        out.append(f"{given['kl_coeff']}: key 'kl_coeff' has no effect here: rl_algorithm {cfg.rl_algorithm!r} "
                   "keeps the reference KL out of the reward, as PaddleNLP's GRPO does (its KL is kl_loss_coeff); "
                   "set use_kl_in_reward: true to subtract kl_coeff * KL from each sequence reward")
    if "use_kl_in_reward" in given and cfg.use_kl_in_reward and (per_token or cfg.kl_coeff == 0):
        why = (f"rl_algorithm {cfg.rl_algorithm!r} always puts kl_coeff * KL in the reward, per token" if per_token
               else "kl_coeff is 0")
        out.append(f"{given['use_kl_in_reward']}: key 'use_kl_in_reward' has no effect here: {why}")
    return out


def group_size_notes(cfg: Config, given: Dict[str, str]) -> List[str]:
    """One line when `rollout_n` is 1 under an estimator that compares the samples of a prompt (its registry spec's
    `uses_groups`): every group then holds one sample, and the line says what the estimator computes instead
    (`EstimatorSpec.group_of_one`). A caveat, not "no effect": the run trains, on other advantages than the name
    suggests. Estimators that cannot work with one sample (rloo: `min_group_size` 2) are refused by validate."""
    from ..algorithms import advantage_estimator_spec  # paddle: see _from_algorithms
    spec = advantage_estimator_spec(cfg.rl_algorithm)
    if cfg.rollout_n != 1 or not spec.uses_groups:
        return []
    becomes = spec.group_of_one or "its group statistics see one sample each"
    return [f"{given.get('rollout_n', 'rollout_n')}: key 'rollout_n' is 1 with rl_algorithm {cfg.rl_algorithm!r}, "
            f"which compares the samples of each prompt's group: every group holds one sample, so {becomes}; "
            "set rollout_n to 2 or more for group-relative advantages"]
