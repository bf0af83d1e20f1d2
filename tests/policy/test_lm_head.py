"""The chunked LM head (kernels/chunked_head.py, through policy/lm_head.py) against an unchunked reference (issue 15).

Values against full `[n, T, V]` float64 logits in numpy; gradients against paddle's autograd through a plain,
unchunked float64 implementation. Then that the chunked path never materialises `[n * T, V]`: every paddle call the
module makes is recorded (no output above `chunk_size x V` apart from the weight-shaped gradient), and, in a
subprocess, the peak RSS of a chunked forward + backward stays far below the size of the full logits while the
unchunked path (one chunk) exceeds it.

Tolerances (tests/numerics.py): the float32 logits are sums of H = 8 terms adding up to ~14 in absolute value (_data:
logits ~10), divided by temperatures down to 0.7, so two evaluations differ by f32_sum_tol(8, 20) per logit; a
log-prob is a logit minus a logsumexp (a weighted mean of logits, plus the log of a sum of V = 37 positive terms:
f32_sum_tol(37, 1)): VALUE_TOL. A hidden-state gradient sums V terms dz * w with sum|dz| <= 2 and |w| <= 6, a weight
gradient N_ROWS * T = 10 terms h * dz, on top of the error of dz itself (~VALUE_TOL): GRAD_TOL.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import paddle
import pytest
from numerics import f32_sum_tol

from paddle_grpo.policy.lm_head import chunked_logprobs_and_entropy, num_chunks

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

N_ROWS, T, H, V = 2, 5, 8, 37
POSITIONS = N_ROWS * T
CHUNK_SIZES = [1, 3, 7, POSITIONS, POSITIONS + 6]
VALUE_TOL = 2 * f32_sum_tol(H, 20.0) + f32_sum_tol(V, 1.0)  # 4.3e-5
GRAD_TOL = 2 * VALUE_TOL + f32_sum_tol(V, 12.0)             # 1.4e-4


def _data(seed, transpose_y, scale=3.0):
    """hidden [n, T, H], weight [H, V] (or [V, H]), labels [n, T]; logits of magnitude ~10 so max-shifting matters."""
    rng = np.random.default_rng(seed)
    hidden = rng.normal(size=(N_ROWS, T, H))
    weight = rng.normal(size=(H, V)) * scale / np.sqrt(H) * 2
    labels = rng.integers(0, V, size=(N_ROWS, T))
    return hidden, (weight.T.copy() if transpose_y else weight), labels


def _numpy_reference(hidden, weight, labels, temperature, transpose_y):
    """Full float64 logits -> (log-probs [n, T], entropy [n, T])."""
    w = weight.T if transpose_y else weight
    z = (hidden.astype(np.float64) @ w.astype(np.float64)) / temperature
    m = z.max(-1, keepdims=True)
    logsm = z - m - np.log(np.exp(z - m).sum(-1, keepdims=True))
    logp = np.take_along_axis(logsm, labels[..., None], -1)[..., 0]
    entropy = -(np.exp(logsm) * logsm).sum(-1)
    return logp, entropy


def _paddle_reference(hidden, weight, labels, temperature, transpose_y):
    """The plain unchunked implementation, float64, differentiable: (logp, entropy) tensors."""
    z = paddle.matmul(hidden, weight, transpose_y=transpose_y) / temperature
    logsm = z - paddle.logsumexp(z, axis=-1, keepdim=True)
    logp = paddle.take_along_axis(logsm, labels.unsqueeze(-1), axis=-1).squeeze(-1)
    entropy = -(paddle.exp(logsm) * logsm).sum(-1)
    return logp, entropy


def _tensors(hidden, weight, labels, dtype, *, frozen_weight=False):
    h = paddle.to_tensor(hidden, dtype=dtype, stop_gradient=False)
    w = paddle.to_tensor(weight, dtype=dtype, stop_gradient=frozen_weight)
    return h, w, paddle.to_tensor(labels, dtype="int64")


def _grads(fn, hidden, weight, labels, dtype, coeffs, *, frozen_weight=False):
    """Values and gradients of `sum(a * logp + b * entropy)` through `fn`."""
    h, w, lab = _tensors(hidden, weight, labels, dtype, frozen_weight=frozen_weight)
    logp, entropy = fn(h, w, lab)
    a, b = (None if c is None else paddle.to_tensor(c, dtype=logp.dtype) for c in coeffs)
    loss = (a * logp).sum()
    if b is not None and entropy is not None:
        loss = loss + (b * entropy).sum()
    loss.backward()
    return (logp.numpy(), None if entropy is None else entropy.numpy(), h.grad.numpy(),
            None if w.grad is None else w.grad.numpy())


@pytest.mark.parametrize("transpose_y", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_size", CHUNK_SIZES + [1024])
def test_values_and_gradients_match_the_unchunked_reference(chunk_size, temperature, transpose_y):
    hidden, weight, labels = _data(chunk_size, transpose_y)
    rng = np.random.default_rng(100 + chunk_size)
    # Random per-token coefficients of both terms, so both backward paths (log-prob and entropy) are exercised.
    coeffs = (rng.normal(size=(N_ROWS, T)), rng.normal(size=(N_ROWS, T)))

    ref_logp, ref_entropy = _numpy_reference(hidden, weight, labels, temperature, transpose_y)
    _, _, ref_dh, ref_dw = _grads(lambda h, w, lab: _paddle_reference(h, w, lab, temperature, transpose_y),
                                  hidden, weight, labels, "float64", coeffs)
    logp, entropy, dh, dw = _grads(
        lambda h, w, lab: chunked_logprobs_and_entropy(h, w, lab, temperature=temperature, chunk_size=chunk_size,
                                                       transpose_y=transpose_y),
        hidden, weight, labels, "float32", coeffs)

    assert logp.dtype == np.float32 and entropy.dtype == np.float32 and logp.shape == (N_ROWS, T)
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=VALUE_TOL)
    np.testing.assert_allclose(entropy, ref_entropy, rtol=1e-5, atol=VALUE_TOL)
    np.testing.assert_allclose(dh, ref_dh, rtol=1e-4, atol=GRAD_TOL)
    np.testing.assert_allclose(dw, ref_dw, rtol=1e-4, atol=GRAD_TOL)
    assert dw.shape == weight.shape


def test_the_entropy_gradient_matches_finite_differences():
    """The hand-derived entropy gradient -p (z - sum p z), checked numerically in float64 on the logits' inputs."""
    hidden, weight, labels = _data(7, False, scale=1.0)
    hidden, weight = hidden[:1, :2], weight[:, :6]
    labels = labels[:1, :2] % 6

    def entropy_sum(h):
        return _numpy_reference(h, weight, labels, 0.8, False)[1].sum()

    _, _, dh, _ = _grads(lambda h, w, lab: chunked_logprobs_and_entropy(h, w, lab, temperature=0.8, chunk_size=1),
                         hidden, weight, labels, "float32", (np.zeros((1, 2)), np.ones((1, 2))))
    eps, numeric = 1e-6, np.zeros_like(hidden)
    for idx in np.ndindex(hidden.shape):
        plus, minus = hidden.copy(), hidden.copy()
        plus[idx] += eps
        minus[idx] -= eps
        numeric[idx] = (entropy_sum(plus) - entropy_sum(minus)) / (2 * eps)
    # float32 gradient (scale 1: logits ~3, 6 classes, 2 positions; GRAD_TOL's terms at a fifth of the size) against
    # float64 central differences (error ~eps^2 = 1e-12)
    np.testing.assert_allclose(dh, numeric, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("transpose_y", [False, True])
def test_without_entropy(transpose_y):
    hidden, weight, labels = _data(3, transpose_y)
    coeffs = (np.random.default_rng(0).normal(size=(N_ROWS, T)), None)
    ref_logp, _ = _numpy_reference(hidden, weight, labels, 1.3, transpose_y)
    _, _, ref_dh, ref_dw = _grads(lambda h, w, lab: _paddle_reference(h, w, lab, 1.3, transpose_y),
                                  hidden, weight, labels, "float64", coeffs)
    logp, entropy, dh, dw = _grads(
        lambda h, w, lab: chunked_logprobs_and_entropy(h, w, lab, temperature=1.3, chunk_size=4, with_entropy=False,
                                                       transpose_y=transpose_y),
        hidden, weight, labels, "float32", coeffs)
    assert entropy is None
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=VALUE_TOL)
    np.testing.assert_allclose(dh, ref_dh, rtol=1e-4, atol=GRAD_TOL)
    np.testing.assert_allclose(dw, ref_dw, rtol=1e-4, atol=GRAD_TOL)


