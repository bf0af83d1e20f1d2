"""Float tolerances the tests derive instead of fitting them to one CPU (docs/platform.md, "Tolerances").

Two float32 evaluations of the same maths differ when the kernels sum in another order: another CPU (AVX2 / AVX-512 /
AMX kernels), another thread count, 2 ranks instead of 1, the chunked LM head instead of the full logits. Each rounding
of a float32 result is off by at most u = 2^-24 relative, and a sum of n terms in any order is within
(n - 1) * u * sum|terms| of the exact sum (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., 4.2).
Two evaluations are within twice that of each other, and a result computed through `depth` such sums in a row
(layers, log-softmax after a matmul, ...) within `depth` times that, to first order.

Exact equality is asserted only between two evaluations by the same kernels in one process (or a rerun of the very
same launch on the same machine and environment, such as a resumed run).
"""
from __future__ import annotations

from typing import Dict, Mapping

import numpy as np

EPS32 = 2.0 ** -24  # float32 unit roundoff: the largest relative error of one rounding


def f32_sum_tol(n_terms: int, magnitude: float, depth: int = 1) -> float:
    """Largest difference between two float32 evaluations of a value computed by `depth` chained sums of at most
    `n_terms` terms each, whose absolute values add up to at most `magnitude` (per sum): 2 * depth * n * u * magnitude.
    A bound, not an estimate: rounding errors of random sign typically add up to about sqrt(n) * u * magnitude."""
    return 2.0 * depth * max(int(n_terms), 1) * EPS32 * float(magnitude)


def tiny_lm_tol(width: int, layers: int, vocab: int) -> float:
    """Bound on |a - b| for two float32 evaluations (other kernels, another code path) of a log-prob or entropy of a
    tiny randomly initialised causal LM: f32_sum_tol(width, 1, depth=9 * layers + 2) for the transformer (per layer
    about 9 chained sums: RMSNorm, q/k/v, attention scores, softmax, values, o, RMSNorm, gate/up, down; then the final
    norm and the head), `width` the longest of these sums (hidden or intermediate size, or the sequence), their terms
    adding up to ~1 in absolute value at random initialisation (weights ~0.02, normalised activations ~1); plus
    2 * vocab * u for the log-softmax's sum of positive terms (relative error <= vocab * u, absolute in its log).
    Double it for gradients (the backward pass is as deep again)."""
    return f32_sum_tol(width, 1.0, depth=9 * layers + 2) + 2 * vocab * EPS32


def adam_drift(after_a: Mapping[str, np.ndarray], after_b: Mapping[str, np.ndarray],
               before: Mapping[str, np.ndarray]) -> Dict[str, float]:
    """How two trainings of the same parameters by Adam(W) differ, for `assert_adam_close`.

    moved: the largest |after_a - before|; q999: the 99.9th percentile of |after_a - after_b| over all elements;
    max: the largest |after_a - after_b|; n: the number of elements."""
    diff = np.concatenate([np.abs(np.asarray(after_a[k], np.float64) - np.asarray(after_b[k], np.float64)).ravel()
                           for k in after_a])
    moved = max(float(np.abs(np.asarray(after_a[k], np.float64) - np.asarray(before[k], np.float64)).max())
                for k in after_a)
    return {"moved": moved, "q999": float(np.quantile(diff, 0.999)), "max": float(diff.max()), "n": diff.size}


def assert_adam_close(after_a: Mapping[str, np.ndarray], after_b: Mapping[str, np.ndarray],
                      before: Mapping[str, np.ndarray], lr: float, steps: int, rel: float) -> Dict[str, float]:
    """Two Adam(W) trainings of `steps` optimizer steps of learning rate `lr` from `before` that must be the same
    maths, evaluated by different float32 kernels (another CPU, 2 ranks instead of 1, the chunked LM head).

    Adam moves an element by lr * m / (sqrt(v) + eps), about lr per step whatever the gradient's size. Where the
    gradient is well above its rounding error, a relative gradient error e changes the step by about e * lr; so 99.9 %
    of the elements must agree within `rel` * lr * steps, with `rel` the gradient's relative float32 error bound
    (f32_sum_tol(n, 1, depth) for its sums, taking sum|terms| ~ |sum|). Where a gradient is within rounding of zero
    (its sum cancels: a handful of elements), g / (|g| + eps) turns the rounding into any step in [-lr, lr], so the
    largest difference is not bounded by rounding and is not asserted (it is in the returned dict, for messages).
    A wrong gradient (a missing row, a wrong rank's share, a wrong chunk) moves far more than 0.1 % of the elements by
    a sizeable fraction of lr; the parameters must also have moved at all (more than lr / 2)."""
    drift = adam_drift(after_a, after_b, before)
    assert drift["moved"] > lr / 2, ("the parameters did not move", drift)
    assert drift["q999"] < rel * lr * steps, ("more than 0.1 % of the elements differ beyond float32 rounding", drift)
    return drift
