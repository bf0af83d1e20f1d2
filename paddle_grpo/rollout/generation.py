"""`generate`: G completions per prompt, in chunks of whole prompts (`rollout_max_num_seqs`), through the stepper the
policy hands in; the single-turn loop is single_turn.py's `decode`.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import numpy as np
import paddle

from ..data import pad_columns
from .single_turn import Rollout, Stepper, decode


@paddle.no_grad()
def generate(model: paddle.nn.Layer, prompt_ids: Union[paddle.Tensor, np.ndarray],
             prompt_mask: Union[paddle.Tensor, np.ndarray], *, num_samples: int = 1, max_new_tokens: int = 64,
             min_new_tokens: int = 0, eos_token_ids: Union[int, Sequence[int]] = (), pad_token_id: int = 0,
             temperature: float = 1.0, top_p: float = 1.0, repetition_penalty: float = 1.0, do_sample: bool = True,
             max_num_seqs: Optional[int] = None, row_keys: Optional[np.ndarray] = None,
             stepper: Callable[[paddle.nn.Layer], Stepper], penalize_prompt: bool = True,
             top_k: int = 0) -> Rollout:
    """Sample `num_samples` completions for each of the `B` prompts; returns a `Rollout` with `N = B * num_samples`.

    prompt_ids/prompt_mask: [B, L] (paddle or numpy), left-padded. `max_num_seqs` bounds the sequences decoded at
    once (rollout_max_num_seqs); larger rollouts are processed in chunks of whole prompts.
    `row_keys` ([B * num_samples] uint64, see sampling.row_keys): sample row i with the counter-based uniforms of
    its key, so the result does not depend on chunking or on which process samples which rows; None: paddle's
    global generator (`paddle.multinomial`). `stepper`: a class `stepper(model)` with `start`/`step`, the model's
    side of the loop (policy/causal.py's `generate` passes the causal one for the model, seq2seq.py its
    encoder-decoder stepper); `penalize_prompt`: see `decode`. `top_k` (0: off) and `top_p` (1: off):
    `sampling.candidates`.
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
                                  stepper, penalize_prompt, top_k)
                  for s in range(0, B, per_chunk)]
    finally:
        if was_training:
            model.train()
    T = max(c[0].shape[1] for c in chunks)
    ids = paddle.concat([pad_columns(c[0], T, pad_token_id) for c in chunks], axis=0)
    logps = paddle.concat([pad_columns(c[1], T, 0.0) for c in chunks], axis=0)
    lengths = np.concatenate([c[2] for c in chunks])
    truncated = np.concatenate([c[3] for c in chunks])
    mask = paddle.to_tensor((np.arange(T)[None, :] < lengths[:, None]).astype("int64"))
    return Rollout(prompt_ids=paddle.repeat_interleave(prompt_ids, num_samples, axis=0),
                   prompt_mask=paddle.repeat_interleave(prompt_mask, num_samples, axis=0),
                   completion_ids=ids, completion_mask=mask, lengths=lengths, truncated=truncated,
                   sample_logprobs=logps)


def _generate_chunk(model, prompt_ids, prompt_mask, G, max_new_tokens, min_new_tokens, eos, pad_id, temperature,
                    top_p, repetition_penalty, do_sample, keys, stepper, penalize_prompt=True, top_k=0):
    return decode(stepper(model), prompt_ids, prompt_mask, G, max_new_tokens, min_new_tokens, eos, pad_id,
                  temperature, top_p, repetition_penalty, do_sample, keys, penalize_prompt, top_k)
