"""Policy losses, loss aggregation, and the per-token quantities computed from logits (log-probs, entropy).

Everything here is a pure function of paddle tensors, computed in float32 (float64 if an input is float64) whatever
the input dtype; `[bs, T]` tensors are per token of the response, `response_mask` is non-zero on valid tokens.
"""
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import paddle

from ._common import TensorLike, as_float, as_mask, check_same_shape, compute_dtype, gather_last, masked
from .registry import PolicyLossSpec, Registry, unknown_name

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
_LOG_RATIO_CLAMP = 20.0


# ---- aggregation ----------------------------------------------------------------------------------------------------

def _divide(numerator: paddle.Tensor, denominator, dtype: str) -> paddle.Tensor:
    # Counts are integers, so clamping at 1 only turns 0/0 (nothing valid) into 0 instead of NaN.
    if isinstance(denominator, paddle.Tensor):
        return numerator / paddle.clip(denominator.astype(dtype), min=1.0)
    return numerator / max(float(denominator), 1.0)


def aggregate_loss(loss_mat: TensorLike, loss_mask: TensorLike, loss_agg_mode: str = "token-mean",
                   num_global_tokens: Union[int, float, paddle.Tensor, None] = None,
                   num_global_seqs: Union[int, float, paddle.Tensor, None] = None,
                   max_dec_len: Optional[int] = None) -> paddle.Tensor:
    """Reduce a per-token loss `[bs, T]` to a scalar (0-D tensor) over the valid tokens of `loss_mask`.

    Modes (docs/algorithms.md section 5):
      token-mean               sum_{i,t} m L / sum_{i,t} m           (DAPO, arXiv 2503.14476)
      seq-mean-token-mean      mean over sequences with >= 1 valid token of sum_t m L / sum_t m   (GRPO paper)
      seq-mean-token-sum       mean over all sequences of sum_t m L
      seq-mean-token-sum-norm  sum_{i,t} m L / (num_seqs * max_dec_len)   (Dr.GRPO, arXiv 2503.20783)

    Why global denominators: every mode is a sum of per-token or per-sequence terms divided by a batch-level count
    (tokens, or sequences). Dividing each micro-batch's sum by ITS OWN count and then averaging micro-batches and
    ranks weights tokens differently depending on how the batch happened to be split (a micro-batch of short
    answers would count as much as one of long answers). When `num_global_tokens` / `num_global_seqs` hold the
    count for the whole global mini-batch (all micro-batches, all data-parallel ranks; see `global_denominators`),
    each call returns only this micro-batch's SHARE `local sum / global count`, and the shares of all
    micro-batches and ranks add up to exactly the whole-batch value - so loss and gradient do not depend on the
    split (as OpenRLHF does). The caller must therefore SUM shares: accumulate gradients without dividing by the
    number of micro-batches, and undo the data-parallel gradient averaging (multiply by world size, or sum).

    `num_global_seqs` counts sequences with >= 1 valid token for `seq-mean-token-mean` and all sequences for the
    token-sum modes. Without the global counts, the local ones are used (the whole-batch value of this batch).
    `max_dec_len` is required by `seq-mean-token-sum-norm` and ignored by the other modes (so a caller can always
    pass it, whatever the mode). Masked positions never contribute, even if inf/NaN.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise unknown_name("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    dtype = compute_dtype(loss_mat)
    loss = as_float(loss_mat, dtype)
    mask = as_mask(loss_mask, dtype)
    check_same_shape(loss_mat=loss, loss_mask=mask)
    per_token = masked(loss, mask)

    if loss_agg_mode == "token-mean":
        denominator = mask.sum() if num_global_tokens is None else num_global_tokens
        return _divide(per_token.sum(), denominator, dtype)

    tokens_per_seq = mask.sum(-1)
    if loss_agg_mode == "seq-mean-token-mean":
        per_seq = per_token.sum(-1) / paddle.clip(tokens_per_seq, min=1.0)
        denominator = (tokens_per_seq > 0).astype(dtype).sum() if num_global_seqs is None else num_global_seqs
        return _divide(per_seq.sum(), denominator, dtype)

    num_seqs = loss.shape[0] if num_global_seqs is None else num_global_seqs
    if loss_agg_mode == "seq-mean-token-sum":
        return _divide(per_token.sum(), num_seqs, dtype)

    if max_dec_len is None or max_dec_len <= 0:
        raise ValueError(f"loss_agg_mode 'seq-mean-token-sum-norm' needs max_dec_len > 0, got {max_dec_len!r}")
    return _divide(per_token.sum(), num_seqs * max_dec_len, dtype)


def global_denominators(response_mask: TensorLike, loss_agg_mode: str = "token-mean") -> Dict[str, int]:
    """This micro-batch's contribution to the global counts `aggregate_loss` needs.

    Returns `{"num_global_tokens": valid tokens, "num_global_seqs": sequences}` as python ints, where sequences
    counts rows with >= 1 valid token for `seq-mean-token-mean` and all rows otherwise. The trainer sums these over
    the micro-batches of a mini-batch and all-reduces (SUM) them over data-parallel ranks, then passes the dict as
    keyword arguments to `aggregate_loss` / `compute_policy_loss` for every micro-batch of that mini-batch.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise unknown_name("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    mask = as_mask(response_mask, "float32")
    tokens_per_seq = mask.sum(-1)
    if loss_agg_mode == "seq-mean-token-mean":
        num_seqs = int((tokens_per_seq > 0).astype("int64").sum())
    else:
        num_seqs = int(mask.shape[0])
    return {"num_global_tokens": int(tokens_per_seq.sum()), "num_global_seqs": num_seqs}


def masked_mean(values: TensorLike, mask: TensorLike) -> paddle.Tensor:
    """Mean of `values` over valid positions (0 when nothing is valid)."""
    dtype = compute_dtype(values)
    mask = as_mask(mask, dtype)
    return _divide(masked(as_float(values, dtype), mask).sum(), mask.sum(), dtype)


# ---- policy losses --------------------------------------------------------------------------------------------------

_POLICY_LOSSES = Registry("policy loss", PolicyLossSpec)


def register_policy_loss(name: str, *, importance_sampling_level: Optional[str] = None,
                         needs_old_log_probs: bool = True, advantage_weighted: bool = False,
                         config_options: Sequence[Any] = (), ratio_level: Optional[str] = None,
                         loss_agg_mode: Optional[str] = None,
                         clip_keys: Sequence[str] = ("clip_range_ratio_low", "clip_range_ratio_high"),
                         dual_clip: bool = False) -> Callable[[Callable], Callable]:
    """Decorator registering a policy loss under `name` with its `PolicyLossSpec` fields (see there). With an
    `importance_sampling_level` the loss becomes that config value of `importance_sampling_level`; one level has
    one loss. `ratio_level` defaults to "sequence" for the level "sequence", else "token"."""
    if importance_sampling_level is not None:
        taken = importance_sampling_levels().get(importance_sampling_level)
        if taken is not None and taken != name:
            raise ValueError(f"importance_sampling_level {importance_sampling_level!r} is already implemented by "
                             f"policy loss {taken!r}")
    if loss_agg_mode is not None and loss_agg_mode not in LOSS_AGG_MODES:
        raise unknown_name("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    return _POLICY_LOSSES.register(name, importance_sampling_level=importance_sampling_level,
                                   needs_old_log_probs=needs_old_log_probs, advantage_weighted=advantage_weighted,
                                   config_options=tuple(config_options),
                                   ratio_level=ratio_level or ("sequence" if importance_sampling_level == "sequence"
                                                               else "token"),
                                   loss_agg_mode=loss_agg_mode, clip_keys=tuple(clip_keys), dual_clip=dual_clip)


def unregister_policy_loss(name: str) -> None:
    """Remove `name` from the registry (an unknown name raises `UnknownNameError`)."""
    _POLICY_LOSSES.unregister(name)


def policy_loss_spec(name: str) -> PolicyLossSpec:
    """The spec registered as `name` ("vanilla"/"clip", "gspo", ...); an unknown name raises `UnknownNameError`
    listing the valid ones."""
    return _POLICY_LOSSES.spec(name)


def get_policy_loss(name: str) -> Callable:
    """The policy loss registered as `name` (`policy_loss_spec(name).fn`). A policy loss is `fn(log_prob,
    old_log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c, **options) ->
    (pg_losses [bs, T], {"clip_low"|"clip_high"|"clip_dual": bool [bs, T]})`; a missing key counts as all False."""
    return _POLICY_LOSSES.get(name)


def available_policy_losses() -> Tuple[str, ...]:
    """All registered policy-loss names in registration order."""
    return _POLICY_LOSSES.names()


def importance_sampling_levels() -> Dict[str, str]:
    """`{importance_sampling_level: policy loss name}` over the registered losses, in registration order
    (built-ins: token -> vanilla, sequence -> gspo)."""
    return {spec.importance_sampling_level: spec.name for spec in _POLICY_LOSSES.specs()
            if spec.importance_sampling_level is not None}


def resolve_policy_loss(policy_loss: Optional[str], importance_sampling_level: str = "token") -> PolicyLossSpec:
    """The spec of the loss a run uses: `policy_loss` (any registered name) when set, else the loss of
    `importance_sampling_level` ("token" -> vanilla, "sequence" -> gspo) or a loss registered under that name.
    An unknown name raises `UnknownNameError` listing the valid ones."""
    if policy_loss is not None:
        return policy_loss_spec(policy_loss)
    levels = importance_sampling_levels()
    name = levels.get(importance_sampling_level, importance_sampling_level)
    if name not in _POLICY_LOSSES:
        raise unknown_name("importance_sampling_level / policy loss", importance_sampling_level,
                           list(levels) + list(available_policy_losses()))
    return policy_loss_spec(name)


def token_log_ratio(log_prob: paddle.Tensor, old_log_prob: paddle.Tensor,
                    response_mask: paddle.Tensor) -> paddle.Tensor:
    """`clamp(l_t - l^old_t, -20, 20)` per token `[bs, T]`, 0 on padding: garbage there (inf - inf) cannot put NaN
    into the backward pass, and the clamp keeps `exp` finite (its gradient is 0 beyond +-20, never reached by a
    trained policy)."""
    return paddle.clip(masked(log_prob - old_log_prob, response_mask), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)


def clipped_surrogate(ratio: paddle.Tensor, advantages: paddle.Tensor, clip_ratio_low: float, clip_ratio_high: float,
                      clip_ratio_c: Optional[float]) -> Tuple[paddle.Tensor, Dict[str, paddle.Tensor]]:
    """PPO clip (with asymmetric clip-higher, DAPO) and optional dual-clip (arXiv 1912.09729), per token."""
    unclipped = -advantages * ratio
    clipped = -advantages * paddle.clip(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss = paddle.maximum(unclipped, clipped)
    negative = advantages < 0
    info = {
        # Where the clipped branch is the active one the token's gradient is 0.
        "clip_low": negative & (ratio < 1.0 - clip_ratio_low),
        "clip_high": (advantages > 0) & (ratio > 1.0 + clip_ratio_high),
    }
    if clip_ratio_c is not None:
        dual_bound = -clip_ratio_c * advantages
        info["clip_dual"] = negative & (dual_bound < loss)
        loss = paddle.where(negative, paddle.minimum(loss, dual_bound), loss)
    else:
        info["clip_dual"] = paddle.zeros_like(negative)
    return loss, info


@register_policy_loss("vanilla", importance_sampling_level="token", advantage_weighted=True, dual_clip=True)
@register_policy_loss("clip", advantage_weighted=True, dual_clip=True)
def vanilla_policy_loss(log_prob: paddle.Tensor, old_log_prob: paddle.Tensor, advantages: paddle.Tensor,
                        response_mask: paddle.Tensor, clip_ratio_low: float, clip_ratio_high: float,
                        clip_ratio_c: Optional[float]) -> Tuple[paddle.Tensor, Dict[str, paddle.Tensor]]:
    """Token-level PPO-clip surrogate (GRPO, arXiv 2402.03300): `rho_t = exp(clamp(l_t - l^old_t, -20, 20))`,
    `L_t = max(-A_t rho_t, -A_t clip(rho_t, 1 - eps_low, 1 + eps_high))`, dual-clipped when `clip_ratio_c`."""
    ratio = paddle.exp(token_log_ratio(log_prob, old_log_prob, response_mask))
    return clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high, clip_ratio_c)


@register_policy_loss("gspo", importance_sampling_level="sequence", advantage_weighted=True, dual_clip=True)
def gspo_policy_loss(log_prob: paddle.Tensor, old_log_prob: paddle.Tensor, advantages: paddle.Tensor,
                     response_mask: paddle.Tensor, clip_ratio_low: float, clip_ratio_high: float,
                     clip_ratio_c: Optional[float]) -> Tuple[paddle.Tensor, Dict[str, paddle.Tensor]]:
    """GSPO (arXiv 2507.18071): the ratio of every token of sequence i is the sequence-level
    `s_i = exp(clamp(mean_t m_t (l_t - l^old_t), -20, 20))`, clipped per sequence.

    When the advantage is constant within each sequence (outcome rewards: grpo, rloo), the gradient of this direct
    form equals that of GSPO-token's `sg[s_i] * exp(l_t - sg[l_t])` under every aggregation mode here, since all
    tokens of a sequence carry the same weight."""
    mask = response_mask
    seq_log_ratio = masked(log_prob - old_log_prob, mask).sum(-1) / paddle.clip(mask.sum(-1), min=1.0)
    seq_log_ratio = paddle.clip(seq_log_ratio, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = paddle.exp(seq_log_ratio).unsqueeze(-1).expand_as(log_prob)
    return clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high, clip_ratio_c)


def compute_policy_loss(log_prob: TensorLike, old_log_prob: TensorLike, advantages: TensorLike,
                        response_mask: TensorLike, clip_ratio_low: float = 0.2,
                        clip_ratio_high: float = 0.2, clip_ratio_c: Optional[float] = None,
                        importance_sampling_level: str = "token", loss_agg_mode: Optional[str] = None,
                        token_weights: Optional[TensorLike] = None, policy_loss: Optional[str] = None,
                        loss_options: Optional[Dict[str, Any]] = None,
                        **agg_kwargs: object) -> Dict[str, paddle.Tensor]:
    """A policy-gradient loss by name (docs/algorithms.md section 4): PPO clip, GSPO, CISPO, GMPO, SAPO, Clip-Cov,
    KL-Cov.

    Args:
        log_prob: `[bs, T]` log-probs of the sampled tokens under the current policy (carries the gradient).
        old_log_prob: `[bs, T]` log-probs under the sampling policy. Treated as a constant (detached here). With
            one update per rollout pass `log_prob.detach()`: the ratio is then exactly 1 and the gradient is the
            REINFORCE gradient `-A grad(l)` (TRL's `exp(l - l.detach())`).
        advantages: `[bs, T]`, treated as a constant.
        response_mask: `[bs, T]`, non-zero on valid tokens.
        clip_ratio_low / clip_ratio_high: eps_low / eps_high of `clip(rho, 1 - eps_low, 1 + eps_high)` (DAPO
            clip-higher when they differ); each loss's docstring says how it reads them.
        clip_ratio_c: dual-clip constant c > 1 (arXiv 1912.09729): where A < 0 the loss is `min(L^clip, -c A)`.
            None disables it. Only for the losses registered with `dual_clip` (vanilla, gspo).
        importance_sampling_level: "token" (policy loss "vanilla") or "sequence" (GSPO, arXiv 2507.18071), or the
            name of any registered policy loss; `policy_loss`, when given, names the loss instead.
        loss_options: the loss's keyword options (`PolicyLossSpec.options(cfg)`: SAPO's temperatures, ...).
        token_weights: `[bs, T]` or None, constants (detached here) multiplying each token's loss before the
            aggregation: the rollout correction's importance weights (`rollout_correction`: TIS / MIS). The
            denominators of the aggregation are unchanged (a weight of 0 leaves its token counted).
        loss_agg_mode, **agg_kwargs: passed to `aggregate_loss` (`num_global_tokens`, `num_global_seqs`,
            `max_dec_len`). None: the loss's own mode (`PolicyLossSpec.loss_agg_mode`), else token-mean; a mode
            other than the loss's own raises ValueError.
    Returns a dict of:
        pg_loss: scalar, the aggregated loss.
        pg_losses: `[bs, T]` per-token loss (weighted by `token_weights`), 0 on masked positions.
        clip_frac_low / clip_frac_high / clip_frac_dual: shares of valid tokens the loss's bounds acted on (each
            loss's docstring says which; PPO clip: A < 0 and rho < 1 - eps_low, A > 0 and rho > 1 + eps_high,
            where the token's gradient is 0; A < 0 and -c A < L^clip strictly, i.e. rho > c, with dual-clip).
        approx_kl_old: mean over valid tokens of `l^old - l` (unclamped).
    The four statistics are detached and taken over this call's valid tokens (0 if there are none).
    """
    spec = resolve_policy_loss(policy_loss, importance_sampling_level)
    if clip_ratio_c is not None and not spec.dual_clip:
        raise ValueError(f"clip_ratio_c (dual-clip) does not apply to policy loss {spec.name!r}; leave it None")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip (or None to disable it), got {clip_ratio_c!r}")
    if loss_agg_mode is None:
        loss_agg_mode = spec.loss_agg_mode or "token-mean"
    elif spec.loss_agg_mode is not None and loss_agg_mode != spec.loss_agg_mode:
        raise ValueError(f"policy loss {spec.name!r} is defined with loss_agg_mode {spec.loss_agg_mode!r}, got "
                         f"{loss_agg_mode!r}")

    dtype = compute_dtype(log_prob, old_log_prob, advantages)
    log_prob = as_float(log_prob, dtype)
    old_log_prob = as_float(old_log_prob, dtype).detach()
    advantages = as_float(advantages, dtype).detach()
    mask = as_mask(response_mask, dtype)
    check_same_shape(log_prob=log_prob, old_log_prob=old_log_prob, advantages=advantages, response_mask=mask)
    advantages = masked(advantages, mask)

    pg_losses, info = spec.fn(log_prob, old_log_prob, advantages, mask, clip_ratio_low, clip_ratio_high,
                              clip_ratio_c, **(loss_options or {}))
    if token_weights is not None:
        weights = as_float(token_weights, dtype).detach()
        check_same_shape(log_prob=log_prob, token_weights=weights)
        pg_losses = pg_losses * weights
    pg_losses = masked(pg_losses, mask)
    with paddle.no_grad():
        stats = {f"clip_frac_{k}": masked_mean(info[f"clip_{k}"].astype(dtype), mask) if f"clip_{k}" in info
                 else paddle.zeros([], dtype) for k in ("low", "high", "dual")}
        stats["approx_kl_old"] = masked_mean(old_log_prob - log_prob.detach(), mask)
    return {
        "pg_loss": aggregate_loss(pg_losses, mask, loss_agg_mode, **agg_kwargs),
        "pg_losses": pg_losses,
        **stats,
    }


# ---- from logits ----------------------------------------------------------------------------------------------------

def logprobs_from_logits(logits: TensorLike, labels: TensorLike, temperature: float = 1.0) -> paddle.Tensor:
    """`log softmax(logits / temperature)[label]` per position.

    Args:
        logits: `[bs, T, V]` (any float dtype; computed in float32).
        labels: `[bs, T]` int token ids. Negative ids (an ignore index) are read as id 0; mask those positions.
    Returns:
        `[bs, T]` float32. Computed as `z[label] - logsumexp(z)`: the label's logit is gathered with
        take_along_axis, so no `[bs, T, V]` log-softmax is materialised beyond the float32 copy of bf16/fp16
        logits. The logits are deliberately not max-shifted (that would be one more `[bs, T, V]` copy): the
        absolute error is about one float32 ulp of max|logit|, ~4e-6 for logits of magnitude 50.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    dtype = compute_dtype(logits)
    z = as_float(logits, dtype)
    if temperature != 1.0:
        z = z / temperature
    labels = labels if isinstance(labels, paddle.Tensor) else paddle.to_tensor(labels)
    labels = paddle.clip(labels.astype("int64"), min=0).unsqueeze(-1)
    label_logit = gather_last(z, labels).squeeze(-1)
    return label_logit - paddle.logsumexp(z, axis=-1)


def entropy_from_logits(logits: TensorLike, temperature: float = 1.0) -> paddle.Tensor:
    """Entropy `H = logsumexp(z) - sum_v softmax(z)_v z_v` of the token distribution, `z = logits / temperature`.

    `[bs, T, V] -> [bs, T]` float32; stable for large logits (no exp of an unshifted logit). Logits must be finite.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = as_float(logits, compute_dtype(logits))
    # Shifting by the (constant) max first keeps `lse - sum p z` from cancelling catastrophically when the logits
    # are large; the entropy and its gradient are unchanged by the shift.
    z = z - z.max(axis=-1, keepdim=True).detach()
    if temperature != 1.0:
        z = z / temperature
    lse = paddle.logsumexp(z, axis=-1)
    probs = paddle.exp(z - lse.unsqueeze(-1))
    return lse - (probs * z).sum(-1)
