"""The learning-rate schedule (algorithms.schedule.lr_lambda), against hand-computed values."""
import math

import numpy as np
import pytest

from paddle_grpo.algorithms import lr_lambda


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_lr_schedule_hand_computed(kind):
    f = lr_lambda(kind, warmup=4, total=20)
    assert [f(s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    values = [f(s) for s in range(4, 21)]
    progress = [(s - 4) / 16 for s in range(4, 21)]
    expected = {"constant": [1.0] * 17, "linear": [1 - p for p in progress],
                "cosine": [0.5 * (1 + math.cos(math.pi * p)) for p in progress]}[kind]
    np.testing.assert_allclose(values, expected, atol=1e-12)  # Python floats: a few float64 roundings of values <= 1