def test_a_frozen_weight_gets_no_gradient_and_the_hidden_gradient_is_unchanged():
    hidden, weight, labels = _data(4, False)
    rng = np.random.default_rng(4)
    coeffs = (rng.normal(size=(N_ROWS, T)), rng.normal(size=(N_ROWS, T)))
    _, _, ref_dh, _ = _grads(lambda h, w, lab: _paddle_reference(h, w, lab, 1.0, False),
                             hidden, weight, labels, "float64", coeffs, frozen_weight=True)
    _, _, dh, dw = _grads(lambda h, w, lab: chunked_logprobs_and_entropy(h, w, lab, chunk_size=3),
                          hidden, weight, labels, "float32", coeffs, frozen_weight=True)
    assert dw is None
    np.testing.assert_allclose(dh, ref_dh, rtol=1e-4, atol=GRAD_TOL)


def test_only_logprob_or_only_entropy_in_the_loss():
    """An output left out of the loss gets a zero upstream gradient: each backward path alone is right."""
    hidden, weight, labels = _data(5, False)
    ones, zeros = np.ones((N_ROWS, T)), np.zeros((N_ROWS, T))
    for coeffs in [(ones, zeros), (zeros, ones)]:
        ref = _grads(lambda h, w, lab: _paddle_reference(h, w, lab, 0.9, False), hidden, weight, labels, "float64",
                     coeffs)
        got = _grads(lambda h, w, lab: chunked_logprobs_and_entropy(h, w, lab, temperature=0.9, chunk_size=7),
                     hidden, weight, labels, "float32", coeffs)
        np.testing.assert_allclose(got[2], ref[2], rtol=1e-4, atol=GRAD_TOL)
        np.testing.assert_allclose(got[3], ref[3], rtol=1e-4, atol=GRAD_TOL)


