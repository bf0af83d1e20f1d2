"""Run under `paddle.distributed.launch`: the trainer's start-up alone (`ParallelContext.from_config`: fleet's
groups, the data-parallel groups, the CPU stand-ins, a 3+ stage pipeline's pair groups), then one all-reduce of
`rank + 1` over every group this rank belongs to; writes OUT_DIR/rank<r>.json ({group: [sum, ranks]}) for the
repeated-launch test in tests/parallel/test_distributed.py.

    startup_worker.py OUT_DIR CONFIG [--key value ...]
"""
import json
import os
import sys

import paddle

from paddle_grpo.config import parse_args
from paddle_grpo.parallel import ParallelContext

out_dir = sys.argv[1]
par = ParallelContext.from_config(parse_args(sys.argv[2:]))
groups = {"world": None, "data": par.dp_group, "model": par.tp_group, "pipe": par.pp_group,
          "sharding": par.hcg.get_sharding_parallel_group()}
# Pair groups in one global order (sorted pairs), so no two ranks wait for each other in opposite orders.
groups.update({f"pair{a}-{b}": group for (a, b), group in sorted(par.pair_groups.items()) if par.rank in (a, b)})
result = {}
for name, group in groups.items():
    value = paddle.to_tensor([float(par.rank + 1)])
    paddle.distributed.all_reduce(value, group=group)
    result[name] = [float(value), list(group.ranks) if group is not None else list(range(par.world_size))]
with open(os.path.join(out_dir, f"rank{par.rank}.json"), "w", encoding="utf-8") as f:
    json.dump(result, f)
