"""Collectives with gradients (`PyLayer`s over `dist.all_reduce` / `dist.all_gather`, which gloo and NCCL both
implement): the building blocks of tensor-parallel layers. `VocabParallel` sums with `AllReduce` on every device;
on CPU `cpu_shims.install_cpu_collectives` puts all four in place of fleet's ops. `group` is a paddle process group
(its `nranks` and `rank` name this rank's slice of the last axis)."""
from __future__ import annotations

from typing import Any

import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer


class Identity(PyLayer):
    """Forward: identity; backward: all-reduce (the column-parallel input)."""

    @staticmethod
    def forward(ctx: Any, x: paddle.Tensor, group: Any) -> paddle.Tensor:
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: paddle.Tensor) -> paddle.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad


class AllReduce(PyLayer):
    """Forward: all-reduce (sum); backward: identity (the row-parallel output)."""

    @staticmethod
    def forward(ctx: Any, x: paddle.Tensor, group: Any) -> paddle.Tensor:
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx: Any, grad: paddle.Tensor) -> paddle.Tensor:
        return grad


class Concat(PyLayer):
    """Forward: all-gather along the last axis; backward: this rank's slice."""

    @staticmethod
    def forward(ctx: Any, x: paddle.Tensor, group: Any) -> paddle.Tensor:
        ctx.group = group
        parts = []
        dist.all_gather(parts, x, group=group)
        return paddle.concat(parts, axis=-1)

    @staticmethod
    def backward(ctx: Any, grad: paddle.Tensor) -> paddle.Tensor:
        return paddle.split(grad, ctx.group.nranks, axis=-1)[ctx.group.rank]


class Split(PyLayer):
    """Forward: this rank's slice of the last axis; backward: all-gather."""

    @staticmethod
    def forward(ctx: Any, x: paddle.Tensor, group: Any) -> paddle.Tensor:
        ctx.group = group
        return paddle.split(x, group.nranks, axis=-1)[group.rank].clone()

    @staticmethod
    def backward(ctx: Any, grad: paddle.Tensor) -> paddle.Tensor:
        parts = []
        dist.all_gather(parts, grad, group=ctx.group)
        return paddle.concat(parts, axis=-1)
