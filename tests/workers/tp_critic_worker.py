"""Run under `paddle.distributed.launch --nproc_per_node 2`: `python tp_critic_worker.py MODEL_DIR OUT.npz SAVED`.

A tensor-parallel-2 critic (load_critic of MODEL_DIR) is saved merged from both ranks into SAVED and loaded back in
place (load_weights); then its values of the inputs in OUT_inputs.npz and the gradient of sum(coeff * values) w.r.t.
the value head and the final norm are written by rank 0 to OUT.npz, for tests/policy/test_critic.py to compare with
one process. The head's gradient of both ranks is gathered: it must be the same on each (the head is replicated)."""
import sys

import numpy as np
import paddle

from paddle_grpo.config import config_from_dict
from paddle_grpo.parallel import ParallelContext
from paddle_grpo.policy import load_critic

model_dir, out, saved = sys.argv[1], sys.argv[2], sys.argv[3]
par = ParallelContext.from_config(config_from_dict({"tensor_parallel_degree": 2}))
critic = load_critic(model_dir, **par.model_load_kwargs())
# The checkpoint path: the shards merged into one directory (both ranks take part), then loaded back in place.
critic.save(saved, merge_tensor_parallel=True, is_main_process=par.rank == 0)
paddle.distributed.barrier()
critic.load_weights(saved, **par.model_load_kwargs())
data = np.load(out.replace(".npz", "_inputs.npz"))
args = [paddle.to_tensor(data[k]) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
values = critic.values(*args)
(values * paddle.to_tensor(data["coeff"]) * args[3].astype("float32")).sum().backward()
heads = []
paddle.distributed.all_gather(heads, critic.head.weight.grad)
if par.rank == 0:
    np.savez(out, values=values.numpy(), head_grads=np.stack([h.numpy() for h in heads]),
             norm_grad=critic.backbone.norm.weight.grad.numpy(), tp=par.tp_world,
             head_param_shape=np.array(critic.head.weight.shape))
