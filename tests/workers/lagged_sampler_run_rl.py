"""run_rl.py's training with a sampler whose log-probs disagree with the trainer's, for
tests/parallel/test_rollout_correction_pipeline.py:

    lagged_sampler_run_rl.py CONFIG [--key value ...]

Every collected batch's sampler log-probs are lowered by SHIFT at even completion positions (as a sampler with
other weights or other numerics would report them): the ratio exp(l^old - l^s) there is about e^SHIFT, away from
the ~1 of a synchronous CPU run, so the rollout correction weights those tokens. The same change on every rank and
stage (each process collects, the pipeline keeps the first stage's batch)."""
import sys

import numpy as np
import paddle

from paddle_grpo import step
from paddle_grpo.config import parse_args
from paddle_grpo.trainer import Trainer

SHIFT = 1.0
collect = step.collect


def lagged_collect(*args, **kwargs):
    batch, metrics = collect(*args, **kwargs)
    T = batch.sample_logprobs.shape[1]
    even = paddle.to_tensor((np.arange(T) % 2 == 0).astype("float32"))[None]
    batch.sample_logprobs = batch.sample_logprobs - SHIFT * even * batch.completion_mask.astype("float32")
    return batch, metrics


step.collect = lagged_collect  # what Trainer.train_step calls
Trainer(parse_args(sys.argv[1:])).train()