def test_negative_labels_read_as_id_zero():
    hidden, weight, labels = _data(6, False)
    ignored = labels.copy()
    ignored[0, 1] = -100
    zeroed = ignored.copy()
    zeroed[0, 1] = 0
    h, w, _ = _tensors(hidden, weight, labels, "float32")
    a, _ = chunked_logprobs_and_entropy(h, w, paddle.to_tensor(ignored), chunk_size=3)
    b, _ = chunked_logprobs_and_entropy(h, w, paddle.to_tensor(zeroed), chunk_size=3)
    np.testing.assert_array_equal(a.numpy(), b.numpy())  # the same kernels on the same numbers, one process


def test_bfloat16_inputs_get_float32_outputs_and_gradients_in_their_own_dtype():
    hidden, weight, labels = _data(8, False)
    h = paddle.to_tensor(hidden, dtype="float32").astype("bfloat16")
    w = paddle.to_tensor(weight, dtype="float32").astype("bfloat16")
    h.stop_gradient = w.stop_gradient = False
    logp, entropy = chunked_logprobs_and_entropy(h, w, paddle.to_tensor(labels), chunk_size=4)
    assert logp.dtype == paddle.float32 and entropy.dtype == paddle.float32
    ref_logp, _ = _numpy_reference(h.astype("float32").numpy(), w.astype("float32").numpy(), labels, 1.0, False)
    np.testing.assert_allclose(logp.numpy(), ref_logp, rtol=1e-5, atol=VALUE_TOL)
    (logp.sum() + entropy.sum()).backward()
    assert h.grad.dtype == paddle.bfloat16 and w.grad.dtype == paddle.bfloat16


def test_bad_arguments_are_refused():
    hidden, weight, labels = _data(9, False)
    h, w, lab = _tensors(hidden, weight, labels, "float32")
    with pytest.raises(ValueError, match="transpose_y=True"):
        chunked_logprobs_and_entropy(h, w, lab, transpose_y=True)
    with pytest.raises(ValueError, match="temperature"):
        chunked_logprobs_and_entropy(h, w, lab, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_logprobs_and_entropy(h, w, lab, chunk_size=0)


class _RecordingPaddle:
    """Stands in for the `paddle` module inside the chunked head's modules: every call goes through, its tensor
    outputs' shapes and the calls of `matmul` that are not row sums are recorded."""

    def __init__(self, real):
        self._real, self.shapes, self.matmuls = real, [], 0

    def __getattr__(self, name):
        attr = getattr(self._real, name)
        if not callable(attr) or isinstance(attr, type):
            return attr

        def call(*args, **kwargs):
            out = attr(*args, **kwargs)
            if name == "matmul" and out.shape[-1] != 1:  # not the row sums (_row_sum: a product with ones [V, 1])
                self.matmuls += 1
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, self._real.Tensor):
                    self.shapes.append((name, tuple(t.shape)))
            return out

        return call


