"""Sampling `G` completions per prompt with a KV cache.

Each prompt is run through the model once (prefill) and its cache is shared by its `G` samples, instead of
prefilling `G` identical copies. Decoding stops as soon as every sequence has produced EOS. Rows are ordered prompt
by prompt: rows `i*G .. i*G+G-1` are the samples of prompt `i`.

The model runs through a "stepper" (prefill, then one token per step), the interface the policy hands in: this
module knows no model. For a decoder-only model policy/causal.py's `generate` passes the lean forward of
fast_decoder.py with a preallocated KV cache for a plain float32 Qwen2 or Llama, otherwise the model's own decoder with
PaddleNLP's `past_key_values` and its LM head on the last position only (`causal.stepper_for`; `PADDLE_GRPO_FAST=0`
forces the latter); policy/seq2seq.py passes its encoder-decoder stepper. Both causal steppers give the same logits
up to float32 rounding, so greedy decoding is identical and keyed sampling (`row_keys`) draws the same tokens unless
a uniform falls within rounding distance (~1e-6) of a cumulative-probability boundary.

Sampling: logits / temperature -> repetition penalty -> EOS masked until `min_new_tokens` -> top-k / top-p ->
inverse CDF with the counter-based uniforms of `row_keys` (sampling.py), or without keys a multinomial draw
(paddle's global generator, so `paddle.seed` and `paddle.get_rng_state` make a rollout reproducible). The returned
`sample_logprobs` are the log-probs of the sampled tokens under the temperature-scaled distribution before the
penalty/top-k/top-p/min-length processing, i.e. exactly what `completion_logprobs` recomputes with a full forward
pass. Under AMP the caller runs generation inside the update's autocast (step.model_precision), so the sample
log-probs come from the same precision as the update's; the steppers cast the logits to float32, and the sampling
maths run with autocast switched off (`full_precision`).

Every per-step op on the [N, V] logits is linear in V and cheap at a 152k vocabulary (docs/platform.md: paddle's CPU
`F.log_softmax` is superlinear in V, so it is never used): the log-prob is `z[token] - logsumexp(z)` from one
max / exp / sum pass, sampling does no float64 [N, V] pass (`sample_with_uniforms`), top-k / top-p take a
`paddle.topk` of candidates instead of sorting the vocabulary (`sampling.candidates`), and the repetition penalty
and the EOS mask touch only the seen / EOS columns. `tools/bench/bench_ops.py` times each op.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Protocol, Tuple, Union

import numpy as np
import paddle

from ..algorithms import gather_last
from ..kernels import numpy_kernels
from ..precision import full_precision
from .sampling import candidates, sample_with_uniforms, sample_with_uniforms_numpy, uniforms

# The decode step's max / exp / sum take numpy kernels on CPU from this vocabulary size: at [8, 151,936] 1.8 ms
# against 3.8 ms with paddle ops (tools/bench/bench_ops.py, "decode" rows); at small vocabularies both cost
# microseconds, and paddle's keep the sampled tokens of the tiny models (quickstart, tests) bit for bit what they were.
NUMPY_FROM_VOCAB = 4096
# A stepper that can (`drops_rows`: policy/causal.py's on the CPU decode engine) goes on without its finished rows
# once at most this share of them is still decoding.
DROP_BELOW = 0.75


class Stepper(Protocol):
    """What `decode` runs the model through: a prefill, then one token per step (module docstring)."""

    def start(self, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, G: int,
              max_new_tokens: int) -> paddle.Tensor:
        """Prefill prompts [P, L]; the next-token logits [P * G, V], each prompt's G rows consecutive."""

    def step(self, token: paddle.Tensor, keep: Optional[paddle.Tensor] = None) -> paddle.Tensor:
        """token [N] -> next-token logits [N, V].

        keep bool [N] (None: every row): row i's token is appended only where keep[i] (the multi-turn driver idles
        rows that wait for a tool or are done); a row not kept does not advance its position, and its returned
        logits are meaningless. The single-turn loop passes no `keep`."""


@dataclass
class ToolStats:
    """Timings of a multi-turn rollout (summed over its `rollout_max_num_seqs` chunks); per-call latencies and errors
    are in the tool messages of `Rollout.turns`."""
    wait_s: float = 0.0   # seconds blocked with every unfinished row waiting for a tool (the model idle)
    model_s: float = 0.0  # seconds in the model: prefill and decode steps
    steps: int = 0        # decode steps run (one token per row that is generating or fed a tool token)


