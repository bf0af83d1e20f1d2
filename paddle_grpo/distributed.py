"""Everything that touches paddle.distributed: start-up, rank facts, and the few collectives the trainer needs.

A single process (plain `python run_rl.py`) needs no initialisation: every collective here degrades to the identity,
so the trainer is written once for any number of ranks. Under `python -m paddle.distributed.launch` the data-parallel
group is initialised with `init()`; the group statistics of the algorithms are then computed over the global batch
by gathering the (small) per-sequence data to every rank.
"""
from __future__ import annotations

import numpy as np
import paddle
import paddle.distributed as dist

_initialised = False


def world_size():
    return dist.get_world_size()


def rank():
    return dist.get_rank()


def is_main():
    """Rank 0 alone logs, writes metrics and checkpoints."""
    return rank() == 0


def init(cfg):
    """Initialise the process group when launched with several processes; check the layout fits the config."""
    global _initialised
    n = world_size()
    cfg.batch_geometry(n)  # raises ConfigError naming the keys when the batch does not split over n processes
    if n > 1 and not _initialised:
        if cfg.tensor_parallel_degree > 1 or cfg.pipeline_parallel_degree > 1 or cfg.sharding:
            raise NotImplementedError(
                "tensor_parallel_degree / pipeline_parallel_degree / sharding > 1 are not available yet in this "
                "version; run data-parallel only (set them to 1 / '')")
        dist.init_parallel_env()
        _initialised = True
    return n


def sum_gradients(parameters):
    """All-reduce (SUM) the gradients of `parameters` over the data-parallel ranks, in coalesced buckets.

    A SUM, not paddle.DataParallel's average: with global denominators (algorithms.aggregate_loss) each rank's loss
    is its share of the whole-batch loss, so the whole-batch gradient is the sum of the ranks' gradients. Called
    explicitly after the micro-batches instead of wrapping the model in paddle.DataParallel, whose reducer only
    fires through the wrapper's forward, while log-probs are computed from the decoder and LM head directly."""
    if world_size() == 1:
        return
    from paddle.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients_with_group

    fused_allreduce_gradients_with_group([p for p in parameters if not p.stop_gradient], group=None, scale=1.0)


def all_true(flag):
    """True on every rank iff `flag` is true on every rank (so all ranks take the same branch after it)."""
    if world_size() == 1:
        return bool(flag)
    t = paddle.to_tensor([0.0 if flag else 1.0], dtype="float32")
    dist.all_reduce(t)
    return float(t.item()) == 0.0


def all_gather_object(obj):
    """List of `obj` from every rank, in rank order (a one-element list in a single process)."""
    if world_size() == 1:
        return [obj]
    out = []
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(values):
    """Element-wise sum over ranks of a float/int array-like; returns numpy float64."""
    arr = np.asarray(values, dtype=np.float64)
    if world_size() == 1:
        return arr
    t = paddle.to_tensor(arr)
    dist.all_reduce(t)
    return t.numpy()


def broadcast_object(obj, src=0):
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def barrier():
    if world_size() > 1:
        dist.barrier()
