"""Everything that touches paddle.distributed: start-up, groups, collectives, tensor/pipeline parallel, sharding.

A single process (plain `python run_rl.py`) needs no initialisation: every collective here degrades to the identity,
so the trainer is written once for any number of ranks. Under `python -m paddle.distributed.launch`:
- data parallel only: `init_parallel_env`; the data-parallel (DP) group is the whole world;
- tensor parallel (`tensor_parallel_degree > 1`), sharding (`sharding: stage1`) or pipeline parallel
  (`pipeline_parallel_degree > 1`): fleet's hybrid topology. The data-parallel (DP) group is every rank that holds
  the same model shard and pipeline stage, i.e. fleet's data *and* sharding axes: they all receive different
  prompts. Per-sequence data (rewards, masks) is gathered over the DP group, gradients are summed over it, and the
  tensor-parallel (TP) ranks of one group see identical data, sample identical completions (sampling.py keys by DP
  row) and share one reward request.
- sharding stage1 (ZeRO-1, https://arxiv.org/abs/1910.02054): fleet's `DygraphShardingOptimizer` owns the AdamW
  states of a partition of the parameters on each sharding rank; gradients are reduced to their owner, the owner
  updates and broadcasts the parameter. `wrap_optimizer` builds it, `sum_gradients` / `global_grad_norm` follow it.
- pipeline parallel: `Pipeline` trains this rank's stage of PaddleNLP's pipeline model through fleet's scheduler
  and copies the weights into the trainer's full copy of the policy, which generates (docs/distributed.md).

On CPU, fleet's tensor-parallel layers call collectives without CPU kernels (`c_identity`, calc-stream all-reduce;
PLATFORM.md). `install_cpu_collectives` replaces exactly those with `PyLayer`s over `dist.all_reduce` /
`dist.all_gather`, which gloo implements; it is used only when paddle has no CUDA device. Fleet's pipeline needs
three more CPU stand-ins (`_configure_pipeline`, `_install_cpu_pipeline`).
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable

import numpy as np
import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

logger = logging.getLogger("paddle_grpo.distributed")

_state = {"initialised": False, "hcg": None, "data_group": None, "sharding_optimizer": None}


# ------------------------------------------------------------------------------------------------ start-up

def world_size():
    return dist.get_world_size()


def rank():
    return dist.get_rank()


def is_main():
    """Rank 0 alone logs, writes metrics and checkpoints."""
    return rank() == 0


def local_rank() -> int:
    """This process's rank on its node, from the launcher's environment (`paddle.distributed.launch` sets
    PADDLE_LOCAL_RANK; 0 in a single process). Readable before `init`."""
    return int(os.environ.get("PADDLE_LOCAL_RANK", os.environ.get("PADDLE_RANK_IN_NODE", "0")))


def _launch_id() -> str:
    """Names this launch on this node: the workers of one `paddle.distributed.launch` share its pid (their parent)
    and endpoint list; a marker left by an earlier launch carries another."""
    return f"{socket.gethostname()} {os.getppid()} {os.environ.get('PADDLE_TRAINER_ENDPOINTS', '')}"


def build_once_per_node(path: str, build: Callable[[str], object], what: str, *, poll_seconds: float = 1.0,
                        log_seconds: float = 30.0) -> None:
    """Make the missing directory `path` with `build(directory)` once per node, before any process group exists.

    A build can take longer than a collective's timeout (gloo's is a fixed 30 s), so no rank waits for it in a
    collective: local rank 0 builds into a temporary directory beside `path` (named by host and pid) and renames it
    into place, so `path` is either absent or complete; the other local ranks poll the file system for it and log
    every `log_seconds`. If the build fails, the builder writes `<path>.failed-<host>` with the error and this
    launch's id before re-raising, and the waiting ranks stop with that error instead of waiting for a directory
    that will not come. Temporary directories of builders that are no longer running (a killed run) are removed.
    Several nodes on a shared file system each build; the first rename wins and the others keep its copy."""
    path = os.path.normpath(path)
    host = socket.gethostname()
    failed = f"{path}.failed-{host}"
    if local_rank() != 0:
        start = last_log = time.monotonic()
        logger.info("waiting for local rank 0 to build %s with %s", path, what)
        while not os.path.isdir(path):
            error = _failure_of_this_launch(failed)
            if error is not None:
                raise RuntimeError(f"local rank 0 failed to build {path} with {what}: {error}")
            if time.monotonic() - last_log >= log_seconds:
                last_log = time.monotonic()
                logger.info("still waiting for local rank 0 to build %s (%.0f s)", path, last_log - start)
            time.sleep(poll_seconds)
        return
    parent, base = os.path.split(os.path.abspath(path))
    prefix = f"{base}.tmp-{host}-"
    os.makedirs(parent, exist_ok=True)
    for name in os.listdir(parent):
        pid = name[len(prefix):].split(".")[0] if name.startswith(prefix) else ""  # "<pid>" or "<pid>.<suffix>"
        if pid.isdigit() and not _running(int(pid)):
            logger.info("removing %s, left by a build that is no longer running", os.path.join(parent, name))
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    if os.path.exists(failed):
        os.remove(failed)
    tmp = os.path.join(parent, f"{prefix}{os.getpid()}")
    logger.info("%s does not exist: building it with %s", path, what)
    try:
        build(tmp)
        try:
            os.rename(tmp, path)  # atomic: other ranks see no directory or a complete one
            logger.info("%s is ready", path)
        except OSError:
            if not os.path.isdir(path):
                raise
            logger.info("%s was built meanwhile by another node; using that copy", path)
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            with open(failed, "w", encoding="utf-8") as f:
                json.dump({"launch": _launch_id(), "error": f"{type(e).__name__}: {e}"}, f)
        except OSError:
            logger.warning("could not write %s; the other local ranks wait until the launcher stops them", failed)
        raise


def _failure_of_this_launch(marker):
    """The error recorded in a builder's failure marker when this launch wrote it (None otherwise)."""
    try:
        with open(marker, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):  # absent, or being written
        return None
    return record.get("error", "unknown error") if record.get("launch") == _launch_id() else None


