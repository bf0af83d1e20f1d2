"""Everything that touches paddle.distributed: start-up, groups, the collectives the trainer needs, tensor parallel.

A single process (plain `python run_rl.py`) needs no initialisation: every collective here degrades to the identity,
so the trainer is written once for any number of ranks. Under `python -m paddle.distributed.launch`:
- data parallel only: `init_parallel_env`; the data-parallel (DP) group is the whole world;
- tensor parallel (`tensor_parallel_degree > 1`) or sharding (`sharding: stage1`): fleet's hybrid topology. The
  data-parallel (DP) group is every rank that holds the same model shard, i.e. fleet's data *and* sharding axes:
  they all receive different prompts. Per-sequence data (rewards, masks) is gathered over the DP group, gradients
  are summed over it, and the tensor-parallel (TP) ranks of one group see identical data, sample identical
  completions (sampling.py keys by DP row) and share one reward request.
- sharding stage1 (ZeRO-1, https://arxiv.org/abs/1910.02054): fleet's `DygraphShardingOptimizer` owns the AdamW
  states of a partition of the parameters on each sharding rank; gradients are reduced to their owner, the owner
  updates and broadcasts the parameter. `wrap_optimizer` builds it, `sum_gradients` / `global_grad_norm` follow it.

On CPU, fleet's tensor-parallel layers call collectives without CPU kernels (`c_identity`, calc-stream all-reduce;
PLATFORM.md). `install_cpu_collectives` replaces exactly those with `PyLayer`s over `dist.all_reduce` /
`dist.all_gather`, which gloo implements; it is used only when paddle has no CUDA device.
"""
from __future__ import annotations

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

_state = {"initialised": False, "hcg": None, "data_group": None, "sharding_optimizer": None}


# ------------------------------------------------------------------------------------------------ start-up

def world_size():
    return dist.get_world_size()


def rank():
    return dist.get_rank()


def is_main():
    """Rank 0 alone logs, writes metrics and checkpoints."""
    return rank() == 0


