"""The policy-loss keys together: `policy_loss` against importance_sampling_level, loss_agg_mode and
clip_ratio_c, the ranges of the losses' own keys and of the entropy control (called by validation.validate)."""
from __future__ import annotations

from typing import Callable, Dict

from .flat import Config

Report = Callable[[str, str], None]  # (key, message): validate's `bad` / `fail`


def check_policy_loss_values(cfg: Config, bad: Report) -> None:
    """The ranges of the losses' options and of the entropy control's keys, each error through `bad`."""
    for key in ("sapo_temperature_pos", "sapo_temperature_neg"):
        if not getattr(cfg, key) > 0:
            bad(key, "must be greater than 0 (the gate is sigmoid(tau (r - 1)) 4 / tau)")
    for key in ("clip_cov_ratio", "kl_cov_ratio"):
        if not 0 < getattr(cfg, key) <= 1:
            bad(key, "must be in (0, 1] (a share of the valid tokens)")
    for key in ("ppo_kl_coef", "entropy_coeff_lr"):
        if getattr(cfg, key) < 0:
            bad(key, "must not be negative")
    if cfg.entropy_target is not None and cfg.entropy_target < 0:
        bad("entropy_target", "must not be negative (an entropy; unset: the fixed entropy_coeff)")


def apply_policy_loss(cfg: Config, given: Dict[str, str], known: bool, fail: Report) -> None:
    """Refuse a combination that contradicts the policy loss (`fail`), then give the keys the loss fixes its value
    when the file and command line leave them out: importance_sampling_level the loss's ratio level (so that an
    unset rollout_correction_level is GSPO's geometric one for gspo and gmpo too) and loss_agg_mode the loss's own
    mode (gmpo, sapo), each noted in the resolved configuration. `known`: `given` says where every key was set;
    else a key counts as set when it differs from its default."""
    from ..algorithms import available_policy_losses, policy_loss_spec, resolve_policy_loss  # paddle: see fields

    spec = resolve_policy_loss(cfg.policy_loss, cfg.importance_sampling_level)
    defaults = Config()

    def is_set(key: str) -> bool:
        return key in given if known else getattr(cfg, key) != getattr(defaults, key)

    name = f"policy_loss {spec.name}"
    if cfg.clip_ratio_c is not None and not spec.dual_clip:
        dual = ", ".join(n for n in available_policy_losses() if policy_loss_spec(n).dual_clip)
        fail("clip_ratio_c", f"dual-clip does not apply to {name} (only to policy_loss {dual}); leave clip_ratio_c "
                             "unset")
    derived = getattr(cfg, "_derived", None)
    if derived is None:
        derived = cfg._derived = {}
    if cfg.policy_loss is not None:
        if is_set("importance_sampling_level") and cfg.importance_sampling_level != spec.ratio_level:
            fail("importance_sampling_level", f"contradicts {name}, whose ratio is per {spec.ratio_level}; leave "
                                              f"it unset or set {spec.ratio_level}")
        if cfg.importance_sampling_level != spec.ratio_level:
            cfg.importance_sampling_level = spec.ratio_level
            derived["importance_sampling_level"] = f"not set: {name}'s ratio level"
    if spec.loss_agg_mode is not None and cfg.loss_agg_mode != spec.loss_agg_mode:
        if is_set("loss_agg_mode"):
            fail("loss_agg_mode", f"contradicts {name}, which is defined with loss_agg_mode {spec.loss_agg_mode!r} "
                                  "(its paper's and verl's); leave it unset or set that")
        cfg.loss_agg_mode = spec.loss_agg_mode
        derived["loss_agg_mode"] = f"not set: {name}'s own aggregation"
