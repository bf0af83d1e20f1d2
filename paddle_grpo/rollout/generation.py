"""`generate`: G completions per prompt, in chunks of whole prompts (`rollout_max_num_seqs`), through the stepper the
policy hands in; the single-turn loop is single_turn.py's `decode`, the multi-turn one (with `tools`)
multi_turn.py's `decode_turns`.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence, Union

import numpy as np
import paddle

from ..data import pad_columns
from .multi_turn import TurnsChunk, decode_turns
from .single_turn import Rollout, Stepper, ToolStats, decode

if TYPE_CHECKING:
    from ..environment import ToolEnvironment


@paddle.no_grad()
def generate(model: paddle.nn.Layer, prompt_ids: Union[paddle.Tensor, np.ndarray],
             prompt_mask: Union[paddle.Tensor, np.ndarray], *, num_samples: int = 1, max_new_tokens: int = 64,
             min_new_tokens: int = 0, eos_token_ids: Union[int, Sequence[int]] = (), pad_token_id: int = 0,
             temperature: float = 1.0, top_p: float = 1.0, repetition_penalty: float = 1.0, do_sample: bool = True,
             max_num_seqs: Optional[int] = None, row_keys: Optional[np.ndarray] = None,
             stepper: Callable[[paddle.nn.Layer], Stepper], penalize_prompt: bool = True,
             top_k: int = 0, tools: Optional[ToolEnvironment] = None, max_turns: int = 1,
             tool_sync: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> Rollout:
    """Sample `num_samples` completions for each of the `B` prompts; returns a `Rollout` with `N = B * num_samples`.

    prompt_ids/prompt_mask: [B, L] (paddle or numpy), left-padded. `max_num_seqs` bounds the sequences decoded at
    once (rollout_max_num_seqs); larger rollouts are processed in chunks of whole prompts.
    `row_keys` ([B * num_samples] uint64, see sampling.row_keys): sample row i with the counter-based uniforms of
    its key, so the result does not depend on chunking or on which process samples which rows; None: paddle's
    global generator (`paddle.multinomial`). `stepper`: a class `stepper(model)` with `start`/`step`, the model's
    side of the loop (policy/causal.py's `generate` passes the causal one for the model, seq2seq.py its
    encoder-decoder stepper); `penalize_prompt`: see `decode`. `top_k` (0: off) and `top_p` (1: off):
    `sampling.candidates`.
    `tools` (paddle_grpo.environment.ToolEnvironment): multi-turn rollouts (multi_turn.py) of up to `max_turns`
    assistant turns, `max_new_tokens` counting actions and tool tokens; the Rollout then has `tool_mask`, `turns`
    and `tool_stats`. None: the single-turn loop (`decode`). `tool_sync`: under tensor parallelism, the AND of a
    [n] bool array over the group (multi_turn.py), so that the ranks feed each tool turn on the same step.
    """
    prompt_ids = paddle.to_tensor(prompt_ids, dtype="int64")
    prompt_mask = paddle.to_tensor(prompt_mask, dtype="int64")
    eos = sorted({int(eos_token_ids)} if np.isscalar(eos_token_ids) else {int(e) for e in eos_token_ids})
    if not eos:
        raise ValueError("generate needs at least one EOS token id")
    B = prompt_ids.shape[0]
    per_chunk = max(1, (max_num_seqs or B * num_samples) // num_samples)
    was_training = model.training
    model.eval()
    try:
        chunks = [_generate_chunk(model, prompt_ids[s:s + per_chunk], prompt_mask[s:s + per_chunk], num_samples,
                                  max_new_tokens, min_new_tokens, eos, pad_token_id, temperature, top_p,
                                  repetition_penalty, do_sample,
                                  None if row_keys is None else row_keys[s * num_samples:(s + per_chunk) * num_samples],
                                  stepper, penalize_prompt, top_k, tools, max_turns, tool_sync)
                  for s in range(0, B, per_chunk)]
    finally:
        if was_training:
            model.train()
    prompt_ids = paddle.repeat_interleave(prompt_ids, num_samples, axis=0)
    prompt_mask = paddle.repeat_interleave(prompt_mask, num_samples, axis=0)
    if tools is not None:
        return _multi_turn_rollout(prompt_ids, prompt_mask, chunks, pad_token_id)
    T = max(c[0].shape[1] for c in chunks)
    ids = paddle.concat([pad_columns(c[0], T, pad_token_id) for c in chunks], axis=0)
    logps = paddle.concat([pad_columns(c[1], T, 0.0) for c in chunks], axis=0)
    lengths = np.concatenate([c[2] for c in chunks])
    truncated = np.concatenate([c[3] for c in chunks])
    mask = paddle.to_tensor((np.arange(T)[None, :] < lengths[:, None]).astype("int64"))
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=ids, completion_mask=mask,
                   lengths=lengths, truncated=truncated, sample_logprobs=logps)


def generate_multi_turn(model: paddle.nn.Layer, prompt_ids: Union[paddle.Tensor, np.ndarray],
                        prompt_mask: Union[paddle.Tensor, np.ndarray], *, tools: ToolEnvironment, max_turns: int,
                        **kwargs: Any) -> Rollout:
    """`generate` with tools: multi-turn rollouts of up to `max_turns` assistant turns (multi_turn.py)."""
    if tools is None:
        raise ValueError("generate_multi_turn needs a tool environment (`tools`)")
    return generate(model, prompt_ids, prompt_mask, tools=tools, max_turns=max_turns, **kwargs)


def _generate_chunk(model, prompt_ids, prompt_mask, G, max_new_tokens, min_new_tokens, eos, pad_id, temperature,
                    top_p, repetition_penalty, do_sample, keys, stepper, penalize_prompt=True, top_k=0, tools=None,
                    max_turns=1, tool_sync=None):
    if tools is not None:
        return decode_turns(stepper(model), prompt_ids, prompt_mask, G, max_new_tokens, min_new_tokens, eos, pad_id,
                            temperature, top_p, repetition_penalty, do_sample, keys, penalize_prompt, top_k, tools,
                            max_turns, tool_sync)
    return decode(stepper(model), prompt_ids, prompt_mask, G, max_new_tokens, min_new_tokens, eos, pad_id,
                  temperature, top_p, repetition_penalty, do_sample, keys, penalize_prompt, top_k)


def _multi_turn_rollout(prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, chunks: List[TurnsChunk],
                        pad_id: int) -> Rollout:
    """One Rollout from the chunks of decode_turns (their columns padded to the longest completion)."""
    T = max(c.ids.shape[1] for c in chunks)

    def cat(name, fill):
        return paddle.to_tensor(np.concatenate([np.pad(getattr(c, name), ((0, 0), (0, T - c.ids.shape[1])),
                                                       constant_values=fill) for c in chunks]))

    stats = ToolStats(wait_s=sum(c.stats.wait_s for c in chunks), model_s=sum(c.stats.model_s for c in chunks),
                      steps=sum(c.stats.steps for c in chunks))
    return Rollout(prompt_ids=prompt_ids, prompt_mask=prompt_mask, completion_ids=cat("ids", pad_id),
                   completion_mask=cat("completion_mask", 0), lengths=np.concatenate([c.lengths for c in chunks]),
                   truncated=np.concatenate([c.truncated for c in chunks]),
                   sample_logprobs=cat("sample_logprobs", 0.0), tool_mask=cat("tool_mask", 0),
                   turns=[turn for c in chunks for turn in c.turns], tool_stats=stats)
