"""Everything that touches paddle.distributed: start-up, groups, the collectives the trainer needs, tensor parallel.

A single process (plain `python run_rl.py`) needs no initialisation: every collective here degrades to the identity,
so the trainer is written once for any number of ranks. Under `python -m paddle.distributed.launch`:
- data parallel only: `init_parallel_env`; the data-parallel (DP) group is the whole world;
- tensor parallel (`tensor_parallel_degree > 1`): fleet's hybrid topology; the DP group is the ranks holding the
  same model shard. Per-sequence data (rewards, masks) is gathered over the DP group, gradients are summed over it,
  and the tensor-parallel (TP) ranks of one group see identical data, sample identical completions (sampling.py
  keys by DP row) and share one reward request.

On CPU, fleet's tensor-parallel layers call collectives without CPU kernels (`c_identity`, calc-stream all-reduce;
PLATFORM.md). `install_cpu_collectives` replaces exactly those with `PyLayer`s over `dist.all_reduce` /
`dist.all_gather`, which gloo implements; it is used only when paddle has no CUDA device.
"""
from __future__ import annotations

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

_state = {"initialised": False, "hcg": None}


# ------------------------------------------------------------------------------------------------ start-up

def world_size():
    return dist.get_world_size()


def rank():
    return dist.get_rank()


def is_main():
    """Rank 0 alone logs, writes metrics and checkpoints."""
    return rank() == 0


def init(cfg):
    """Initialise the process groups for the configured layout; returns the data-parallel world size."""
    n = world_size()
    cfg.batch_geometry(n)  # raises ConfigError naming the keys when the batch does not split over n processes
    if n == 1 or _state["initialised"]:
        return data_parallel_world()
    unsupported = [(k, v) for k, v in (("pipeline_parallel_degree", cfg.pipeline_parallel_degree),
                                      ("sharding", cfg.sharding)) if v not in (1, "")]
    if unsupported:
        raise NotImplementedError(
            ", ".join(f"{k}: {v!r}" for k, v in unsupported) + " is not supported by this version of paddle_grpo "
            "(data and tensor parallelism are); set pipeline_parallel_degree: 1 and sharding: ''. See "
            "docs/distributed.md.")
    if cfg.tensor_parallel_degree > 1:
        from paddle.distributed import fleet

        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = {"dp_degree": n // cfg.tensor_parallel_degree,
                                   "mp_degree": cfg.tensor_parallel_degree, "pp_degree": 1, "sharding_degree": 1}
        fleet.init(is_collective=True, strategy=strategy)
        _state["hcg"] = fleet.get_hybrid_communicate_group()
        if not paddle.device.is_compiled_with_cuda():
            install_cpu_collectives()
    else:
        dist.init_parallel_env()
    _state["initialised"] = True
    return data_parallel_world()


def _hcg():
    return _state["hcg"]


def data_parallel_world():
    return _hcg().get_data_parallel_world_size() if _hcg() else world_size()


def data_parallel_rank():
    return _hcg().get_data_parallel_rank() if _hcg() else rank()


def _dp_group():
    return _hcg().get_data_parallel_group() if _hcg() else None


def tensor_parallel_world():
    return _hcg().get_model_parallel_world_size() if _hcg() else 1


def tensor_parallel_rank():
    return _hcg().get_model_parallel_rank() if _hcg() else 0


def _tp_group():
    return _hcg().get_model_parallel_group() if _hcg() else None


def model_load_kwargs():
    """Keyword arguments for `from_pretrained` that load this rank's tensor-parallel shard (none without TP)."""
    if tensor_parallel_world() == 1:
        return {}
    return {"tensor_parallel_degree": tensor_parallel_world(), "tensor_parallel_rank": tensor_parallel_rank()}


# -------------------------------------------------------------------------------- data-parallel collectives

def all_gather_object(obj):
    """List of `obj` from every data-parallel rank, in DP-rank order (one element in a single process)."""
    if data_parallel_world() == 1:
        return [obj]
    out = []
    dist.all_gather_object(out, obj, group=_dp_group())
    return out


def all_reduce_sum(values):
    """Element-wise sum over the data-parallel ranks of a float/int array-like; returns numpy float64."""
    arr = np.asarray(values, dtype=np.float64)
    if data_parallel_world() == 1:
        return arr
    t = paddle.to_tensor(arr)
    dist.all_reduce(t, group=_dp_group())
    return t.numpy()


def all_true(flag):
    """True on every rank iff `flag` is true on every rank of the world (so all ranks take the same branch)."""
    if world_size() == 1:
        return bool(flag)
    t = paddle.to_tensor([0.0 if flag else 1.0], dtype="float32")
    dist.all_reduce(t)
    return float(t.item()) == 0.0


def sum_gradients(parameters):
    """All-reduce (SUM) the gradients of `parameters` over the data-parallel ranks, in coalesced buckets.

    A SUM, not paddle.DataParallel's average: with global denominators (algorithms.aggregate_loss) each rank's loss
    is its share of the whole-batch loss, so the whole-batch gradient is the sum of the ranks' gradients. Called
    explicitly after the micro-batches instead of wrapping the model in paddle.DataParallel, whose reducer only
    fires through the wrapper's forward, while log-probs are computed from the decoder and LM head directly.
    Tensor-parallel shards are summed within their DP group only (each TP rank owns different weights)."""
    if data_parallel_world() == 1:
        return
    from paddle.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients_with_group

    fused_allreduce_gradients_with_group([p for p in parameters if not p.stop_gradient], group=_dp_group(),
                                         scale=1.0)


