"""ParallelArguments: tensor, pipeline and sharding degrees (PaddleNLP's fleet keys)."""
from __future__ import annotations

from dataclasses import dataclass

from .fields import _amp_effect, arg, nowhere


@dataclass
class ParallelArguments:
    tensor_parallel_degree: int = arg(1, "Tensor (model) parallel degree.")
    sequence_parallel: bool = arg(False, "Sequence parallelism inside tensor-parallel groups.",
                                  **_amp_effect("sequence_parallel"))
    sharding_parallel_degree: int = arg(-1, "Sharding degree (-1: all data-parallel ranks).")
    sharding: str = arg("", "Sharding stage: stage1 shards the optimizer states over the sharding ranks; stage2 "
                            "runs as stage1 here (empty: none).", choices=("", "stage1", "stage2"))
    sharding_parallel_config: str = arg("", "Extra sharding options, space- or comma-separated (PaddleNLP's names; "
                                            "docs/distributed.md says what each does here).")
    pipeline_parallel_degree: int = arg(1, "Pipeline parallel degree.")
    virtual_pp_degree: int = arg(1, "Virtual pipeline stages per pipeline rank.")
    rollout_tensor_parallel_degree: int = arg(-1, "Tensor-parallel degree used for generation (-1: same as "
                                                  "training).",
                                              **nowhere("generation runs on the training model with its "
                                                        "tensor_parallel_degree; there is no separate rollout "
                                                        "engine to reshard"))
