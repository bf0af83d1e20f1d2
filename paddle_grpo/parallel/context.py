"""`ParallelContext`: this process's place in the parallel layout, built once from the config, and every collective
the trainer calls through it.

A single process (plain `python run_rl.py`) needs no initialisation: every collective degrades to the identity, so
the trainer is written once for any number of ranks. Under `python -m paddle.distributed.launch`:
- data parallel only: `init_parallel_env`; the data-parallel (DP) group is the whole world;
- tensor parallel (`tensor_parallel_degree > 1`), sharding (`sharding: stage1`) or pipeline parallel
  (`pipeline_parallel_degree > 1`): fleet's hybrid topology. The data-parallel (DP) group is every rank that holds
  the same model shard and pipeline stage, i.e. fleet's data *and* sharding axes: they all receive different
  prompts. Per-sequence data (rewards, masks) is gathered over the DP group, gradients are summed over it, and the
  tensor-parallel (TP) ranks of one group see identical data, sample identical completions (rollout/sampling.py keys
  by DP row) and share one reward request.
- sharding stage1 (ZeRO-1, https://arxiv.org/abs/1910.02054): fleet's `DygraphShardingOptimizer` owns the AdamW
  states of a partition of the parameters on each sharding rank (gradients.py).
- pipeline parallel: `Pipeline` (pipeline.py) trains this rank's stage; the trainer's full copy generates.
On CPU the shims of cpu_shims.py stand in for the paddle internals gloo lacks.
"""
from __future__ import annotations

import copy

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import paddle
import paddle.distributed as dist

from . import collectives, cpu_shims, gradients
from .layout import (check_pipeline_config, data_parallel_groups, fleet_strategy, hybrid_degrees, prompt_positions,
                     unsupported_layout)
from .pipeline import Pipeline, pipeline_pairs
from .vocab import VocabParallel

T = TypeVar("T")