@dataclass
class Rollout:
    prompt_ids: paddle.Tensor        # [N, L] int64, left-padded, each prompt repeated G times
    prompt_mask: paddle.Tensor       # [N, L] int64
    completion_ids: paddle.Tensor    # [N, T] int64, pad after EOS; T = longest completion in the batch
    completion_mask: paddle.Tensor   # [N, T] int64, 1 on generated tokens up to and including EOS (actions only)
    lengths: np.ndarray              # [N] generated (action) tokens (EOS included)
    truncated: np.ndarray            # [N] bool: stopped by max_new_tokens without EOS (without a final answer)
    sample_logprobs: paddle.Tensor   # [N, T] float32 (0 on tool tokens)
    # Multi-turn rollouts with tools only (multi_turn.py); None for single-turn ones.
    tool_mask: Optional[paddle.Tensor] = None   # [N, T] int64, 1 on the tool-turn tokens the rollout fed (context)
    turns: Optional[List[List[dict]]] = None    # per row its messages: assistant / tool dicts, in order
    tool_stats: Optional[ToolStats] = None

    @property
    def tool_wait_s(self) -> Optional[float]:
        """Seconds the multi-turn loop was blocked on tools with no row left to decode (perf/tool_wait_s); None for
        a single-turn rollout."""
        return None if self.tool_stats is None else self.tool_stats.wait_s


def decode(stepper: Stepper, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, G: int, max_new_tokens: int,
           min_new_tokens: int, eos: List[int], pad_id: int, temperature: float, top_p: float,
           repetition_penalty: float, do_sample: bool, keys: Optional[np.ndarray] = None, penalize_prompt: bool = True,
           top_k: int = 0) -> Tuple[paddle.Tensor, paddle.Tensor, np.ndarray, np.ndarray]:
    """The sampling loop shared by decoder-only and encoder-decoder policies.

    `stepper.start(prompt_ids, prompt_mask, G, max_new_tokens)` returns the first logits [N, V] (N = B * G rows,
    each prompt's G samples sharing its prefill); `stepper.step(token [N])` the next ones. `penalize_prompt`:
    whether prompt tokens count as seen for the repetition penalty (an encoder-decoder's summary should copy from
    its source). Returns (ids [N, T], sample log-probs [N, T], lengths [N], truncated [N])."""
    N = prompt_ids.shape[0] * G
    logits = stepper.start(prompt_ids, prompt_mask, G, max_new_tokens)
    eos_t = paddle.to_tensor(eos, dtype="int64")
    eos_cols = paddle.tile(eos_t.unsqueeze(0), [N, 1])  # [N, E]
    seen = None  # [N, S] int64 token ids seen by each row (-1: none), for the repetition penalty
    if repetition_penalty != 1.0 and penalize_prompt:
        seen = paddle.repeat_interleave(paddle.where(prompt_mask.astype("bool"), prompt_ids,
                                                     paddle.full_like(prompt_ids, -1)), G, axis=0)
    finished = paddle.zeros([N], dtype="bool")
    lengths = np.zeros(N, dtype=np.int64)
    tokens, logps = [], []
    rows = None  # the original indices of the stepper's rows once it dropped finished ones (None: all N)
    index = None  # `rows` as an int64 tensor (made once per drop, not per step)
    for t in range(max_new_tokens):
        with full_precision():  # under the update's autocast (step.model_precision) only the model runs in it
            sub = (lambda x: x) if rows is None else (lambda x: paddle.index_select(x, index))
            done = sub(finished)
            token, z, lse = choose(logits, temperature, None if seen is None else sub(seen), repetition_penalty,
                                   t < min_new_tokens or None, sub(eos_cols), do_sample, top_k, top_p,
                                   None if keys is None or not do_sample else
                                   uniforms(keys if rows is None else keys[rows], t))
            token = paddle.where(done, paddle.full_like(token, pad_id), token)
            token_logp = paddle.where(done, paddle.zeros_like(lse), gather_last(z, token.unsqueeze(-1)).squeeze(-1)
                                      - lse)
            if rows is not None:  # back to all N rows: the dropped ones are finished (pad, log-prob 0)
                token, token_logp = (paddle.to_tensor(_scatter(x.numpy(), rows, N, fill))
                                     for x, fill in ((token, pad_id), (token_logp, 0.0)))
        tokens.append(token)
        logps.append(token_logp)
        lengths += (~finished).numpy()
        finished = finished | (token.unsqueeze(-1) == eos_t.unsqueeze(0)).any(axis=-1)
        if bool(finished.all()) or t == max_new_tokens - 1:
            break
        if repetition_penalty != 1.0:
            seen = token.unsqueeze(-1) if seen is None else paddle.concat([seen, token.unsqueeze(-1)], axis=-1)
        live = np.flatnonzero(~finished.numpy())
        held = N if rows is None else len(rows)
        if getattr(stepper, "drops_rows", False) and len(live) <= held * DROP_BELOW:
            # Finished rows cost a decode step as much as live ones: go on without them (their cache copied out
            # once a quarter of the rows has finished since the last time, so at most ~4 cache copies in all).
            stepper.keep_rows(live if rows is None else np.searchsorted(rows, live))
            rows, index = live, paddle.to_tensor(live, dtype="int64")
        logits = stepper.step(token if rows is None else paddle.index_select(token, index))
    ids = paddle.stack(tokens, axis=1)
    truncated = ~finished.numpy()
    return ids, paddle.stack(logps, axis=1), lengths, truncated


