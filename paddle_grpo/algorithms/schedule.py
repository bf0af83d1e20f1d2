"""The learning-rate schedule: linear warm-up, then constant, linear or cosine decay (PaddleNLP's
`lr_scheduler_type`, `warmup_steps` / `warmup_ratio`), as a multiplier of the peak rate per optimizer step."""
import math
from typing import Callable


def lr_lambda(kind: str, warmup: int, total: int, min_ratio: float = 0.0) -> Callable[[int], float]:
    """Multiplier of the peak learning rate at optimizer step s (0-based) of `total`: `(s + 1) / warmup` during the
    `warmup` steps, then 1 (`constant`, `constant_with_warmup`), or a decay from 1 to `min_ratio`:
    `min_ratio + (1 - min_ratio) (1 - p)` (`linear`) or `min_ratio + (1 - min_ratio) (1 + cos(pi p)) / 2`
    (`cosine`), with `p = (s - warmup) / (total - warmup)` capped at 1. `min_ratio` is PaddleNLP's
    `min_learning_rate / learning_rate` (its Linear/CosineAnnealingWithWarmupDecay decay to min_lr, not to 0)."""
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"lr_lambda: min_ratio (min learning rate / learning rate) must be in [0, 1], got "
                         f"{min_ratio!r}")

    def f(s: int) -> float:
        if warmup > 0 and s < warmup:
            return (s + 1) / warmup
        if kind in ("constant", "constant_with_warmup"):
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        if kind == "linear":
            decay = 1.0 - progress
        else:  # cosine
            decay = 0.5 * (1.0 + math.cos(math.pi * progress))
        return min_ratio + (1.0 - min_ratio) * decay
    return f
