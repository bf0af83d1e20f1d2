"""Activation recompute (gradient checkpointing): paddle's own `recompute`, behind the rule that only parallel/
imports paddle.distributed (fleet's recompute lives there although it is not distributed).

Used by policy/fast_decoder.py for the config keys `recompute` / `recompute_granularity` / `recompute_use_reentrant`
(PaddleNLP's forward calls the same paddle function itself).
"""
from __future__ import annotations

from typing import Any, Callable

import paddle


def checkpoint(fn: Callable[..., Any], *args: Any, use_reentrant: bool) -> Any:
    """`fn(*args)` without keeping its intermediate activations: only the inputs are saved, and `fn` runs again in
    the backward pass to rebuild them (paddle.distributed.fleet.utils.recompute).

    Pass every tensor the gradient must reach as an argument, not through a closure: the re-entrant
    implementation (`use_reentrant=True`, a PyLayer) returns gradients for its tensor arguments; the non-re-entrant
    one (saved-tensor hooks) handles both. The RNG state is restored for the rerun (paddle's default), so a
    function without dropout recomputes exactly the same values."""
    from paddle.distributed.fleet.utils import recompute

    return recompute(fn, *args, use_reentrant=use_reentrant)


def needs_grad(*args: Any) -> bool:
    """Whether gradients are being recorded and any tensor among `args` requires one: otherwise there is nothing
    to recompute for (PaddleNLP's `has_gradient` test) and `fn` should simply be called."""
    return paddle.is_grad_enabled() and any(isinstance(a, paddle.Tensor) and not a.stop_gradient for a in args)
