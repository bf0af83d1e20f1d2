"""The learning-rate schedule: linear warm-up, then constant, linear or cosine decay (PaddleNLP's
`lr_scheduler_type`, `warmup_steps` / `warmup_ratio`), as a multiplier of the peak rate per optimizer step."""
import math
from typing import Callable


def lr_lambda(kind: str, warmup: int, total: int) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at optimizer step s (0-based) of `total`: `(s + 1) / warmup` during the
    `warmup` steps, then 1 (`constant`, `constant_with_warmup`), `1 - p` (`linear`) or `(1 + cos(pi p)) / 2`
    (`cosine`), with `p = (s - warmup) / (total - warmup)` capped at 1."""
    def f(s: int) -> float:
        if warmup > 0 and s < warmup:
            return (s + 1) / warmup
        if kind in ("constant", "constant_with_warmup"):
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        if kind == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine
    return f