def _scatter(values: np.ndarray, rows: np.ndarray, N: int, fill: float) -> np.ndarray:
    """[N] array holding `values` [n] at `rows` and `fill` elsewhere."""
    out = np.full(N, fill, dtype=values.dtype)
    out[rows] = values
    return out


def choose(logits: paddle.Tensor, temperature: float, seen: Optional[paddle.Tensor], repetition_penalty: float,
           block_eos: Union[bool, paddle.Tensor, None], eos_cols: paddle.Tensor, do_sample: bool, top_k: int,
           top_p: float, u: Optional[np.ndarray]) -> Tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
    """One decode step's sampling maths (module docstring), shared by the single- and multi-turn loops; call it under
    `full_precision`. logits [n, V] float32; seen [n, S] ids for the repetition penalty (-1: none) or None;
    block_eos: True (every row), a bool [n] tensor (those rows) or None: EOS masked, as before `min_new_tokens`;
    eos_cols [n, E] the EOS ids; u [n] keyed uniforms or None (multinomial). Returns (token [n] int64, z [n, V] the
    temperature-scaled logits, logsumexp(z) [n]): the sample log-prob of a token is `z[token] - lse`."""
    if (seen is None and top_k <= 0 and top_p >= 1.0 and (u is not None or not do_sample)
            and logits.shape[-1] >= NUMPY_FROM_VOCAB and numpy_kernels.enabled(logits)):
        return _choose_numpy(logits, temperature, block_eos, eos_cols, do_sample, u)
    z = logits / temperature
    exp_z, lse = _exp_and_logsumexp(z)
    processed = z
    if seen is not None:
        processed = _penalize(processed, seen, repetition_penalty)
    if block_eos is True:  # only the EOS columns change: no [n, V] mask
        processed = paddle.put_along_axis(processed, eos_cols, -float("inf"), axis=1)
    elif block_eos is not None:
        kept = gather_last(processed, eos_cols)
        processed = paddle.put_along_axis(
            processed, eos_cols, paddle.where(block_eos.unsqueeze(-1), paddle.full_like(kept, -float("inf")), kept),
            axis=1)
    if do_sample:
        token = _sample(exp_z if processed is z else _exp_and_logsumexp(processed)[0], top_k, top_p, u)
    else:
        token = paddle.argmax(processed, axis=-1)
    return token, z, lse


def _choose_numpy(logits: paddle.Tensor, temperature: float, block_eos: Union[bool, paddle.Tensor, None],
                  eos_cols: paddle.Tensor, do_sample: bool, u: Optional[np.ndarray]
                  ) -> Tuple[paddle.Tensor, paddle.Tensor, paddle.Tensor]:
    """`choose` without repetition penalty, top-k or top-p, at a real vocabulary on CPU: the same maths on numpy views
    of the logits, with no further [n, V] pass than the max / exp / sum one (paddle's ops took ~9 ms a step at
    [32, 49,152], one Zen 4 core; this ~3 ms). Keyed sampling by sampling.sample_with_uniforms_numpy; greedy by
    argmax of the logits. EOS blocking zeroes the EOS columns of the exponentials (a blocked token's weight)."""
    z = logits if temperature == 1.0 else logits / temperature
    exp_z, lse = _exp_and_logsumexp(z)
    e = numpy_kernels.writable_view(exp_z)
    zv = numpy_kernels.writable_view(z)
    blocked = None
    if block_eos is True:
        blocked = np.arange(e.shape[0])
    elif block_eos is not None:
        blocked = np.flatnonzero(block_eos.numpy())
    eos = eos_cols.numpy()
    if do_sample:
        if blocked is not None:
            e[blocked[:, None], eos[blocked]] = 0.0
        token = sample_with_uniforms_numpy(e, u)
    else:
        token = zv.argmax(axis=-1)
        if blocked is not None and blocked.size:
            rows = zv[blocked].copy()
            rows[np.arange(blocked.size)[:, None], eos[blocked]] = -np.inf
            token[blocked] = rows.argmax(axis=-1)
    return paddle.to_tensor(token.astype(np.int64)), z, lse


