"""Per-token estimators of KL(pi_theta || pi_ref) from sampled tokens (Schulman, "Approximating KL divergence").

With `d = l^ref - l` (log-probs of the sampled token; `l^old` in place of `l` when the KL enters the reward):
  k1 = -d                  unbiased, high variance, can be negative
  k2 = d^2 / 2             biased, low variance
  k3 = exp(d) - d - 1      unbiased, low variance, always >= 0 (GRPO / DeepSeekMath 2402.03300)
`d` is clamped to [-20, 20] before use so exp cannot overflow, and the estimate to [-10, 10] so one wild token
cannot dominate the loss. (For every estimator the clamp on `d` changes nothing the outer clamp would not:
|d| > 20 already gives |k| > 10.)
"""
import paddle

from ._common import TensorLike, as_float, compute_dtype
from .registry import unknown_name

KL_ESTIMATORS = ("k1", "k2", "k3")
_D_CLAMP = 20.0
_KL_CLAMP = 10.0


def kl_penalty(logprob: TensorLike, ref_logprob: TensorLike, estimator: str = "k3") -> paddle.Tensor:
    """Per-token KL estimate.

    Args:
        logprob: `[bs, T]` log-probs of the sampled tokens under the policy (current, or old in the reward).
        ref_logprob: `[bs, T]` log-probs of the same tokens under the reference policy.
        estimator: one of `KL_ESTIMATORS`.
    Returns:
        `[bs, T]` float32 (float64 for float64 input), not masked: mask it / aggregate it with `aggregate_loss`.
        Differentiable w.r.t. `logprob` (zero gradient where a clamp is active).
    """
    if estimator not in KL_ESTIMATORS:
        raise unknown_name("KL estimator", estimator, KL_ESTIMATORS)
    dtype = compute_dtype(logprob, ref_logprob)
    d = paddle.clip(as_float(ref_logprob, dtype) - as_float(logprob, dtype), -_D_CLAMP, _D_CLAMP)
    if estimator == "k1":
        kl = -d
    elif estimator == "k2":
        kl = 0.5 * d * d
    else:
        kl = paddle.exp(d) - d - 1.0
    return paddle.clip(kl, -_KL_CLAMP, _KL_CLAMP)