@pytest.mark.parametrize("chunk_size", [1, 3, 7])
def test_no_paddle_call_makes_a_tensor_of_all_positions_times_the_vocabulary(monkeypatch, chunk_size):
    """With paddle's ops for the per-chunk work (the GPU path; kernels/chunk_kernels.py), every paddle call of the
    head (kernels/chunked_head.py) is recorded: none makes a [positions, V] tensor."""
    from paddle_grpo.kernels import chunk_kernels, chunked_head

    monkeypatch.setenv("PADDLE_GRPO_NUMPY_KERNELS", "0")
    recorder = _RecordingPaddle(paddle)
    monkeypatch.setattr(chunked_head, "paddle", recorder)
    monkeypatch.setattr(chunk_kernels, "paddle", recorder)
    hidden, weight, labels = _data(10, False)
    h, w, lab = _tensors(hidden, weight, labels, "float32")
    logp, entropy = chunked_logprobs_and_entropy(h, w, lab, chunk_size=chunk_size)
    chunks = num_chunks(POSITIONS, chunk_size)
    assert chunks == -(-POSITIONS // chunk_size) > 1
    assert recorder.matmuls == chunks                       # one logits matmul per chunk in forward
    forward_shapes = list(recorder.shapes)
    (logp.sum() + entropy.sum()).backward()
    assert recorder.matmuls == 4 * chunks                   # backward: recomputed logits, d hidden, d weight
    # Of the vocabulary-wide outputs (V = 37 is no other dimension here), only the weight's gradient exceeds a chunk.
    big = [(name, shape) for name, shape in recorder.shapes
           if V in shape and int(np.prod(shape)) > chunk_size * V and shape != tuple(weight.shape)]
    assert big == [], big
    assert max(int(np.prod(s)) for n, s in forward_shapes if V in s) == min(chunk_size, POSITIONS) * V


_MEMORY_SCRIPT = textwrap.dedent("""
    import json, sys
    import paddle
    from paddle_grpo.policy.lm_head import chunked_logprobs_and_entropy

    def status_mb(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith(key + ":")) / 1024

    def peak_growth_mb(fn):
        # VmHWM (this process image's peak RSS), reset to the current RSS by writing 5 to /proc/self/clear_refs, so
        # each phase is measured from where it starts. (ru_maxrss is not usable: after fork + exec it starts at the
        # parent's RSS, so a large pytest process would hide the measured growth.)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        start = status_mb("VmRSS")
        fn()
        return status_mb("VmHWM") - start

    def run(n, t, hid, v, chunk):
        paddle.seed(0)
        h = paddle.randn([n, t, hid]); h.stop_gradient = False
        w = paddle.randn([hid, v]) * 0.1; w.stop_gradient = False
        lab = paddle.randint(0, v, [n, t])
        logp, ent = chunked_logprobs_and_entropy(h, w, lab, chunk_size=chunk)
        (logp.sum() + 0.1 * ent.sum()).backward()
        return float(h.grad.abs().sum()) + float(w.grad.abs().sum())

    n, t, hid, v, chunk = (int(x) for x in sys.argv[1:])
    run(1, 2, hid, 64, 1)                    # warm-up on a tiny shape: kernels loaded, nothing of size V
    chunked = peak_growth_mb(lambda: run(n, t, hid, v, chunk))
    unchunked = peak_growth_mb(lambda: run(n, t, hid, v, n * t))  # one chunk: the unchunked path
    print(json.dumps({"chunked_mb": chunked, "unchunked_mb": unchunked}))
""")


def test_peak_memory_of_forward_and_backward_is_bounded_by_the_chunk_not_the_positions(repo_root):
    n, t, hid, v, chunk = 4, 512, 16, 50_000, 32
    full_mb = n * t * v * 4 / 2**20               # float32 logits of all positions: 390 MB
    env = dict(os.environ, PYTHONPATH=str(repo_root), OMP_NUM_THREADS="2")
    out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(n), str(t), str(hid), str(v), str(chunk)],
                         capture_output=True, text=True, env=env, timeout=120, check=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    # Ratios with margin, not megabytes: how much of a phase's memory is new pages depends on the allocator and on
    # what earlier phases left resident (2026-11-25, AMD EPYC: 17.4 and 389.4 MB; the unchunked path's logits alone
    # are 390.6 MB, but freed memory was reused). The unchunked path must show at least half of its logits (the
    # measure sees them), and the chunked one at most a quarter of that: its logits-sized buffers are
    # chunk / positions = 1/64 as large, plus the weight and its gradient (2 x 3.2 MB) in both paths.
    assert measured["unchunked_mb"] > full_mb / 2, measured
    assert measured["chunked_mb"] < measured["unchunked_mb"] / 4, measured
