"""The policy loss a run trains with, as resolved (policy_loss, else importance_sampling_level), its bounds and
options, the entropy bonus (fixed or adaptive) and the masking of truncated completions."""
from __future__ import annotations

from typing import List

from ..config import Config, yaml_value


def policy_loss_lines(cfg: Config) -> List[str]:
    """The dry run's lines on the policy's loss: which loss and why, its ratio level, aggregation, the clip keys it
    reads and its options; the entropy bonus; mask_truncated_completions when on."""
    from ..algorithms import resolve_policy_loss  # paddle: imported when the dry run runs

    spec = resolve_policy_loss(cfg.policy_loss, cfg.importance_sampling_level)
    why = ("policy_loss" if cfg.policy_loss is not None else
           f"policy_loss unset: importance_sampling_level {cfg.importance_sampling_level}'s loss")
    derived = getattr(cfg, "_derived", {})
    agg = f"loss_agg_mode {cfg.loss_agg_mode}" + (f" ({derived['loss_agg_mode']})" if "loss_agg_mode" in derived
                                                  else "")
    values = {"clip_range_ratio_low": cfg.eps_low, "clip_range_ratio_high": cfg.eps_high}
    bounds = ", ".join(f"{key} {yaml_value(values[key])}" for key in spec.clip_keys) or "no clip range"
    if spec.dual_clip and cfg.clip_ratio_c is not None:
        bounds += f", dual-clip clip_ratio_c {yaml_value(cfg.clip_ratio_c)}"
    options = ", ".join(f"{key} {yaml_value(getattr(cfg, key))}" for key in spec.config_keys)
    lines = [f"policy loss: {spec.name} ({why}): {spec.summary}; ratio per {spec.ratio_level}, {agg}; {bounds}"
             + (f"; {options}" if options else "")]
    if cfg.entropy_target is not None:
        lines.append(f"entropy bonus: adaptive, from entropy_coeff {yaml_value(cfg.entropy_coeff)} toward "
                     f"entropy_target {yaml_value(cfg.entropy_target)} by entropy_coeff_lr "
                     f"{yaml_value(cfg.entropy_coeff_lr)} per step, applied while the entropy is at or below the "
                     "target (train/entropy_coeff)")
    elif cfg.entropy_coeff > 0:
        lines.append(f"entropy bonus: entropy_coeff {yaml_value(cfg.entropy_coeff)} (fixed)")
    if cfg.mask_truncated_completions:
        lines.append(f"mask_truncated_completions: completions that reach max_dec_len {cfg.max_dec_len} without an "
                     "end token are left out of the policy's loss")
    return lines
