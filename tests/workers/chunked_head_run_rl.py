"""run_rl.py's training with the policy's `head_chunk_size` set by hand, for tests/parallel/test_pipeline.py:

    chunked_head_run_rl.py CHUNK CONFIG [--key value ...]      (CHUNK 0: the full logits)

Set after the trainer is built, whatever the config says, so the test does not depend on how the config turns the
chunked head on. Each rank writes OUTPUT_DIR/head_calls.rank{r}.json: how many times the update's pipeline loss
called the chunked head (head_logprobs of step/policy_update.py with a chunk size, on a head lm_head.lm_head_of can
chunk: not the full-logits fallback), so the test knows the chunked path ran."""
import json
import os
import sys

from paddle_grpo.step import policy_update
from paddle_grpo.config import parse_args
from paddle_grpo.policy.lm_head import lm_head_of
from paddle_grpo.trainer import Trainer

chunk = int(sys.argv[1]) or None
calls = []
head_logprobs = policy_update.head_logprobs


def counted(hidden, head, labels, **kwargs):
    if kwargs["chunk_size"] is not None and lm_head_of(head)[0] is not None:
        calls.append(kwargs["chunk_size"])
    return head_logprobs(hidden, head, labels, **kwargs)


policy_update.head_logprobs = counted  # what step.pipeline_logprobs calls
cfg = parse_args(sys.argv[2:])
trainer = Trainer(cfg)
trainer.learner.policy.head_chunk_size = chunk
trainer.train()
with open(os.path.join(cfg.output_dir, f"head_calls.rank{trainer.par.rank}.json"), "w", encoding="utf-8") as f:
    json.dump(calls, f)
