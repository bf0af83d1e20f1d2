"""Evaluation with n sampled completions per problem: pass@k, the k it is reported for, and the majority vote.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", arXiv 2107.03374, eq. 1): of n samples
of a problem c are correct; the unbiased estimate of the probability that k samples (k <= n) hold a correct one is

    pass@k = 1 - C(n - c, k) / C(n, k) = 1 - prod_{j=0}^{k-1} (n - c - j) / (n - j)

the product form being the quotient of the binomials written out. Every factor lies in [0, 1], so nothing
overflows (C(200, 100) ~ 9e58 does not fit a float32) and the float64 product is within k roundings of the exact
value; a factor is 0 once n - c < k (fewer wrong samples than k: every k-subset holds a correct one).
mean@n is the mean of c / n (pass@1). maj@n: the answer most samples give counts, right or wrong.
"""
from typing import List, Optional, Sequence, Union

import numpy as np
import paddle

from ._common import TensorLike


def pass_at_k(correct: TensorLike, n: int, k: int) -> Union[paddle.Tensor, np.ndarray]:
    """The unbiased pass@k of each problem from its count of correct samples: `[P]` counts c (0 <= c <= n) ->
    `[P]` float64 (a paddle tensor for a paddle tensor, else numpy)."""
    n, k = int(n), int(k)
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n, got k={k}, n={n}")
    if isinstance(correct, paddle.Tensor):
        c = correct.astype("float64").reshape([-1, 1])
        j = paddle.arange(k, dtype="float64").reshape([1, -1])
        bad = paddle.logical_or(c < 0, c > n).any()
        if bool(bad):
            raise ValueError(f"correct counts must lie in [0, {n}]")
        return 1.0 - paddle.prod(paddle.clip(n - c - j, min=0.0) / (n - j), axis=1)
    c = np.asarray(correct, dtype=np.float64).reshape(-1, 1)
    if ((c < 0) | (c > n)).any():
        raise ValueError(f"correct counts must lie in [0, {n}]")
    j = np.arange(k, dtype=np.float64).reshape(1, -1)
    return 1.0 - np.prod(np.clip(n - c - j, 0.0, None) / (n - j), axis=1)


def pass_at_k_sizes(n: int) -> List[int]:
    """The k that pass@k is reported for with n samples: the powers of two below n, and n itself
    (n = 8: 1, 2, 4, 8; n = 6: 1, 2, 4, 6; n = 1: 1)."""
    if int(n) < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    sizes = [1 << i for i in range(int(n).bit_length()) if 1 << i < n]
    return sizes + [int(n)]


def majority_answer(answers: Sequence[Optional[str]]) -> Optional[str]:
    """The answer most samples give (None: no sample gave one); a tie goes to the answer given first, so the vote
    does not depend on anything but the samples' order."""
    counts = {}
    for a in answers:
        if a is not None:
            counts[a] = counts.get(a, 0) + 1
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in counts if counts[a] == best)  # dicts keep first-seen order


def majority_correct(answers: Sequence[Optional[str]], correct: Sequence[bool]) -> bool:
    """maj@n of one problem: the majority answer (`majority_answer`) is right when a sample that gave it was judged
    correct (a sample may give the right answer and still miss the maximal reward, for example by its format; the
    answer is what is voted on). No answer at all counts as wrong."""
    if len(answers) != len(correct):
        raise ValueError(f"{len(answers)} answers but {len(correct)} correctness flags")
    voted = majority_answer(answers)
    return voted is not None and any(ok for a, ok in zip(answers, correct) if a == voted)
