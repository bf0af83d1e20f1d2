"""CPU stand-ins for paddle internals that fleet needs and gloo lacks. Each replaces a module attribute of paddle at
start-up (CPU builds only) and was written against paddle `PADDLE_VERSION`; `PINS` records the signature and a hash
of the source of every paddle function it replaces or relies on, and tests/parallel/test_shims.py fails, naming the
shim to re-check, when the installed paddle differs (docs/distributed.md, "Start-up"; docs/platform.md).

What each patch needs at run time (stores, pair groups) lives in its closure: the patched paddle attribute keeps it
alive for as long as the process uses it, and nothing here is module state."""
from __future__ import annotations

import hashlib
import importlib
import inspect
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any

import paddle.distributed as dist

from .differentiable import AllReduce, Concat, Identity, Split

PADDLE_VERSION = "3.3.1"  # the paddle every shim below targets; PINS were taken from it


# ------------------------------------------------------------------------------------------ gloo group stores

def isolate_gloo_groups() -> None:
    """Give every gloo group after the default one a TCP store of its own, so groups cannot read each other's
    rendezvous keys. Targets paddle 3.3.1 (`collective._new_process_group_impl`).

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
    stores = []  # each group's store while the process lives (group rank 0's also serves the other ranks)

    def new_process_group(backend, store, rank, world_size, *args, group_id=0, **kwargs):
        if backend == "gloo" and group_id != 0:  # the default group (id 0) is the first: no leftovers yet
            store = _group_store(store, rank, group_id)
            stores.append(store)
        return original(backend, store, rank, world_size, *args, group_id=group_id, **kwargs)

    new_process_group._isolated = True
    collective._new_process_group_impl = new_process_group


def _group_store(default_store: Any, group_rank: int, group_id: int, timeout: int = 900) -> Any:
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
    return store


# ------------------------------------------------------------------------------- tensor-parallel collectives

def _c_identity(tensor: Any, group: Any = None, skip_c_identity_dynamic: bool = False) -> Any:
    return Identity.apply(tensor, group)


def _mp_allreduce(tensor: Any, op: Any = None, group: Any = None, use_calc_stream: bool = True,
                  use_model_parallel: bool = True, skip_c_identity_dynamic: bool = False) -> Any:
    return AllReduce.apply(tensor, group)


def _c_concat(tensor: Any, group: Any = None) -> Any:
    return Concat.apply(tensor, group)


def _c_split(tensor: Any, group: Any = None) -> Any:
    return Split.apply(tensor, group)


def install_cpu_collectives() -> None:
    """Point fleet's tensor-parallel collectives (`c_identity`, calc-stream all-reduce, concat, split: no CPU
    kernels, docs/platform.md) at the gloo-capable PyLayers of differentiable.py (CPU only). Targets paddle 3.3.1:
    `mp_ops` and `collective` define these four names, and fleet's tensor-parallel layers look them up at call
    time."""
    from paddle.distributed import collective
    from paddle.distributed.fleet.layers.mpu import mp_ops

    replacements = {"_c_identity": _c_identity, "_mp_allreduce": _mp_allreduce, "_c_concat": _c_concat,
                    "_c_split": _c_split}
    for module in (mp_ops, collective):
        for name, fn in replacements.items():
            if hasattr(module, name):
                setattr(module, name, fn)


# ------------------------------------------------------------------------------------------------ pipeline

def install_cpu_pipeline(pp_group: Any, rank: int, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], Any]:
    """CPU stand-ins for fleet's pipeline; returns the pair groups {(a, b): group} it created (empty for 2 stages).
    Targets paddle 3.3.1.

    `ParallelEnv._device_id` is read by PipelineLayer and set only on CUDA/XPU builds. For 3+ stages, p2p goes
    through 2-rank pair groups (`pairs`, from pipeline.pipeline_pairs): ProcessGroupGloo draws one tag per op from a
    per-group counter, so send/recv in a 3-rank group mismatch once two ranks' op histories differ (hangs). fleet's
    p2p code calls `paddle.distributed.send/recv/isend/irecv` at call time, so replacing them reroutes it."""
    from paddle.distributed.parallel import ParallelEnv

    if not hasattr(ParallelEnv, "_device_id"):
        ParallelEnv._device_id = 0
    if not pairs:
        return {}
    pair_groups = {(a, b): dist.new_group([a, b]) for a, b in pairs}  # every rank creates every pair, in order

    def pair(group, peer):
        if group is not None and group.id == pp_group.id:
            return pair_groups[tuple(sorted((rank, peer)))]
        return group

    # The package re-exports functions named like these modules, so fetch the modules themselves.
    send_mod = sys.modules["paddle.distributed.communication.send"]
    recv_mod = sys.modules["paddle.distributed.communication.recv"]
    dist.send = lambda tensor, dst=0, group=None, sync_op=True: send_mod.send(tensor, dst, pair(group, dst), sync_op)
    dist.recv = lambda tensor, src=0, group=None, sync_op=True: recv_mod.recv(tensor, src, pair(group, src), sync_op)
    dist.isend = lambda tensor, dst, group=None: send_mod.isend(tensor, dst, pair(group, dst))
    dist.irecv = lambda tensor, src=None, group=None: recv_mod.irecv(tensor, src, pair(group, src))
    return pair_groups


# ------------------------------------------------------------------------- what the shims rely on in paddle

@dataclass(frozen=True)
class Pin:
    """One paddle object a shim replaces or relies on: `target` is "module:qualified.name" (or a module alone),
    `signature` its `inspect.signature` ("" for modules, classes and C++ functions), `sha256` the first 16 hex
    digits of the hash of its source (of its docstring for C++ functions, which carries their signature)."""
    shim: str
    target: str
    signature: str
    sha256: str


def resolve(target: str) -> Any:
    """The object "module:qualified.name" (or "module") names."""
    module, _, qualname = target.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split(".") if qualname else ():
        obj = getattr(obj, part)
    return obj


def fingerprint(obj: Any) -> tuple[str, str]:
    """(signature, sha256 prefix of the source) of a function, class or module; C++ functions by docstring."""
    try:
        text, signature = inspect.getsource(obj), ""
        if inspect.isfunction(obj) or inspect.ismethod(obj):
            signature = str(inspect.signature(obj))
    except (OSError, TypeError):  # a pybind function: no Python source
        text, signature = obj.__doc__ or "", ""
    return signature, hashlib.sha256(text.encode()).hexdigest()[:16]


def changed_pins(pins: tuple[Pin, ...]) -> list[str]:
    """One message per pin whose paddle object is missing or differs from when the shim was written."""
    problems = []
    for pin in pins:
        where = f"paddle {PADDLE_VERSION} -> installed {_installed_paddle()}"
        try:
            signature, sha = fingerprint(resolve(pin.target))
        except (ImportError, AttributeError) as e:
            problems.append(f"{pin.target} is gone ({where}: {e}); re-check the shim {pin.shim}")
            continue
        if (signature, sha) != (pin.signature, pin.sha256):
            problems.append(f"{pin.target} changed ({where}; signature {pin.signature!r} -> {signature!r}, source "
                            f"sha256 {pin.sha256} -> {sha}); re-check the shim {pin.shim} and then update its Pin")
    return problems


def _installed_paddle() -> str:
    import paddle

    return paddle.__version__


_MP_OPS = "paddle.distributed.fleet.layers.mpu.mp_ops"
_PP = "paddle.distributed.fleet.meta_parallel"
PINS = (
    Pin("isolate_gloo_groups", "paddle.distributed.collective:_new_process_group_impl",
        "(backend, store, rank, world_size, group_name, pg_options, group_id=0, nccl_comm_init_option=0, "
        "nccl_config=None)", "8a655ac71d5ccaee"),
    Pin("isolate_gloo_groups", "paddle.distributed.collective:new_group",
        "(ranks: 'list[int] | None' = None, backend: \"Literal['nccl'] | None\" = None, timeout: "
        "'datetime.timedelta' = datetime.timedelta(seconds=1800), nccl_comm_init_option: 'int' = 0, "
        "nccl_config: 'NCCLConfig | None' = None) -> 'Group'", "fcf4b3b615b4b09b"),
    Pin("isolate_gloo_groups", "paddle.base.core:TCPStore.__init__", "", "fab020f420cf30a6"),
    Pin("install_cpu_collectives", f"{_MP_OPS}:_c_identity", "(tensor, group=None, skip_c_identity_dynamic=False)",
        "8de16d30a568d5d5"),
    Pin("install_cpu_collectives", f"{_MP_OPS}:_mp_allreduce",
        "(tensor, op=0, group=None, use_calc_stream=True, use_model_parallel=True, skip_c_identity_dynamic=False)",
        "3b588ae6d2e4b482"),
    Pin("install_cpu_collectives", f"{_MP_OPS}:_c_concat", "(tensor, group=None)", "a898b332d578d352"),
    Pin("install_cpu_collectives", f"{_MP_OPS}:_c_split", "(tensor, group=None)", "ad4ea7b2e51064b6"),
    Pin("install_cpu_collectives", "paddle.distributed.fleet.layers.mpu.mp_layers", "", "adcded018baeec01"),
    Pin("install_cpu_pipeline", "paddle.distributed.parallel:ParallelEnv.__init__", "(self)", "50c1473482be9898"),
    Pin("install_cpu_pipeline", f"{_PP}.parallel_layers.pp_layers:PipelineLayer.__init__",
        "(self, layers, num_stages=None, topology=None, loss_fn=None, seg_method='uniform', recompute_interval=0, "
        "recompute_ctx=None, num_virtual_pipeline_stages=None, use_cudagraph=False, use_dualpipev=False)",
        "c2e097246f9fa30b"),
    Pin("install_cpu_pipeline", "paddle.distributed.communication.send:send",
        "(tensor: 'Tensor', dst: 'int' = 0, group: 'Group | None' = None, sync_op: 'bool' = True) -> 'task | None'",
        "e0021a470bf914e4"),
    Pin("install_cpu_pipeline", "paddle.distributed.communication.send:isend",
        "(tensor: 'Tensor', dst: 'int', group: 'Group | None' = None) -> 'task | None'", "f4cb97fd56929434"),
    Pin("install_cpu_pipeline", "paddle.distributed.communication.recv:recv",
        "(tensor: 'Tensor', src: 'int' = 0, group: 'Group | None' = None, sync_op: 'bool' = True) -> 'task'",
        "1adc5dd1bba23c45"),
    Pin("install_cpu_pipeline", "paddle.distributed.communication.recv:irecv",
        "(tensor: 'Tensor', src: 'int | None' = None, group: 'Group | None' = None) -> 'task'", "23e1f0e14490e5e6"),
    Pin("install_cpu_pipeline", f"{_PP}.pp_utils.p2p_communication", "", "fd7d36fecb659b58"),
    # Not a patch: Pipeline.forward_backward does what _prepare_training does, minus taking fleet's optimizer.
    Pin("Pipeline.forward_backward", f"{_PP}.pipeline_parallel:PipelineParallel._prepare_training",
        "(self, data, optimizer, lr_scheduler)", "7d3fb1de833d18e7"),
    Pin("Pipeline.forward_backward", f"{_PP}.pipeline_parallel:PipelineParallelWithInterleave._prepare_training",
        "(self, data, optimizer, lr_scheduler)", "7d3fb1de833d18e7"),
)
