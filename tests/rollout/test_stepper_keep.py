"""The steppers' per-row `keep` (multi-turn rollouts idle the rows that wait for a tool): a row's logits after idle
steps equal its logits when decoded alone, on the lean stepper (fast_decoder.py: per-row cache slots) and on
PaddleNLP's (`past_key_values` with holes in the attention mask); `keep=None` is the single-turn path, unchanged."""
import numpy as np
import paddle
import pytest
from numerics import tiny_lm_tol

from paddle_grpo.policy import load_tokenizer
from paddle_grpo.policy.causal import FastDecoderStepper, PaddleNLPStepper, load_causal_lm

pytestmark = pytest.mark.numerics

# Log-probs from decode steps (a batch of rows, one position at a time, a cache with masked slots or holes) against a
# full forward of one unpadded sequence: two float32 evaluations of conftest's tiny policy (hidden 64, intermediate
# 128, 2 layers, vocab 320) by other GEMM shapes: tests/numerics.py's bound.
LP_TOL = tiny_lm_tol(128, 2, 320)
STEPS = 9
TEXTS = ["Zoey is a knight", "What is", "<|im_start|>user\nYou meet 2 inhabitants"]


@pytest.fixture(scope="module")
def policy(tiny_policy_dir):
    return load_causal_lm(tiny_policy_dir, trainable=False), load_tokenizer(tiny_policy_dir)


def _prompts(tok):
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    L = max(map(len, ids))
    pid = np.array([[tok.pad_token_id] * (L - len(x)) + x for x in ids], dtype="int64")
    mask = np.array([[0] * (L - len(x)) + [1] * len(x) for x in ids], dtype="int64")
    return ids, paddle.to_tensor(pid), paddle.to_tensor(mask)


def _log_softmax(z):
    z = np.asarray(z, dtype=np.float64)
    m = z.max(axis=-1, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis=-1, keepdims=True))


def _run(stepper, pid, mask, tokens, schedule, G=1):
    """Feed row i its own tokens[i, 0], tokens[i, 1], ... on the steps where schedule[t, i] (None: all rows). Returns
    per row the logits [V] after each of its tokens (index 0: the prefill's), as numpy."""
    logits = stepper.start(pid, mask, G, STEPS).numpy()
    N = logits.shape[0]
    fed = np.zeros(N, dtype=np.int64)
    out = [[logits[i]] for i in range(N)]
    for keep in schedule:
        kept = np.ones(N, dtype=bool) if keep is None else np.asarray(keep)
        token = tokens[np.arange(N), np.minimum(fed, tokens.shape[1] - 1)]
        logits = stepper.step(paddle.to_tensor(token), None if keep is None else paddle.to_tensor(kept)).numpy()
        for i in np.flatnonzero(kept):
            out[i].append(logits[i])
        fed += kept
    return out


# Row 0 never idles, row 1 idles at steps 1-3 (a tool call), row 2 at steps 0 and 5; step 0 starts the per-row path.
SCHEDULE = [None, [1, 0, 1], [1, 0, 1], [1, 0, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1], [0, 1, 1], [1, 1, 1],
            [1, 1, 1], [1, 1, 1], [1, 1, 1]]


@pytest.mark.parametrize("stepper_cls", [FastDecoderStepper, PaddleNLPStepper], ids=["fast", "paddlenlp"])
def test_idle_steps_leave_a_rows_logits_those_of_its_own_sequence(policy, stepper_cls):
    model, tok = policy
    ids, pid, mask = _prompts(tok)
    tokens = np.random.default_rng(0).integers(3, 300, size=(3, STEPS)).astype("int64")
    schedule = [None] + [np.asarray(k, dtype=bool) for k in SCHEDULE[1:STEPS + 1]]
    got = _run(stepper_cls(model), pid, mask, tokens, schedule)
    for i, prompt in enumerate(ids):
        n = len(got[i]) - 1  # tokens this row appended
        assert n >= 5
        seq = paddle.to_tensor([prompt + tokens[i, :n].tolist()])
        full = model(seq, return_dict=True).logits[0, len(prompt) - 1:].numpy()  # predicts token 0 .. n
        np.testing.assert_allclose(_log_softmax(np.stack(got[i])), _log_softmax(full), rtol=0, atol=LP_TOL)


def test_lean_stepper_row_numbers_do_not_depend_on_idle_steps(policy):
    """Same batch, same kernels: a row's logits are bit for bit those of a run where no row ever idles, since its
    tokens occupy the same cache slots (consecutive after its prompt) and the idled slots are masked exactly
    (exp(finfo.min - max) == 0). keep=all (the per-row writes) equals keep=None (the single-turn slice writes)."""
    model, tok = policy
    _, pid, mask = _prompts(tok)
    tokens = np.random.default_rng(1).integers(3, 300, size=(3, STEPS)).astype("int64")
    aligned = _run(FastDecoderStepper(model), pid, mask, tokens, [None] * STEPS)
    all_kept = _run(FastDecoderStepper(model), pid, mask, tokens, [np.ones(3, dtype=bool)] * STEPS)
    idled = _run(FastDecoderStepper(model), pid, mask, tokens,
                 [None] + [np.asarray(k, dtype=bool) for k in SCHEDULE[1:STEPS + 1]])
    for i in range(3):
        np.testing.assert_array_equal(np.stack(all_kept[i]), np.stack(aligned[i]))
        n = len(idled[i])
        np.testing.assert_array_equal(np.stack(idled[i]), np.stack(aligned[i][:n]))


def test_lean_stepper_with_shared_prompts_and_a_full_row(policy):
    """G = 2 samples per prompt share the prefill; a row that filled all its max_new_tokens slots may be stepped
    again (not kept) without writing past the cache, and the other rows are unaffected."""
    model, tok = policy
    _, pid, mask = _prompts(tok)
    pid, mask = pid[:2], mask[:2]
    tokens = np.random.default_rng(2).integers(3, 300, size=(4, STEPS)).astype("int64")
    aligned = _run(FastDecoderStepper(model), pid, mask, tokens, [None] * STEPS, G=2)
    # Row 0 takes all STEPS tokens, then idles for 3 more steps while the others catch up.
    sched = ([np.array([1, 1, 0, 1], bool)] * 3 + [np.array([1, 1, 1, 1], bool)] * (STEPS - 3)
             + [np.array([0, 0, 1, 0], bool)] * 3)
    idled = _run(FastDecoderStepper(model), pid, mask, tokens, sched, G=2)
    assert [len(r) for r in idled] == [STEPS + 1, STEPS + 1, STEPS + 1, STEPS + 1]
    for i in range(4):
        np.testing.assert_array_equal(np.stack(idled[i]), np.stack(aligned[i]))