def _exp_and_logsumexp(z: paddle.Tensor) -> Tuple[paddle.Tensor, paddle.Tensor]:
    """exp(z - max) [N, V] (unnormalised probabilities) and logsumexp(z) [N], from one max / exp / sum pass
    (paddle's CPU `logsumexp` costs about as much as this and `softmax` together: tools/bench/bench_ops.py). On CPU at a
    vocabulary of at least NUMPY_FROM_VOCAB, numpy kernels over the tensors' memory
    (paddle_grpo/kernels/numpy_kernels.py)."""
    if z.shape[-1] < NUMPY_FROM_VOCAB or not numpy_kernels.enabled(z):
        m = z.max(axis=-1, keepdim=True)
        e = paddle.exp(z - m)
        return e, (m + paddle.log(e.sum(axis=-1, keepdim=True))).squeeze(-1)
    e = paddle.empty_like(z)
    zv, ev = numpy_kernels.writable_view(z), numpy_kernels.writable_view(e)
    lse = np.empty(z.shape[0], dtype=np.float32)

    def work(start: int, end: int) -> None:
        m = zv[start:end].max(axis=1)
        rows = np.subtract(zv[start:end], m[:, None], out=ev[start:end])
        lse[start:end] = m + np.log(np.exp(rows, out=rows).sum(axis=1))

    numpy_kernels.parallel_ranges(z.shape[0], work)
    return e, paddle.to_tensor(lse)


def _sample(weights: paddle.Tensor, top_k: int, top_p: float, u: Optional[np.ndarray]) -> paddle.Tensor:
    """One token per row from unnormalised probabilities [N, V], restricted by top-k / top-p; with uniforms u [N]
    by inverse CDF (sampling.py), else paddle.multinomial. [N] int64."""
    ids = None
    if top_k > 0 or top_p < 1.0:
        ids, weights = candidates(weights / weights.sum(axis=-1, keepdim=True), top_k, top_p)
    if u is None:
        pick = paddle.multinomial(weights, num_samples=1).squeeze(-1)
    else:
        pick = sample_with_uniforms(weights, u)
    return pick if ids is None else gather_last(ids, pick.unsqueeze(-1)).squeeze(-1)


def _penalize(z: paddle.Tensor, seen: paddle.Tensor, penalty: float) -> paddle.Tensor:
    """z [N, V] with the repetition penalty applied to the columns `seen` [N, S] (ids, -1: none): positive logits
    divided by `penalty`, negative ones multiplied. Touches O(N * S) entries, not [N, V]."""
    valid = seen >= 0
    has_any = valid.any(axis=-1, keepdim=True)
    # Point the -1 entries at a seen id of the same row (or 0 when the row has none and nothing changes), so
    # every write to a column writes the same value.
    first = gather_last(seen, paddle.argmax(valid.astype("int32"), axis=-1, keepdim=True))
    ids = paddle.where(valid, seen, paddle.where(has_any, first, paddle.zeros_like(first)))
    vals = gather_last(z, ids)
    penalised = paddle.where(vals > 0, vals / penalty, vals * penalty)
    return paddle.put_along_axis(z, ids, paddle.where(has_any, penalised, vals), axis=-1)


def top_p_filter(probs: paddle.Tensor, top_p: float) -> paddle.Tensor:
    """Keep the smallest set of most likely tokens whose probability reaches top_p; renormalise. [n, V] -> [n, V].

    The full-sort form (a sort of the vocabulary per row); decoding uses `sampling.candidates`, which keeps the
    same tokens from a `paddle.topk` of a few candidates (tests/rollout/test_sampling_real_vocab.py)."""
    sorted_probs = paddle.sort(probs, axis=-1, descending=True)
    cumulative = paddle.cumsum(sorted_probs, axis=-1)
    # The probability of the last token kept: tokens less likely than it are dropped (ties kept).
    keep_count = paddle.sum((cumulative - sorted_probs) < top_p, axis=-1, keepdim=True)
    threshold = paddle.take_along_axis(sorted_probs, keep_count - 1, axis=-1)
    filtered = paddle.where(probs >= threshold, probs, paddle.zeros_like(probs))
    return filtered / filtered.sum(axis=-1, keepdim=True)
