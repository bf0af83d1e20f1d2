"""Run under `paddle.distributed.launch --nproc_per_node 2`: TP=2 log-probs, entropy and their gradient w.r.t. the
hidden states' source (the embedding), written by rank 0 to OUT.npz for tests/parallel/test_distributed.py to compare with a
single-process computation on the same weights."""
import sys

import numpy as np
import paddle

from paddle_grpo.config import config_from_dict
from paddle_grpo.parallel import ParallelContext
from paddle_grpo.policy.causal import completion_logprobs, load_causal_lm

model_dir, out = sys.argv[1], sys.argv[2]
par = ParallelContext.from_config(config_from_dict({"tensor_parallel_degree": 2}))
model = load_causal_lm(model_dir, **par.model_load_kwargs())
data = np.load(out.replace(".npz", "_inputs.npz"))
args = [paddle.to_tensor(data[k]) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
lp, ent = completion_logprobs(model, *args, temperature=0.8, with_entropy=True,
                              vocab_parallel=par.vocab_parallel)
mask = args[3].astype("float32")
((lp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
# The embedding table is vocab-parallel: gather the shards' gradients to compare with the full table's.
grad = model.get_input_embeddings().weight.grad
parts = []
paddle.distributed.all_gather(parts, grad)
if par.rank == 0:
    np.savez(out, logprobs=lp.numpy(), entropy=ent.numpy(), embed_grad=paddle.concat(parts, axis=0).numpy())
