"""Run under `paddle.distributed.launch --nproc_per_node 2`: `VocabParallel.chunked_logprobs_and_entropy` on this
rank's half of an LM head, for every case of the CASES.json the test wrote, in one launch. Each rank writes
OUT_DIR/rank{r}.npz: per case the log-probs, entropy, the gradient of the hidden states and of its weight shard, for
tests/parallel/test_distributed.py to compare with an unsharded, unchunked float64 reference.

    tp_chunked_head_worker.py OUT_DIR
"""
import json
import os
import sys

import numpy as np
import paddle

from paddle_grpo.config import config_from_dict
from paddle_grpo.parallel import ParallelContext

out_dir = sys.argv[1]
par = ParallelContext.from_config(config_from_dict({"tensor_parallel_degree": 2}))
vp = par.vocab_parallel
data = np.load(os.path.join(out_dir, "inputs.npz"))
cases = json.load(open(os.path.join(out_dir, "cases.json")))
saved = {}
for name, case in cases.items():
    transpose_y = case["transpose_y"]
    full = data["weight"].T if transpose_y else data["weight"]          # [H, V] or [V, H]
    shard = np.split(full, par.tp_world, axis=0 if transpose_y else 1)[par.tp_rank]
    hidden = paddle.to_tensor(data["hidden"], stop_gradient=False)
    weight = paddle.to_tensor(np.ascontiguousarray(shard), stop_gradient=False)
    lp, ent = vp.chunked_logprobs_and_entropy(hidden, weight, paddle.to_tensor(data["labels"]),
                                              temperature=case["temperature"], chunk_size=case["chunk_size"],
                                              with_entropy=case["with_entropy"], transpose_y=transpose_y)
    loss = (lp * paddle.to_tensor(data["a"])).sum()
    if ent is not None:
        loss = loss + (ent * paddle.to_tensor(data["b"])).sum()
    loss.backward()
    saved.update({f"{name}/logprobs": lp.numpy(), f"{name}/hidden_grad": hidden.grad.numpy(),
                  f"{name}/weight_grad": weight.grad.numpy()})
    if ent is not None:
        saved[f"{name}/entropy"] = ent.numpy()
np.savez(os.path.join(out_dir, f"rank{par.tp_rank}.npz"), **saved)
