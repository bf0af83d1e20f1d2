"""Run under `paddle.distributed.launch --nproc_per_node 2`: `python tp_llama_worker.py OUT_DIR MODEL_DIR...`.

For each tiny Llama in MODEL_DIR... loaded as a tensor-parallel-2 shard: the decoder path's start-up line, the log-probs
and entropies of OUT_DIR/inputs.npz (vocab-parallel head), the gradient of their weighted sum w.r.t. the embedding
(gathered from the vocab-parallel shards), and greedy generations (PaddleNLP's decoder and the gathered head); each
rank writes OUT_DIR/<i>_rank<r>.npz for tests/parallel/test_llama_tensor_parallel.py to compare with one process."""
import os
import sys

import numpy as np
import paddle

from paddle_grpo.config import config_from_dict
from paddle_grpo.parallel import ParallelContext
from paddle_grpo.policy.causal import completion_logprobs, decoder_path, generate, load_causal_lm

out_dir, model_dirs = sys.argv[1], sys.argv[2:]
par = ParallelContext.from_config(config_from_dict({"tensor_parallel_degree": 2}))
data = np.load(os.path.join(out_dir, "inputs.npz"))
args = [paddle.to_tensor(data[k]) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
for i, model_dir in enumerate(model_dirs):
    model = load_causal_lm(model_dir, **par.model_load_kwargs())
    lp, ent = completion_logprobs(model, *args, temperature=0.8, with_entropy=True, vocab_parallel=par.vocab_parallel)
    mask = args[3].astype("float32")
    ((lp * paddle.to_tensor(data["coeff"]) * mask).sum() + 0.1 * (ent * mask).sum()).backward()
    parts = []
    paddle.distributed.all_gather(parts, model.get_input_embeddings().weight.grad)
    model.eval()
    with paddle.no_grad():
        rollout = generate(model, args[0][::2], args[1][::2], num_samples=2, max_new_tokens=6, eos_token_ids=[1],
                           do_sample=False)
    np.savez(os.path.join(out_dir, f"{i}_rank{par.rank}.npz"), path=np.array(decoder_path(model)),
             logprobs=lp.numpy(), entropy=ent.numpy(), embed_grad=paddle.concat(parts, axis=0).numpy(),
             completion_ids=rollout.completion_ids.numpy(), lengths=np.asarray(rollout.lengths),
             sample_logprobs=rollout.sample_logprobs.numpy())
