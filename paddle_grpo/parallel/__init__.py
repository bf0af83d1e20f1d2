"""Everything that touches paddle.distributed / fleet; no other module of paddle_grpo imports them.

- context.py      `ParallelContext`: built once from the config (`from_config`), ranks, groups, collectives
- layout.py       layout decisions that read the config (degrees, fleet strategy, pipeline checks, prompt split)
- startup.py      before any group exists: local rank, building a missing policy once (a lock across nodes)
- storage.py      where checkpoints go across nodes (shared output_dir or save_on_each_node), one resume step
- collectives.py  object and array collectives over one group
- gradients.py    data-parallel gradient sum, global gradient norm, sharding stage1's optimizer
- differentiable.py, vocab.py   collectives with gradients, vocab-parallel log-probs and entropy
- pipeline.py     pipeline parallel: layer split, pair groups, `Pipeline`
- tools.py        multi-turn rollouts under tensor parallelism: one rank of a group runs the tool calls, all feed them
- cpu_shims.py    CPU stand-ins for paddle internals, each pinned to the paddle version it targets
"""
from __future__ import annotations

from .context import ParallelContext
from .layout import (check_pipeline_config, data_parallel_groups, fleet_strategy, hybrid_degrees, prompt_positions,
                     unsupported_layout)
from .pipeline import Pipeline, expected_owner, merge_owners, pipeline_pairs, stage_chunks
from .startup import build_once, local_rank
from .storage import Storage, agree_on_resume, choose_resume_step, plan_storage
from .vocab import VocabParallel


def tensor_parallel_linear_types() -> tuple[type, type]:
    """fleet's (ColumnParallelLinear, RowParallelLinear): the layers a tensor-parallel policy is made of."""
    from paddle.distributed.fleet.meta_parallel import ColumnParallelLinear, RowParallelLinear

    return ColumnParallelLinear, RowParallelLinear


__all__ = ["ParallelContext", "Pipeline", "Storage", "VocabParallel", "agree_on_resume", "build_once",
           "check_pipeline_config", "choose_resume_step", "data_parallel_groups", "expected_owner",
           "fleet_strategy", "hybrid_degrees", "local_rank", "merge_owners", "pipeline_pairs", "plan_storage",
           "prompt_positions", "stage_chunks", "tensor_parallel_linear_types", "unsupported_layout"]