def hybrid_degrees(cfg, world):
    """fleet's hybrid degrees for `world` processes: {"dp_degree", "mp_degree", "pp_degree", "sharding_degree"}.

    The ranks that hold the same model shard (world / (tp * pp) of them) are fleet's data axis times its sharding
    axis; `sharding_parallel_degree` (-1: all of them) sets the sharding part when `sharding` is on."""
    tp, pp = cfg.tensor_parallel_degree, cfg.pipeline_parallel_degree
    cfg.batch_geometry(world)  # raises ConfigError naming the keys when the degrees do not split the processes
    data_ranks = world // (tp * pp)
    sharding = 1
    if cfg.sharding:
        sharding = data_ranks if cfg.sharding_parallel_degree <= 0 else cfg.sharding_parallel_degree
    return {"dp_degree": data_ranks // sharding, "mp_degree": tp, "pp_degree": pp, "sharding_degree": sharding}


def unsupported_layout(cfg):
    """What of the configured parallel layout this version cannot run, one message per key (empty: all of it)."""
    checks = (
        ("pipeline_parallel_degree", cfg.pipeline_parallel_degree, "pipeline parallelism is not wired yet"),
        ("sharding", cfg.sharding if cfg.sharding == "stage2" else "",
         ("stage2 (fleet's group_sharded_parallel) runs only on GPU/XPU and could not be tested here; stage1 "
          "shards the optimizer states")),
        ("sharding_parallel_config", "split_param" if "split_param" in cfg.sharding_parallel_config.split() else "",
         "sharding V2 keeps gradients in main_grad, which the trainer's gradient path does not read"))
    return [f"{key}: {value!r} is not supported by this version of paddle_grpo ({why})"
            for key, value, why in checks if value not in (1, "")]


def init(cfg):
    """Initialise the process groups for the configured layout; returns the data-parallel world size."""
    n = world_size()
    cfg.batch_geometry(n)  # raises ConfigError naming the keys when the batch does not split over n processes
    if n == 1 or _state["initialised"]:
        return data_parallel_world()
    problems = unsupported_layout(cfg)
    if problems:
        raise NotImplementedError("; ".join(problems) + ". See docs/distributed.md.")
    degrees = hybrid_degrees(cfg, n)
    if degrees["mp_degree"] > 1 or degrees["sharding_degree"] > 1:
        from paddle.distributed import fleet

        cpu = not paddle.device.is_compiled_with_cuda()
        if cpu:
            _serialise_group_creation()
        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = dict(degrees)
        fleet.init(is_collective=True, strategy=strategy)
        _state["hcg"] = fleet.get_hybrid_communicate_group()
        _state["data_group"] = _new_groups(data_parallel_groups(_state["hcg"].topology()))
        if cpu and degrees["mp_degree"] > 1:
            install_cpu_collectives()
    else:
        dist.init_parallel_env()
    _state["initialised"] = True
    return data_parallel_world()


def data_parallel_groups(topology):
    """Rank lists of the data-parallel groups of a fleet `CommunicateTopology`: ranks that differ only in their
    data and sharding coordinates (they hold the same model shard and see different prompts), each sorted."""
    names = topology.get_hybrid_group_names()
    groups = {}
    for r in range(topology.world_size()):
        coord = topology.get_coord(r)
        key = tuple(c for name, c in zip(names, coord) if name not in ("data", "sharding"))
        groups.setdefault(key, []).append(r)
    return sorted(groups.values())


def _new_groups(rank_lists):
    """Create every group (all ranks must, in the same order) and return the one holding this rank; None when that
    is the whole world (the default group)."""
    if len(rank_lists) == 1 and len(rank_lists[0]) == world_size():
        return None  # the default group already spans them; each extra gloo group is one more rendezvous
    mine = None
    for ranks in rank_lists:
        group = dist.new_group(ranks)
        if rank() in ranks:
            mine = group
    return mine


def _serialise_group_creation():
    """gloo (CPU) fails intermittently when ranks create *disjoint* subgroups at the same time (fleet.init with
    4 processes: `pair.cc connect ... Connection refused` or a TIMEOUT); a barrier after each `new_group` orders
    them. fleet's topology code looks `new_group` up at call time, so replacing the module attribute suffices."""
    from paddle.distributed import collective

    original = collective.new_group
    if getattr(original, "_serialised", False):
        return

    def new_group(*args, **kwargs):
        group = original(*args, **kwargs)
        dist.barrier()
        return group

    new_group._serialised = True
    collective.new_group = dist.new_group = new_group


def _hcg():
    return _state["hcg"]


def data_parallel_world():
    """Ranks that receive different prompts (fleet's data x sharding degrees)."""
    group = _state["data_group"]
    return group.nranks if group is not None else world_size() // tensor_parallel_world()


def data_parallel_rank():
    group = _state["data_group"]
    if group is not None:
        return group.ranks.index(rank())  # not group.rank: paddle gives a one-rank group rank -1
    return rank() // tensor_parallel_world()  # the whole world, minus the TP axis (fleet's innermost)


def _dp_group():
    return _state["data_group"]


def sharding_world():
    return _hcg().get_sharding_parallel_world_size() if _hcg() else 1


def sharding_rank():
    return _hcg().get_sharding_parallel_rank() if _hcg() else 0


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


def wrap_optimizer(optimizer):
    """`optimizer` itself, or under sharding fleet's `DygraphShardingOptimizer` around it: this rank then keeps the
    AdamW states of its partition of the parameters only, and `step()` updates that partition and broadcasts it.
    The trainer drives the phases (`sum_gradients`, `global_grad_norm`, clipping, `step`) itself instead of through
    fleet's `HybridParallelOptimizer.step`, so the gradient norm is logged and non-finite steps are skipped."""
    if sharding_world() == 1:
        return optimizer
    from paddle.distributed.fleet.meta_optimizers.dygraph_optimizer.dygraph_sharding_optimizer import (
        DygraphShardingOptimizer,
    )

    _state["sharding_optimizer"] = DygraphShardingOptimizer(optimizer, _hcg())
    return _state["sharding_optimizer"]


def inner_optimizer(optimizer):
    """The AdamW inside a sharding wrapper (whose state is this rank's partition), or `optimizer` itself."""
    return getattr(optimizer, "_inner_opt", optimizer)


def _owned(parameters):
    """The parameters whose optimizer state (and reduced gradient) this rank holds: all of them without sharding."""
    opt = _state["sharding_optimizer"]
    return parameters if opt is None else opt.filter_parameters(parameters, _hcg())


def sum_gradients(parameters):
    """Sum the gradients of `parameters` over the data-parallel ranks, in coalesced buckets.

    A SUM, not paddle.DataParallel's average: with global denominators (algorithms.aggregate_loss) each rank's loss
    is its share of the whole-batch loss, so the whole-batch gradient is the sum of the ranks' gradients. Called
    explicitly after the micro-batches instead of wrapping the model in paddle.DataParallel, whose reducer only
    fires through the wrapper's forward, while log-probs are computed from the decoder and LM head directly.
    Tensor-parallel shards are summed within their DP group only (each TP rank owns different weights).
    Under sharding each gradient is reduced to the sharding rank that owns the parameter (fleet's
    `reduce_gradients`, which averages: the gradients are scaled up by the sharding degree first, exact for powers
    of two) and then summed over fleet's data axis; other ranks' copies of it are stale afterwards."""
    if data_parallel_world() == 1:
        return
    from paddle.distributed.fleet.utils.hybrid_parallel_util import fused_allreduce_gradients_with_group

    parameters = [p for p in parameters if not p.stop_gradient]
    opt = _state["sharding_optimizer"]
    if opt is not None:
        with paddle.no_grad():
            for p in parameters:
                if p.grad is not None:
                    p.grad.scale_(float(sharding_world()))
        opt.reduce_gradients(parameters, _hcg())
        parameters = _owned(parameters)
        if _hcg().get_data_parallel_world_size() == 1:
            return
        group = _hcg().get_data_parallel_group()
    else:
        group = _dp_group()
    fused_allreduce_gradients_with_group(parameters, group=group, scale=1.0)


def global_grad_norm(parameters):
    """L2 norm of the whole model's gradient: tensor-parallel shards (`is_distributed`) are summed over the TP
    group, replicated parameters (norms, and everything without TP) counted once; under sharding each rank counts
    the parameters it owns and the sums are added over the sharding group. Call after `sum_gradients`."""
    sums = np.zeros(2)  # [tensor-parallel shards, replicated]
    for p in _owned(list(parameters)):
        if p.grad is not None:
            sums[0 if getattr(p, "is_distributed", False) else 1] += float(
                paddle.sum(paddle.square(p.grad.astype("float32"))))
    if sharding_world() > 1:
        sums = _all_reduce(sums, _hcg().get_sharding_parallel_group())
    if tensor_parallel_world() > 1:
        sums[0] = _all_reduce(sums[:1], _tp_group())[0]
    return float(np.sqrt(sums.sum()))


def _all_reduce(values, group):
    t = paddle.to_tensor(np.asarray(values, dtype=np.float64))
    dist.all_reduce(t, group=group)
    return t.numpy()


def optimizer_shard():
    """Which part of the optimizer state this rank holds, as {axis: rank} for each axis that splits it ("tp",
    "sharding"; empty: the whole state), and whether this rank is the one replica that saves it (fleet's data axis
    replicates every part)."""
    shard = {}
    if tensor_parallel_world() > 1:
        shard["tp"] = tensor_parallel_rank()
    if sharding_world() > 1:
        shard["sharding"] = sharding_rank()
    saves = (_hcg().get_data_parallel_rank() == 0) if _hcg() else rank() == 0
    return shard, saves


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
    from paddle.distributed import collective
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
