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


@pytest.mark.parametrize("kind", ["constant", "linear", "cosine"])
def test_lr_schedule_decays_to_min_ratio(kind):
    # PaddleNLP's min_learning_rate: the decay ends at min_ratio * peak instead of 0
    f = lr_lambda(kind, warmup=2, total=12, min_ratio=0.1)
    assert [f(s) for s in range(2)] == [0.5, 1.0]  # warm-up unchanged
    progress = [(s - 2) / 10 for s in range(2, 13)]
    decay = {"constant": [1.0] * 11, "linear": [1 - p for p in progress],
             "cosine": [0.5 * (1 + math.cos(math.pi * p)) for p in progress]}[kind]
    expected = [1.0] * 11 if kind == "constant" else [0.1 + 0.9 * d for d in decay]
    np.testing.assert_allclose([f(s) for s in range(2, 13)], expected, atol=1e-12)  # float64, values <= 1
    if kind != "constant":
        assert f(12) == pytest.approx(0.1, abs=1e-15) and f(1000) == pytest.approx(0.1, abs=1e-15)


def test_lr_schedule_min_ratio_zero_is_the_default_and_bad_ratios_are_refused():
    for kind in ("linear", "cosine"):
        assert [lr_lambda(kind, 3, 10)(s) for s in range(12)] == \
            [lr_lambda(kind, 3, 10, min_ratio=0.0)(s) for s in range(12)]
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="min_ratio"):
            lr_lambda("linear", 0, 10, min_ratio=bad)
