"""The adaptive entropy coefficient: an entropy bonus whose coefficient follows the policy's entropy toward a
target (Skywork-OR1 technical report, arXiv 2505.22312, "adaptive entropy control").

The rule, once per training step k with the step's measured token-mean entropy e_k (train/entropy):

    c_{k+1} = max(0, c_k + delta)   if e_k < target
              max(0, c_k - delta)   if e_k > target      (c_k unchanged when e_k == target)
    alpha_{k+1} = c_{k+1} if e_k <= target else 0

`c` is the controller's state (c_0 = the configured entropy_coeff), `alpha` the coefficient of the entropy bonus
`-alpha H` the next step's loss applies: the bonus pushes the entropy up only while it is at or below the target,
so it cannot make the entropy run away above it. Skywork-OR1 uses target 0.2 and delta 0.005 (config keys
entropy_target, entropy_coeff_lr). A bang-bang rule rather than SAC's gradient step on log(alpha): the entropy of a
language model's tokens moves slowly and over orders of magnitude, and a fixed step keeps the coefficient's range
predictable.
"""
import math
from typing import Tuple


def adaptive_entropy_coeff(coeff: float, applied: float, entropy: float, target: float,
                           step_size: float) -> Tuple[float, float]:
    """`(c_{k+1}, alpha_{k+1})` of the rule above from `coeff` = c_k, `applied` = alpha_k and the step's measured
    `entropy` = e_k. A non-finite entropy (no mini-batch measured it: every one had nothing to learn) changes
    nothing."""
    if not math.isfinite(entropy):
        return coeff, applied
    if entropy < target:
        coeff = coeff + step_size
    elif entropy > target:
        coeff = max(0.0, coeff - step_size)
    return coeff, coeff if entropy <= target else 0.0
