"""Gradients across ranks: the data-parallel sum, the global norm over every axis that splits the model, and
sharding stage1's optimizer (ZeRO-1, https://arxiv.org/abs/1910.02054): fleet's `DygraphShardingOptimizer` owns the
AdamW states of a partition of the parameters on each sharding rank; gradients are reduced to their owner, the
owner updates and broadcasts the parameter. `hcg` is fleet's HybridCommunicateGroup (None without hybrid
parallelism), `sharding` the sharding optimizer (None without sharding); `ParallelContext` passes both."""
from __future__ import annotations

from typing import Any

import numpy as np
import paddle

from ..kernels import numpy_kernels
from .collectives import all_reduce_sum

# Gradients of at least this many elements get their squared norm from numpy's dot product on CPU: paddle's
# `sum(square(g))` allocates a g-sized tensor and sums it on one thread (~0.4 s per step for the 136 M-element
# embedding and head of a 152k vocabulary, against ~0.05 s). Smaller ones (every parameter of the tiny models
# that the quickstart's documented numbers come from) keep paddle's ops, bit for bit.
NUMPY_NORM_FROM = 1 << 20


def sharding_optimizer(optimizer: Any, hcg: Any) -> Any:
    """fleet's `DygraphShardingOptimizer` around `optimizer`, over the sharding group of `hcg`."""
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
        DygraphShardingOptimizer,
    )

    return DygraphShardingOptimizer(optimizer, hcg)


def owned(parameters: list[Any], hcg: Any, sharding: Any) -> list[Any]:
    """The parameters whose optimizer state (and reduced gradient) this rank holds: all of them without sharding."""
    return parameters if sharding is None else sharding.filter_parameters(parameters, hcg)


def sum_gradients(parameters: list[Any], dp_group: Any, hcg: Any, sharding: Any) -> None:
    """Sum the gradients of `parameters` over the data-parallel ranks (`dp_group`; None: the world), in coalesced
    buckets.

    A SUM, not paddle.DataParallel's average: with global denominators (algorithms.aggregate_loss) each rank's loss
    is its share of the whole-batch loss, so the whole-batch gradient is the sum of the ranks' gradients. Called
    explicitly after the micro-batches instead of wrapping the model in paddle.DataParallel, whose reducer only
    fires through the wrapper's forward, while log-probs are computed from the decoder and LM head directly.
    Tensor-parallel shards are summed within their DP group only (each TP rank owns different weights).
    Under sharding each gradient is reduced to the sharding rank that owns the parameter (fleet's
    `reduce_gradients`, which averages: the gradients are scaled up by the sharding degree first, exact for powers
    of two) and then summed over fleet's data axis; other ranks' copies of it are stale afterwards."""
    from paddle.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients_with_group

    parameters = [p for p in parameters if not p.stop_gradient]
    group = dp_group
    if sharding is not None:
        with paddle.no_grad():
            for p in parameters:
                if p.grad is not None:
                    p.grad.scale_(float(hcg.get_sharding_parallel_world_size()))
        sharding.reduce_gradients(parameters, hcg)
        parameters = owned(parameters, hcg, sharding)
        if hcg.get_data_parallel_world_size() == 1:
            return
        group = hcg.get_data_parallel_group()
    fused_allreduce_gradients_with_group(parameters, group=group, scale=1.0)


def global_grad_norm(parameters: list[Any], hcg: Any, sharding: Any) -> float:
    """L2 norm of the whole model's gradient: tensor-parallel shards (`is_distributed`) are summed over the TP
    group, replicated parameters (norms, and everything without TP) counted once; under sharding each rank counts
    the parameters it owns and the sums are added over the sharding group; under pipeline parallelism over the
    pipeline group (a tied embedding's second copy left out). Call after `sum_gradients`."""
    parts = ([], [])  # squared norms of (tensor-parallel shards, replicated parameters)
    large = np.zeros(2)  # the same, of gradients with at least NUMPY_NORM_FROM elements (numpy on CPU)
    for p in owned(list(parameters), hcg, sharding):
        if p.grad is not None and not getattr(p, "pipeline_duplicate", False):
            i = 0 if getattr(p, "is_distributed", False) else 1
            g = p.grad
            if g.size >= NUMPY_NORM_FROM and numpy_kernels.enabled(g):
                flat = numpy_kernels.writable_view(g).reshape(-1)
                # float32 dot products of 64k-element blocks, added in float64: within ~1e-7 of exact
                large[i] += sum(float(np.dot(b, b)) for b in np.split(flat, range(1 << 16, flat.size, 1 << 16)))
            else:
                parts[i].append(paddle.sum(paddle.square(g.astype("float32"))))
    # add_n in float32, as before sharding and pipelines existed: a one-process run's norm (and so its clipping
    # and every later step) stays bitwise what the documented quickstart results were measured with.
    sums = np.array([float(paddle.add_n(part)) if part else 0.0 for part in parts]) + large
    if hcg is None:
        return float(np.sqrt(sums.sum()))
    if hcg.get_sharding_parallel_world_size() > 1:
        sums = all_reduce_sum(sums, hcg.get_sharding_parallel_group())
    if hcg.get_model_parallel_world_size() > 1:
        sums[0] = all_reduce_sum(sums[:1], hcg.get_model_parallel_group())[0]
    if hcg.get_pipe_parallel_world_size() > 1:
        sums = all_reduce_sum(sums, hcg.get_pipe_parallel_group())
    return float(np.sqrt(sums.sum()))