def _running(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


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
    from .config import sharding_options

    checks = (
        ("pipeline_parallel_degree", cfg.pipeline_parallel_degree if cfg.sharding else 1,
         f"together with sharding: {cfg.sharding!r}; set sharding: '' for pipeline parallelism, or "
         "pipeline_parallel_degree: 1 for sharding"),
        ("sharding", cfg.sharding if cfg.sharding == "stage2" else "",
         ("stage2 (fleet's group_sharded_parallel) runs only on GPU/XPU and could not be tested here; stage1 "
          "shards the optimizer states")),
        ("sharding_parallel_config", "split_param" if "split_param" in sharding_options(cfg) else "",
         "sharding V2 keeps gradients in main_grad, which the trainer's gradient path does not read"))
    return [f"{key}: {value!r} is not supported by this version of paddle_grpo ({why})"
            for key, value, why in checks if value not in (1, "")]


def init(cfg):
    """Initialise the process groups for the configured layout; returns the data-parallel world size."""
    n = world_size()
    cfg.batch_geometry(n)  # raises ConfigError naming the keys when the batch does not split over n processes
    check_pipeline_config(cfg)
    if n == 1 or _state["initialised"]:
        return data_parallel_world()
    problems = unsupported_layout(cfg)
    if problems:
        raise NotImplementedError("; ".join(problems) + ". See docs/distributed.md.")
    degrees = hybrid_degrees(cfg, n)
    if degrees["mp_degree"] > 1 or degrees["sharding_degree"] > 1 or degrees["pp_degree"] > 1:
        from paddle.distributed import fleet

        cpu = not paddle.device.is_compiled_with_cuda()
        if cpu:
            _isolate_gloo_groups()
        strategy = fleet.DistributedStrategy()
        strategy.hybrid_configs = dict(degrees)
        if degrees["pp_degree"] > 1:
            _configure_pipeline(strategy, cfg, cpu)
        fleet.init(is_collective=True, strategy=strategy)
        _state["hcg"] = fleet.get_hybrid_communicate_group()
        _state["data_group"] = _new_groups(data_parallel_groups(_state["hcg"].topology()))
        if cpu and degrees["mp_degree"] > 1:
            install_cpu_collectives()
        if cpu and degrees["pp_degree"] > 1:
            _install_cpu_pipeline()
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


# Each gloo group's store while the process lives (group rank 0's also serves it to the other ranks).
_group_stores = []


def _isolate_gloo_groups():
    """Give every gloo group after the default one a TCP store of its own, so groups cannot read each other's
    rendezvous keys.

    paddle's `ProcessGroupGloo` (3.x) rendezvouses twice per group on the store it is given: once for its
    `GlooCommContext`, under keys prefixed with the group id, and once in its constructor (a second gloo context,
    `connectFullMesh`), under the bare keys "0", "1", ... of the group ranks, in the one TCP store all groups share.
    Those bare keys are left over from the previous groups, so a rank that reads key "j" before rank j of *its*
    group has overwritten it gets another group's address: `address.cc:30 sizeof(impl_) == bytes.size()` when that
    group had another size, `pair.cc connect ... Connection refused` / `Connection reset` when its listener has
    closed. fleet.init with 3-4 processes (8-12 groups) failed in a good share of launches, even with a barrier
    after each group (docs/distributed.md, "Start-up"). A new store per group has no leftover keys: every read is
    of this group's own value. fleet and `new_group` look `_new_process_group_impl` up at call time, so replacing
    the module attribute reaches every group they create."""
    from paddle.distributed import collective

    original = collective._new_process_group_impl
    if getattr(original, "_isolated", False):
        return

    def new_process_group(backend, store, rank, world_size, *args, group_id=0, **kwargs):
        if backend == "gloo" and group_id != 0:  # the default group (id 0) is the first: no leftovers yet
            store = _group_store(store, rank, group_id)
        return original(backend, store, rank, world_size, *args, group_id=group_id, **kwargs)

    new_process_group._isolated = True
    collective._new_process_group_impl = new_process_group


def _group_store(default_store, group_rank, group_id, timeout=900):
    """A new TCP store for group `group_id`: group rank 0 serves it on a free port of its host and publishes the
    address in the default store (the group id is unique in this launch), the other members connect to it."""
    from paddle.base import core

    key = f"paddle_grpo/group_store/{group_id}"
    if group_rank == 0:
        host = os.environ.get("PADDLE_CURRENT_ENDPOINT", "127.0.0.1:0").rsplit(":", 1)[0]
        for attempt in range(1, 6):
            with socket.socket() as probe:  # a free port; another process may take it before the store binds it
                probe.bind(("", 0))  # all interfaces, as the store listens
                port = probe.getsockname()[1]
            try:
                store = core.TCPStore(host, port, True, 0, timeout)  # 0 workers: the constructor does not wait
                break
            except Exception as e:  # paddle raises its own error types for a failed bind
                if attempt == 5:
                    raise RuntimeError(f"could not serve the TCP store of gloo group {group_id} on {host}: "
                                       f"{e}") from e
        default_store.set(key, f"{host}:{port}".encode())
    else:
        host, port = bytes(default_store.get(key)).decode().rsplit(":", 1)  # get waits for the key
        store = core.TCPStore(host, int(port), False, 0, timeout)
    _group_stores.append(store)
    return store


def _hcg():
    return _state["hcg"]


def data_parallel_world():
    """Ranks that receive different prompts (fleet's data x sharding degrees); no data group: all of them."""
    group = _state["data_group"]
    return group.nranks if group is not None else world_size()


def data_parallel_rank():
    group = _state["data_group"]
    if group is not None:
        return group.ranks.index(rank())  # not group.rank: paddle gives a one-rank group rank -1
    return rank()


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


def pipeline_parallel_world():
    return _hcg().get_pipe_parallel_world_size() if _hcg() else 1


def pipeline_stage():
    return _hcg().get_stage_id() if _hcg() else 0


def _pp_group():
    return _hcg().get_pipe_parallel_group() if _hcg() else None


def prompt_positions(n, world, rank, mini_batch):
    """Which of a step's `n` prompts (positions in the sampled batch) data-parallel rank `rank` of `world` takes.

    Each global mini-batch of `mini_batch` prompts is split evenly over the ranks, so a rank's k-th local
    mini-batch is its share of global mini-batch k, and N ranks update on exactly the mini-batches one process does
    (a plain contiguous split would hand rank r the r-th block of prompts, mixing global mini-batches). Falls back
    to the contiguous split when `n` is not a whole number of such mini-batches (dynamic sampling's larger
    generation batch)."""
    if n % mini_batch or mini_batch % world:
        per_rank = n // world
        return list(range(rank * per_rank, (rank + 1) * per_rank))
    share = mini_batch // world
    return [start + rank * share + i for start in range(0, n, mini_batch) for i in range(share)]


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
    the parameters it owns and the sums are added over the sharding group; under pipeline parallelism over the
    pipeline group (a tied embedding's second copy left out). Call after `sum_gradients`."""
    parts = ([], [])  # squared norms of (tensor-parallel shards, replicated parameters)
    for p in _owned(list(parameters)):
        if p.grad is not None and not getattr(p, "pipeline_duplicate", False):
            parts[0 if getattr(p, "is_distributed", False) else 1].append(
                paddle.sum(paddle.square(p.grad.astype("float32"))))
    # add_n in float32, as before sharding and pipelines existed: a one-process run's norm (and so its clipping
    # and every later step) stays bitwise what the documented quickstart results were measured with.
    sums = np.array([float(paddle.add_n(part)) if part else 0.0 for part in parts])
    if sharding_world() > 1:
        sums = _all_reduce(sums, _hcg().get_sharding_parallel_group())
    if tensor_parallel_world() > 1:
        sums[0] = _all_reduce(sums[:1], _tp_group())[0]
    if pipeline_parallel_world() > 1:
        sums = _all_reduce(sums, _pp_group())
    return float(np.sqrt(sums.sum()))


def _all_reduce(values, group):
    t = paddle.to_tensor(np.asarray(values, dtype=np.float64))
    dist.all_reduce(t, group=group)
    return t.numpy()


def optimizer_shard():
    """Which part of the optimizer state this rank holds, as {axis: rank} for each axis that splits it ("pp", "tp",
    "sharding"; empty: the whole state), and whether this rank is the one replica that saves it (fleet's data axis
    replicates every part)."""
    shard = {}
    if pipeline_parallel_world() > 1:
        shard["pp"] = pipeline_stage()
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


def share_within_model_parallel_group(compute):
    """`compute()` on the first rank of this tensor-parallel (or pipeline) group, its result on every rank of the
    group (the group's ranks hold the same data: one reward request per group, not one per rank)."""
    if tensor_parallel_world() > 1:
        group, first = _tp_group(), tensor_parallel_rank() == 0
    elif pipeline_parallel_world() > 1:
        group, first = _pp_group(), pipeline_stage() == 0
    else:
        return compute()
    return _from_first_rank(compute() if first else None, group)


def from_first_stage(obj):
    """`obj` of the first pipeline stage on every stage of this pipeline (identity without pipeline parallelism).
    The stages sample with the same keys from identical weights; this makes their batches equal even where a
    GPU's generation is not bitwise reproducible."""
    if pipeline_parallel_world() == 1:
        return obj
    return _from_first_rank(obj, _pp_group())


def _from_first_rank(obj, group):
    """The `obj` of the first rank of `group`, on every rank of it."""
    box = [obj]
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


# ------------------------------------------------------------------------------------------ pipeline parallel

def check_pipeline_config(cfg):
    """Fail at start-up, naming the keys, on pipeline layouts this trainer or fleet cannot run."""
    from .config import ConfigError

    pp, vpp = cfg.pipeline_parallel_degree, cfg.virtual_pp_degree
    if vpp > 1 and pp < 3:
        raise ConfigError(f"virtual_pp_degree ({vpp}) > 1 needs pipeline_parallel_degree >= 3 (fleet's interleaved "
                          f"scheduler); pipeline_parallel_degree is {pp}")
    if pp == 1:
        return
    if cfg.tensor_parallel_degree > 1:
        raise NotImplementedError(f"tensor_parallel_degree ({cfg.tensor_parallel_degree}) together with "
                                  f"pipeline_parallel_degree ({pp}) is not supported; use one of them")
    if cfg.lora:
        raise NotImplementedError(f"lora: true with pipeline_parallel_degree ({pp}) is not supported")
    if vpp > 1:
        geo = cfg.batch_geometry(max(world_size(), cfg.tensor_parallel_degree * pp))
        if geo.grad_accum_steps < pp:
            raise ConfigError(
                f"virtual_pp_degree ({vpp}) needs at least pipeline_parallel_degree ({pp}) micro-batches per "
                f"optimizer step; global_mini_batch_size / data-parallel degree x rollout_n / "
                f"per_device_train_batch_size ({cfg.per_device_train_batch_size}) gives {geo.grad_accum_steps}")


def _configure_pipeline(strategy, cfg, cpu):
    geo = cfg.batch_geometry(world_size())
    # One pipeline call per mini-batch: its micro-batches are the trainer's micro-batches.
    strategy.pipeline_configs = {"accumulate_steps": geo.grad_accum_steps,
                                 "micro_batch_size": cfg.per_device_train_batch_size}
    pp_configs = strategy.hybrid_configs["pp_configs"]
    # The loss is already this micro-batch's share of the mini-batch loss (global denominators): fleet must not
    # divide it by accumulate_steps. With delay_scale_loss fleet would instead scale the gradients in
    # _optimizer_step, which the trainer never calls (it steps its own optimizer after summing over DP ranks).
    pp_configs.delay_scale_loss = True
    # Sequence lengths change every mini-batch: p2p shape metadata must not be reused across calls.
    pp_configs.clear_every_step_cache = True
    if cpu:
        pp_configs.use_batch_p2p_comm = False  # batched isend/irecv need the calc stream gloo lacks


def pipeline_pairs(ranks):
    """The 2-rank groups a gloo pipeline of `ranks` (global ranks in stage order) routes its p2p through: each pair of
    neighbouring stages, the last and the first included (the interleaved scheduler sends from the last stage to
    the first). Empty for 2 stages (the pipeline group itself is a pair). Sorted, so every rank creates the same
    groups in the same order."""
    n = len(ranks)
    if n <= 2:
        return []
    return sorted({tuple(sorted((ranks[i], ranks[(i + 1) % n]))) for i in range(n)})


_pair_groups = {}


def _install_cpu_pipeline():
    """CPU stand-ins for fleet's pipeline: `ParallelEnv._device_id` (read by PipelineLayer, set only on CUDA/XPU
    builds) and, for 3+ stages, p2p through 2-rank pair groups: ProcessGroupGloo draws one tag per op from a
    per-group counter, so send/recv in a 3-rank group mismatch once two ranks' op histories differ (hangs)."""
    import sys

    from paddle.distributed.parallel import ParallelEnv

    if not hasattr(ParallelEnv, "_device_id"):
        ParallelEnv._device_id = 0
    pp_group = _pp_group()
    pairs = pipeline_pairs(list(pp_group.ranks))
    if not pairs:
        return
    for a, b in pairs:  # every rank creates every pair group, in the same order
        _pair_groups[(a, b)] = dist.new_group([a, b])

    def pair(group, peer):
        if group is not None and group.id == pp_group.id:
            return _pair_groups[tuple(sorted((rank(), peer)))]
        return group

    # The package re-exports functions named like these modules, so fetch the modules themselves.
    send_mod = sys.modules["paddle.distributed.communication.send"]
    recv_mod = sys.modules["paddle.distributed.communication.recv"]
    dist.send = lambda tensor, dst=0, group=None, sync_op=True: send_mod.send(tensor, dst, pair(group, dst), sync_op)
    dist.recv = lambda tensor, src=0, group=None, sync_op=True: recv_mod.recv(tensor, src, pair(group, src), sync_op)
    dist.isend = lambda tensor, dst, group=None: send_mod.isend(tensor, dst, pair(group, dst))
    dist.irecv = lambda tensor, src=None, group=None: recv_mod.irecv(tensor, src, pair(group, src))


def stage_chunks(num_layers, pp, vpp=1):
    """Which decoder layers each pipeline stage holds, as PaddleNLP's Qwen2ForCausalLMPipe splits them.

    The pipe is a list of `num_layers + 3` items (embedding, decoders, final norm, LM head) cut by fleet's
    SegmentLayers into `pp * vpp` chunks with equal numbers of decoder layers (PaddleNLP falls back to equal
    numbers of items when `num_layers % pp`); chunk c runs on stage `c % pp`. Returns {stage: [[item indices of
    one chunk], ...]} with item 0 the embedding and item `num_layers + 2` the LM head."""
    from paddle.distributed.fleet.meta_parallel.parallel_layers.pp_layers import SegmentLayers

    items = [type("Qwen2EmbeddingPipe", (), {})] + [type("Qwen2DecoderLayerPipe", (), {})] * num_layers + [
        type("Qwen2RMSNormPipe", (), {}), type("Qwen2LMHeadPipe", (), {})]
    method = "layer:Qwen2DecoderLayer" if num_layers % pp == 0 else "uniform"
    bounds = SegmentLayers(items, num_parts=pp, method=method,
                           num_virtual_pipeline_stage=vpp if vpp > 1 else None).do_segment()
    chunks = {s: [] for s in range(pp)}
    for c in range(len(bounds) - 1):
        chunks[c % pp].append(list(range(bounds[c], bounds[c + 1])))
    return chunks


def expected_owner(name, num_layers, pp, vpp=1):
    """The pipeline stage that holds the full model's parameter `name` (`qwen2.layers.3.mlp.up_proj.weight`, ...)
    under `stage_chunks`; a tied embedding counts as the first stage's."""
    parts = name.split(".")
    if parts[1:2] == ["embed_tokens"]:
        item = 0
    elif parts[1:2] == ["layers"]:
        item = int(parts[2]) + 1
    elif parts[1:2] == ["norm"]:
        item = num_layers + 1
    else:  # lm_head
        item = num_layers + 2
    return next(s for s, chunks in stage_chunks(num_layers, pp, vpp).items() for c in chunks if item in c)


def merge_owners(per_stage):
    """{name: owning stage} from each stage's list of parameter names (index = stage); a name two stages hold
    (the tied embedding) belongs to the first."""
    owners = {}
    for stage, names in enumerate(per_stage):
        for name in names:
            owners.setdefault(name, stage)
    return owners


class Pipeline:
    """This rank's stage of the policy as PaddleNLP's pipeline model, trained through fleet's 1F1B (or interleaved)
    scheduler; the trainer's full (non-pipeline) copy of the policy generates and scores, and gets the trained
    weights by `copy_to` after every optimizer step."""

    def __init__(self, full_model, virtual_pp_degree=1):
        from paddle.distributed import fleet
        from paddlenlp.transformers import AutoModelForCausalLMPipe

        from .config import ConfigError

        config = full_model.config
        pp = pipeline_parallel_world()
        if virtual_pp_degree > 1 and config.num_hidden_layers % (pp * virtual_pp_degree):
            raise ConfigError(f"the policy's {config.num_hidden_layers} layers do not split into "
                              f"pipeline_parallel_degree ({pp}) x virtual_pp_degree ({virtual_pp_degree}) chunks")
        config = type(config).from_dict(config.to_dict())
        config.pipeline_parallel_degree = pp
        config.virtual_pp_degree = virtual_pp_degree
        self.layers = AutoModelForCausalLMPipe.from_config(config, dtype="float32")
        own = self.layers.state_dict()
        full = full_model.state_dict()
        self.layers.set_state_dict({k: full[k] for k in own})
        gathered = []
        dist.all_gather_object(gathered, sorted(own), group=_pp_group())
        self.owners = merge_owners(gathered)
        expected = {k: expected_owner(k, config.num_hidden_layers, pp, virtual_pp_degree) for k in self.owners}
        if expected != self.owners:  # the documented split (stage_chunks, unit-tested) must be fleet's
            raise RuntimeError(f"fleet split the layers differently from stage_chunks: "
                               f"{ {k: v for k, v in self.owners.items() if expected[k] != v} }")
        # A tied embedding lives on the first and the last stage (fleet all-reduces its gradient): in the gradient
        # norm only the first stage's copy counts.
        for comm in getattr(self.layers, "shared_comm", {}).values():
            if rank() != min(comm["ranks"]):
                for attr in comm["weight_attr"]:
                    getattr(comm["layer"], attr).pipeline_duplicate = True
        self.model = fleet.distributed_model(self.layers)

    def parameters(self):
        return self.layers.parameters()

    @property
    def is_last_stage(self):
        return pipeline_stage() == pipeline_parallel_world() - 1

    def forward_backward(self, inputs, labels, loss_fn):
        """Forward and backward of one mini-batch split into fleet's micro-batches. `inputs`: the first stage's
        tuple (input_ids, attention_mask, None, position_ids), each [n, S]; `labels`: the last stage's tuple of
        [n, ...] tensors (or None) handed, sliced per micro-batch, to `loss_fn(logits [mb, S, V], labels)`, whose
        loss is backpropagated unscaled."""
        self.layers._loss_fn = [loss_fn]
        # What PipelineParallel._prepare_training does besides taking fleet's optimizer, which this trainer does
        # not use (it sums gradients over data ranks and clips by the global norm itself).
        self.model.set_virtual_pipeline_rank(0)
        self.model.loss_fn_idx = 0
        self.layers.train()
        self.model.forward_backward_pipeline([inputs, labels], None)

    def from_last_stage(self, values):
        """A float64 array computed on the last stage, on every stage."""
        t = paddle.to_tensor(np.asarray(values, dtype=np.float64))
        group = _pp_group()
        dist.broadcast(t, src=group.ranks[-1], group=group)
        return t.numpy()

    @paddle.no_grad()
    def copy_to(self, full_model):
        """Every parameter of `full_model` from the stage that owns it (a broadcast over the pipeline group)."""
        own = self.layers.state_dict()
        group = _pp_group()
        stage = pipeline_stage()
        for name, param in sorted(full_model.state_dict().items()):
            owner = self.owners[name]
            if owner == stage:
                param.set_value(own[name])
            dist.broadcast(param, src=group.ranks[owner], group=group)

    def load_from(self, full_model):
        """This stage's parameters from `full_model` (after a resume loaded it)."""
        own = self.layers.state_dict()
        full = full_model.state_dict()
        self.layers.set_state_dict({k: full[k] for k in own})
