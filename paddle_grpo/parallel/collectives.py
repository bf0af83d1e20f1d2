"""Collectives on plain Python and numpy values over one paddle process group (`group=None`: the whole world).

`ParallelContext` picks the group (data-parallel, tensor-parallel, pipeline) and skips the call when the group is
this rank alone; these functions always communicate, so every rank of `group` must call them in the same order."""
from __future__ import annotations

from typing import Any, TypeVar

import numpy as np
import paddle
import paddle.distributed as dist

T = TypeVar("T")


def gather_objects(obj: T, group: Any = None) -> list[T]:
    """`obj` of every rank of `group`, in group-rank order (picklable objects)."""
    out = []
    dist.all_gather_object(out, obj, group=group)
    return out


def all_reduce_sum(values: Any, group: Any = None) -> np.ndarray:
    """Element-wise sum over `group` of a float/int array-like, as numpy float64."""
    t = paddle.to_tensor(np.asarray(values, dtype=np.float64))
    dist.all_reduce(t, group=group)
    return t.numpy()


def all_true(flag: bool) -> bool:
    """True on every rank iff `flag` is true on every rank of the world (so all ranks take the same branch)."""
    t = paddle.to_tensor([0.0 if flag else 1.0], dtype="float32")
    dist.all_reduce(t)
    return float(t.item()) == 0.0


def broadcast_object(obj: T, src: int, group: Any = None) -> T:
    """`obj` of global rank `src` (a member of `group`), on every rank of `group`."""
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group)
    return box[0]


def new_groups(rank_lists: list[list[int]], world: int, rank: int) -> Any:
    """Create every group of `rank_lists` (all ranks must, in the same order) and return the one holding `rank`;
    None when that is the whole world (the default group)."""
    if len(rank_lists) == 1 and len(rank_lists[0]) == world:
        return None  # the default group already spans them; each extra gloo group is one more rendezvous
    mine = None
    for ranks in rank_lists:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    return mine