def global_grad_norm(parameters):
    """L2 norm of the whole model's gradient: tensor-parallel shards (`is_distributed`) are summed over the TP
    group, replicated parameters (norms, and everything without TP) counted once. Call after `sum_gradients`."""
    sharded, replicated = [], []
    for p in parameters:
        if p.grad is not None:
            (sharded if getattr(p, "is_distributed", False) else replicated).append(
                paddle.sum(paddle.square(p.grad.astype("float32"))))
    local = float(paddle.add_n(sharded)) if sharded else 0.0
    if sharded and tensor_parallel_world() > 1:
        t = paddle.to_tensor([local], dtype="float32")
        dist.all_reduce(t, group=_tp_group())
        local = float(t.item())
    return float(np.sqrt(local + (float(paddle.add_n(replicated)) if replicated else 0.0)))


def broadcast_object(obj, src=0):
    """`obj` of global rank `src`, on every rank."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def share_within_tensor_parallel_group(compute):
    """`compute()` on the first rank of this tensor-parallel group, its result on every rank of the group (the
    group's ranks hold the same data: one reward request per group, not one per rank)."""
    if tensor_parallel_world() == 1:
        return compute()
    group = _tp_group()
    box = [compute() if tensor_parallel_rank() == 0 else None]
    dist.broadcast_object_list(box, src=group.ranks[0], group=group)
    return box[0]


def barrier():
    if world_size() > 1:
        dist.barrier()


# ----------------------------------------------------------------------------- CPU stand-ins for fleet's ops

class _Identity(PyLayer):
    """Forward: identity; backward: all-reduce (the column-parallel input)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad


class _AllReduce(PyLayer):
    """Forward: all-reduce (sum); backward: identity (the row-parallel output)."""

    @staticmethod
    def forward(ctx, x, group):
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad


class _Concat(PyLayer):
    """Forward: all-gather along the last axis; backward: this rank's slice."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = []
        dist.all_gather(parts, x, group=group)
        return paddle.concat(parts, axis=-1)

    @staticmethod
    def backward(ctx, grad):
        return paddle.split(grad, ctx.group.nranks, axis=-1)[ctx.group.rank]


class _Split(PyLayer):
    """Forward: this rank's slice of the last axis; backward: all-gather."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return paddle.split(x, group.nranks, axis=-1)[group.rank].clone()

    @staticmethod
    def backward(ctx, grad):
        parts = []
        dist.all_gather(parts, grad, group=ctx.group)
        return paddle.concat(parts, axis=-1)


def _c_identity(tensor, group=None, skip_c_identity_dynamic=False):
    return _Identity.apply(tensor, group)


def _mp_allreduce(tensor, op=None, group=None, use_calc_stream=True, use_model_parallel=True,
                  skip_c_identity_dynamic=False):
    return _AllReduce.apply(tensor, group)


def _c_concat(tensor, group=None):
    return _Concat.apply(tensor, group)


def _c_split(tensor, group=None):
    return _Split.apply(tensor, group)


def install_cpu_collectives():
    """Point fleet's tensor-parallel collectives at the gloo-capable PyLayers above (CPU only)."""
    import paddle.distributed.collective as collective
    from paddle.distributed.fleet.layers.mpu import mp_ops

    replacements = {"_c_identity": _c_identity, "_mp_allreduce": _mp_allreduce, "_c_concat": _c_concat,
                    "_c_split": _c_split}
    for module in (mp_ops, collective):
        for name, fn in replacements.items():
            if hasattr(module, name):
                setattr(module, name, fn)


# ------------------------------------------------------------------------ vocab-parallel log-probs, entropy

class VocabParallel:
    """Log-probs and entropy from vocab-parallel logits `[bs, T, V / tp]` without gathering the vocabulary.

    Per position: the maximum logit (all-reduce MAX), the sum of exponentials and, for entropy, the sum of
    `exp(z - max) * z` (all-reduce SUM), and the label's logit from the rank whose shard holds it (all-reduce SUM
    of a masked gather). The SUM reductions pass gradients straight through, so each rank backpropagates into its
    own shard (Megatron's vocab-parallel cross-entropy)."""

    def __init__(self, group, rank, world):
        self.group, self.rank, self.world = group, rank, world

    def _sum(self, x):
        return _AllReduce.apply(x, self.group)

    def _max(self, x):
        x = x.detach().clone()
        dist.all_reduce(x, op=dist.ReduceOp.MAX, group=self.group)
        return x

    def logprobs(self, logits, labels, temperature=1.0):
        z = logits.astype("float32") / temperature
        shard = z.shape[-1]
        m = self._max(z.max(axis=-1, keepdim=True))
        sumexp = self._sum(paddle.exp(z - m).sum(axis=-1))
        local = labels.astype("int64") - self.rank * shard
        inside = ((local >= 0) & (local < shard)).astype("float32")
        picked = paddle.take_along_axis(z, paddle.clip(local, 0, shard - 1).unsqueeze(-1), axis=-1).squeeze(-1)
        target = self._sum(picked * inside)
        return target - m.squeeze(-1) - paddle.log(sumexp)

    def entropy(self, logits, temperature=1.0):
        z = logits.astype("float32") / temperature
        m = self._max(z.max(axis=-1, keepdim=True))
        e = paddle.exp(z - m)
        sumexp = self._sum(e.sum(axis=-1))
        weighted = self._sum((e * (z - m)).sum(axis=-1))
        return paddle.log(sumexp) - weighted / sumexp


def vocab_parallel():
    """A `VocabParallel` for this rank's tensor-parallel group, or None without tensor parallelism."""
    if tensor_parallel_world() == 1:
        return None
    return VocabParallel(_tp_group(), tensor_parallel_rank(), tensor_parallel_world())
