"""run_rl.py's training with the policy's `head_chunk_size` set by hand, for tests/parallel/test_pipeline.py:

    chunked_head_run_rl.py CHUNK CONFIG [--key value ...]      (CHUNK 0: the full logits)

Set after the trainer is built, whatever the config says, so the test does not depend on how the config turns the
chunked head on. Each rank writes OUTPUT_DIR/head_calls.rank{r}.json: how many times the update's pipeline loss
called the chunked head (step.chunked_logprobs_and_entropy), so the test knows the chunked path ran."""
import json
import os
import sys

from paddle_grpo import step
from paddle_grpo.config import parse_args
from paddle_grpo.trainer import Trainer

chunk = int(sys.argv[1]) or None
calls = []
chunked = step.chunked_logprobs_and_entropy


def counted(*args, **kwargs):
    calls.append(kwargs["chunk_size"])
    return chunked(*args, **kwargs)


step.chunked_logprobs_and_entropy = counted
cfg = parse_args(sys.argv[2:])
trainer = Trainer(cfg)
trainer.learner.policy.head_chunk_size = chunk
trainer.train()
with open(os.path.join(cfg.output_dir, f"head_calls.rank{trainer.par.rank}.json"), "w", encoding="utf-8") as f:
    json.dump(calls, f)
