"""algorithms/pass_at_k.py: the unbiased pass@k against hand-computed values and against a count over every k-subset,
the k it is reported for, and the majority vote."""
import itertools
import math
from fractions import Fraction

import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import majority_answer, majority_correct, pass_at_k, pass_at_k_sizes

# float64: each factor (n - c - j) / (n - j) is one rounding (the integers are exact), each product one more, so k
# factors are within 2k roundings of the exact product: relative 2k * 2^-53, below 2.3e-14 for k <= 100.
U64 = 2.0 ** -53


def tol(k):
    return 2 * k * U64


# (n, c, k, exact value, its arithmetic)
HAND = [
    (5, 2, 1, Fraction(2, 5), "c / n"),
    (5, 2, 2, Fraction(7, 10), "1 - C(3,2)/C(5,2) = 1 - 3/10"),
    (5, 2, 3, Fraction(9, 10), "1 - C(3,3)/C(5,3) = 1 - 1/10"),
    (5, 2, 4, Fraction(1), "C(3,4) = 0: every 4-subset of 5 holds one of the 2 correct"),
    (8, 1, 2, Fraction(1, 4), "1 - C(7,2)/C(8,2) = 1 - 21/28"),
    (8, 1, 4, Fraction(1, 2), "1 - C(7,4)/C(8,4) = 1 - 35/70"),
    (8, 3, 4, Fraction(13, 14), "1 - C(5,4)/C(8,4) = 1 - 5/70"),
    (8, 0, 8, Fraction(0), "no correct sample"),
    (8, 8, 1, Fraction(1), "all correct"),
    # C(197,100)/C(200,100) = (100 * 99 * 98) / (200 * 199 * 198) = 970200 / 7880400; the binomials themselves
    # (~9e58) would overflow float32 and lose every digit of the difference in a naive float64 quotient of sums
    (200, 3, 100, 1 - Fraction(970200, 7880400), "1 - C(197,100)/C(200,100)"),
]


@pytest.mark.parametrize("n,c,k,exact,why", HAND, ids=[h[4] for h in HAND])
def test_hand_computed_values(n, c, k, exact, why):
    got = pass_at_k(np.array([c]), n, k)
    assert got.dtype == np.float64 and got.shape == (1,)
    assert abs(got[0] - float(exact)) <= tol(k) + U64, (got[0], float(exact))  # + U64: float(exact)
    t = pass_at_k(paddle.to_tensor([c], dtype="int64"), n, k)
    assert isinstance(t, paddle.Tensor) and t.dtype == paddle.float64
    assert abs(float(t.numpy()[0]) - float(exact)) <= tol(k) + U64


def test_equals_the_share_of_k_subsets_that_hold_a_correct_sample():
    """Brute force: every k-subset of the n samples, for every arrangement size c, n up to 8."""
    rng = np.random.default_rng(0)
    for n in range(1, 9):
        for c in range(n + 1):
            flags = np.zeros(n, dtype=bool)
            flags[rng.choice(n, size=c, replace=False)] = True  # which samples are correct does not matter
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(range(n), k))
                share = sum(flags[list(s)].any() for s in subsets) / len(subsets)
                assert abs(pass_at_k([c], n, k)[0] - share) <= tol(k) + 2 * U64, (n, c, k)


def test_batch_of_problems_and_both_array_types_agree():
    c = np.array([0, 1, 2, 3, 7, 8])
    for k in (1, 2, 4, 8):
        a = pass_at_k(c, 8, k)
        b = pass_at_k(paddle.to_tensor(c), 8, k).numpy()
        np.testing.assert_allclose(a, b, rtol=0, atol=tol(k))
        exact = [1 - math.comb(8 - ci, k) / math.comb(8, k) for ci in c]
        np.testing.assert_allclose(a, exact, rtol=0, atol=tol(k) + 4 * U64)
    np.testing.assert_array_equal(pass_at_k(c, 8, 1), c / 8)  # pass@1 = c / n: one factor, one rounding each


def test_rejects_k_outside_1_to_n_and_counts_outside_0_to_n():
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k([1], 4, 5)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k([1], 4, 0)
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        pass_at_k([5], 4, 2)
    with pytest.raises(ValueError, match=r"\[0, 4\]"):
        pass_at_k(paddle.to_tensor([-1]), 4, 2)


def test_reported_k_are_powers_of_two_below_n_and_n():
    assert pass_at_k_sizes(1) == [1]
    assert pass_at_k_sizes(2) == [1, 2]
    assert pass_at_k_sizes(6) == [1, 2, 4, 6]
    assert pass_at_k_sizes(8) == [1, 2, 4, 8]
    assert pass_at_k_sizes(9) == [1, 2, 4, 8, 9]
    with pytest.raises(ValueError):
        pass_at_k_sizes(0)


def test_majority_vote():
    assert majority_answer(["3", "4", "4", None, "3", "4"]) == "4"
    assert majority_answer(["3", "4", "4", "3"]) == "3"  # tie: the answer given first
    assert majority_answer([None, None]) is None
    # the voted answer is right when a sample that gave it was judged correct
    assert majority_correct(["7", "7", "8"], [True, False, False])
    assert not majority_correct(["7", "8", "8"], [True, False, False])
    assert not majority_correct([None, None], [False, False])
    # samples without an answer do not vote, even when they are many
    assert majority_correct([None, None, None, "5"], [False, False, False, True])
    with pytest.raises(ValueError):
        majority_correct(["1"], [True, False])