class ParallelContext:
    """Ranks, groups and collectives of one process. `hcg`: fleet's HybridCommunicateGroup (None without
    tensor/pipeline parallelism or sharding); `dp_group`: the data-parallel group (None: the whole world);
    `pair_groups`: a 3+ stage gloo pipeline's p2p pairs {(a, b): group}."""

    def __init__(self, world_size: int = 1, rank: int = 0, hcg: Any = None, dp_group: Any = None,
                 pair_groups: dict[tuple[int, int], Any] | None = None) -> None:
        self.world_size, self.rank, self.hcg, self.dp_group = world_size, rank, hcg, dp_group
        self.pair_groups = pair_groups or {}
        # Ranks that receive different prompts (fleet's data x sharding degrees); no data group: all of them.
        self.dp_world = dp_group.nranks if dp_group is not None else world_size
        # not group.rank: paddle gives a one-rank group rank -1
        self.dp_rank = dp_group.ranks.index(rank) if dp_group is not None else rank
        self.tp_world = hcg.get_model_parallel_world_size() if hcg else 1
        self.tp_rank = hcg.get_model_parallel_rank() if hcg else 0
        self.tp_group = hcg.get_model_parallel_group() if hcg else None
        self.pp_world = hcg.get_pipe_parallel_world_size() if hcg else 1
        self.pp_stage = hcg.get_stage_id() if hcg else 0
        self.pp_group = hcg.get_pipe_parallel_group() if hcg else None
        self.sharding_world = hcg.get_sharding_parallel_world_size() if hcg else 1
        self.sharding_rank = hcg.get_sharding_parallel_rank() if hcg else 0
        # Log-probs and entropy from this rank's vocabulary shard under tensor parallelism.
        self.vocab_parallel = VocabParallel(self.tp_group, self.tp_rank, self.tp_world) if self.tp_world > 1 else None
        self.sharding_optimizer = None  # set by wrap_optimizer under sharding

    @classmethod
    def from_config(cls, cfg: Any) -> ParallelContext:
        """Check `cfg.batch_geometry(world)` and the pipeline config, and under a launch create the process groups
        of the configured layout (once per process). A single process creates none, so this runs any number of
        times in one process."""
        world = dist.get_world_size()
        cfg.batch_geometry(world)  # raises ConfigError naming the keys when the batch does not split over world
        check_pipeline_config(cfg, world)
        if world == 1:
            return cls()
        if dist.is_initialized():
            raise RuntimeError("the process groups of this launch exist already: build one ParallelContext per "
                               "process and pass it on")
        problems = unsupported_layout(cfg)
        if problems:
            raise NotImplementedError("; ".join(problems) + ". See docs/distributed.md.")
        degrees = hybrid_degrees(cfg, world)
        if degrees["mp_degree"] == 1 and degrees["sharding_degree"] == 1 and degrees["pp_degree"] == 1:
            dist.init_parallel_env()
            return cls(world, dist.get_rank())
        from paddle.distributed import fleet

        cpu = not paddle.device.is_compiled_with_cuda()
        if cpu:
            cpu_shims.isolate_gloo_groups()
        fleet.init(is_collective=True, strategy=fleet_strategy(cfg, world, cpu))
        hcg, rank = fleet.get_hybrid_communicate_group(), dist.get_rank()
        dp_group = collectives.new_groups(data_parallel_groups(hcg.topology()), world, rank)
        if cpu and degrees["mp_degree"] > 1:
            cpu_shims.install_cpu_collectives()
        pairs = {}
        if cpu and degrees["pp_degree"] > 1:
            pp_group = hcg.get_pipe_parallel_group()
            pairs = cpu_shims.install_cpu_pipeline(pp_group, rank, pipeline_pairs(list(pp_group.ranks)))
        return cls(world, rank, hcg, dp_group, pairs)

    @property
    def is_main(self) -> bool:
        """Rank 0 alone logs, writes metrics and checkpoints."""
        return self.rank == 0

    def model_load_kwargs(self) -> dict[str, int]:
        """Keyword arguments for `from_pretrained` that load this rank's tensor-parallel shard (none without TP)."""
        if self.tp_world == 1:
            return {}
        return {"tensor_parallel_degree": self.tp_world, "tensor_parallel_rank": self.tp_rank}

    def tools_for_rollout(self, env: Any) -> Any:
        """The tool environment this rank's multi-turn rollouts use: `env` itself, or under tensor parallelism a
        `tools.GroupTools` around it (the group's first rank runs the calls, its results reach every rank, and its
        `sync` is the rollout's `tool_sync`). None stays None."""
        if env is None or self.tp_world == 1:
            return env
        from .tools import GroupTools
        return GroupTools(env, self.tp_group, self.tp_rank == 0, self.tp_world)

    def prompt_positions(self, n: int, mini_batch: int) -> list[int]:
        """This data-parallel rank's positions among a step's `n` prompts (layout.prompt_positions)."""
        return prompt_positions(n, self.dp_world, self.dp_rank, mini_batch)

    # ---------------------------------------------------------------------------------------------- collectives

    def all_gather_object(self, obj: T) -> list[T]:
        """List of `obj` from every data-parallel rank, in DP-rank order (one element in a single process)."""
        return [obj] if self.dp_world == 1 else collectives.gather_objects(obj, self.dp_group)

    def all_reduce_sum(self, values: Any) -> np.ndarray:
        """Element-wise sum over the data-parallel ranks of a float/int array-like; returns numpy float64."""
        if self.dp_world == 1:
            return np.asarray(values, dtype=np.float64)
        return collectives.all_reduce_sum(values, self.dp_group)

    def all_true(self, flag: bool) -> bool:
        """True on every rank iff `flag` is true on every rank of the world (so all ranks take the same branch)."""
        return bool(flag) if self.world_size == 1 else collectives.all_true(flag)

    def broadcast_object(self, obj: T, src: int = 0) -> T:
        """`obj` of global rank `src`, on every rank."""
        return obj if self.world_size == 1 else collectives.broadcast_object(obj, src)

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()

    def share_within_model_parallel_group(self, compute: Callable[[], T]) -> T:
        """`compute()` on the first rank of this tensor-parallel (or pipeline) group, its result on every rank of
        the group (the group's ranks hold the same data: one reward request per group, not one per rank)."""
        if self.tp_world > 1:
            group, first = self.tp_group, self.tp_rank == 0
        elif self.pp_world > 1:
            group, first = self.pp_group, self.pp_stage == 0
        else:
            return compute()
        return collectives.broadcast_object(compute() if first else None, group.ranks[0], group)

    def from_first_stage(self, obj: T) -> T:
        """`obj` of the first pipeline stage on every stage of this pipeline (identity without pipeline
        parallelism). The stages sample with the same keys from identical weights; this makes their batches equal
        even where a GPU's generation is not bitwise reproducible."""
        if self.pp_world == 1:
            return obj
        return collectives.broadcast_object(obj, self.pp_group.ranks[0], self.pp_group)

    # ----------------------------------------------------------------------------- optimizer and gradients

    def wrap_optimizer(self, optimizer: Any, main: bool = True) -> Any:
        """`optimizer` itself, or under sharding fleet's `DygraphShardingOptimizer` around it: this rank then keeps
        the AdamW states of its partition of the parameters only, and `step()` updates that partition and
        broadcasts it. The trainer drives the phases (`sum_gradients`, `global_grad_norm`, clipping, `step`) itself
        instead of through fleet's `HybridParallelOptimizer.step`, so the gradient norm is logged and non-finite
        steps are skipped. `main`: the policy's, which this context's gradient collectives follow; a second
        model's (the critic's, `main=False`) gets its own context from `for_optimizer`."""
        if self.sharding_world == 1:
            return optimizer
        wrapped = gradients.sharding_optimizer(optimizer, self.hcg)
        if main:
            self.sharding_optimizer = wrapped
        return wrapped

    def for_optimizer(self, optimizer: Any) -> ParallelContext:
        """This context (same ranks and groups) with the gradient collectives (`sum_gradients`, `global_grad_norm`)
        of `optimizer`, what `wrap_optimizer(..., main=False)` returned: under sharding its own partition."""
        other = copy.copy(self)
        other.sharding_optimizer = optimizer if self.sharding_world > 1 else None
        return other

    @staticmethod
    def inner_optimizer(optimizer: Any) -> Any:
        """The AdamW inside a sharding wrapper (whose state is this rank's partition), or `optimizer` itself."""
        return getattr(optimizer, "_inner_opt", optimizer)

    def sum_gradients(self, parameters: list[Any]) -> None:
        """Sum the gradients over the data-parallel ranks (gradients.sum_gradients); nothing in one DP rank."""
        if self.dp_world > 1:
            gradients.sum_gradients(parameters, self.dp_group, self.hcg, self.sharding_optimizer)

    def global_grad_norm(self, parameters: list[Any]) -> float:
        """L2 norm of the whole model's gradient over every axis that splits it (gradients.global_grad_norm)."""
        return gradients.global_grad_norm(parameters, self.hcg, self.sharding_optimizer)

    def optimizer_shard(self) -> tuple[dict[str, int], bool]:
        """Which part of the optimizer state this rank holds, as {axis: rank} for each axis that splits it ("pp",
        "tp", "sharding"; empty: the whole state), and whether this rank is the one replica that saves it (fleet's
        data axis replicates every part)."""
        shard = {}
        if self.pp_world > 1:
            shard["pp"] = self.pp_stage
        if self.tp_world > 1:
            shard["tp"] = self.tp_rank
        if self.sharding_world > 1:
            shard["sharding"] = self.sharding_rank
        saves = (self.hcg.get_data_parallel_rank() == 0) if self.hcg else self.rank == 0
        return shard, saves

    def pipeline(self, full_model: Any, virtual_pp_degree: int = 1) -> Pipeline:
        """This rank's stage of `full_model` as PaddleNLP's pipeline model (pipeline.Pipeline)."""
        return Pipeline(self, full_model, virtual_pp_degree)
