"""KV-cached sampling (paddle_grpo/rollout/) against independent references: a naive no-cache greedy loop,
numpy implementations of top-p and the repetition penalty, a teacher-forced forward pass, and the model's own
softmax for sampling frequencies."""
import numpy as np
import paddle
import pytest
from numerics import f32_sum_tol, tiny_lm_tol

from paddle_grpo.policy import load_tokenizer
from paddle_grpo.policy.causal import completion_logprobs, generate, load_causal_lm
from paddle_grpo.rollout import top_p_filter
from paddle_grpo.rollout.sampling import row_keys

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

# Sampling log-probs (decode steps with a KV cache, one position at a time) against a teacher-forced pass over whole
# sequences: other GEMM shapes and kernels on conftest's tiny policy (hidden 64, intermediate 128, 2 layers, vocab
# 320): tests/numerics.py's bound for two evaluations.
LP_TOL = tiny_lm_tol(128, 2, 320)  # 3.4e-4


@pytest.fixture(scope="module")
def policy(tiny_policy_dir):
    return load_causal_lm(tiny_policy_dir), load_tokenizer(tiny_policy_dir)


def prompts(tok, texts):
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    L = max(map(len, ids))
    pid = np.array([[tok.pad_token_id] * (L - len(x)) + x for x in ids], dtype="int64")
    mask = np.array([[0] * (L - len(x)) + [1] * len(x) for x in ids], dtype="int64")
    return ids, pid, mask


def naive_greedy(model, ids, n, eos, penalty=1.0, min_new=0):
    """Full forward over the whole sequence at every step; the penalty and min-length rules written out in numpy."""
    model.eval()
    seq, out = list(ids), []
    for t in range(n):
        logits = model(paddle.to_tensor([seq]), return_dict=True).logits[0, -1].numpy().astype(np.float64)
        if penalty != 1.0:
            for tok in set(seq):
                logits[tok] = logits[tok] / penalty if logits[tok] > 0 else logits[tok] * penalty
        if t < min_new:
            logits[list(eos)] = -np.inf
        nxt = int(np.argmax(logits))
        out.append(nxt)
        seq.append(nxt)
        if nxt in eos:
            break
    return out


TEXTS = ["Zoey is a knight", "What is", "<|im_start|>user\nYou meet 2 inhabitants"]


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_greedy_with_cache_equals_naive_loop(policy, penalty):
    model, tok = policy
    ids, pid, mask = prompts(tok, TEXTS)
    eos = {tok.eos_token_id}
    r = generate(model, pid, mask, num_samples=1, max_new_tokens=12, eos_token_ids=eos,
                 pad_token_id=tok.pad_token_id, do_sample=False, repetition_penalty=penalty)
    for i, x in enumerate(ids):
        expected = naive_greedy(model, x, 12, eos, penalty)
        got = r.completion_ids.numpy()[i][:r.lengths[i]].tolist()
        assert got == expected
        assert r.truncated[i] == (expected[-1] not in eos)


def test_eos_stops_a_row_and_pads_after_it(policy):
    model, tok = policy
    ids, pid, mask = prompts(tok, TEXTS)
    first = generate(model, pid, mask, max_new_tokens=6, eos_token_ids=[tok.eos_token_id],
                     pad_token_id=tok.pad_token_id, do_sample=False).completion_ids.numpy()
    # Declare row 0's third greedy token to be EOS: row 0 stops there, the others go on unchanged.
    eos = int(first[0, 2])
    r = generate(model, pid, mask, max_new_tokens=6, eos_token_ids=[eos], pad_token_id=tok.pad_token_id,
                 do_sample=False)
    ids_np, mask_np = r.completion_ids.numpy(), r.completion_mask.numpy()
    assert r.lengths[0] == first[0].tolist().index(eos) + 1 and not r.truncated[0]
    assert (mask_np[0] == (np.arange(ids_np.shape[1]) < r.lengths[0])).all()
    assert (ids_np[0, r.lengths[0]:] == tok.pad_token_id).all()
    for i in range(1, len(TEXTS)):
        expected = first[i].tolist()
        if eos in expected:
            expected = expected[:expected.index(eos) + 1]
        assert ids_np[i, :r.lengths[i]].tolist() == expected
    assert ids_np.shape[1] == r.lengths.max()


def test_min_new_tokens_blocks_eos(policy):
    model, tok = policy
    ids, pid, mask = prompts(tok, TEXTS[:1])
    greedy = generate(model, pid, mask, max_new_tokens=4, eos_token_ids=[tok.eos_token_id],
                      pad_token_id=tok.pad_token_id, do_sample=False).completion_ids.numpy()[0]
    eos = {int(greedy[0])}  # the first greedy token, declared EOS, may not come before 3 tokens
    r = generate(model, pid, mask, max_new_tokens=5, min_new_tokens=3, eos_token_ids=eos,
                 pad_token_id=tok.pad_token_id, do_sample=False)
    expected = naive_greedy(model, ids[0], 5, eos, min_new=3)
    assert r.completion_ids.numpy()[0][:r.lengths[0]].tolist() == expected
    assert expected[0] not in eos and r.lengths[0] >= 3


def test_sample_logprobs_equal_teacher_forced_recomputation(policy):
    model, tok = policy
    _, pid, mask = prompts(tok, TEXTS)
    paddle.seed(3)
    r = generate(model, pid, mask, num_samples=4, max_new_tokens=10, eos_token_ids=[tok.eos_token_id],
                 pad_token_id=tok.pad_token_id, temperature=0.7)
    lp, ent = completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask,
                                  temperature=0.7, with_entropy=True)
    m = r.completion_mask.numpy().astype(bool)
    np.testing.assert_allclose(r.sample_logprobs.numpy()[m], lp.numpy()[m], atol=LP_TOL)
    assert r.prompt_ids.shape[0] == 12 and (r.prompt_ids.numpy()[4:8] == pid[1]).all()
    assert np.isfinite(ent.numpy()[m]).all() and (ent.numpy()[m] > 0).all()


def test_first_token_frequencies_match_the_model_distribution(policy):
    model, tok = policy
    _, pid, mask = prompts(tok, ["Zoey is a"])
    T = 1.5  # a flat distribution, so many tokens have visible mass
    logits = model(paddle.to_tensor(pid), return_dict=True).logits[0, -1].numpy().astype(np.float64) / T
    p = np.exp(logits - logits.max())
    p /= p.sum()
    paddle.seed(11)
    n = 4000
    r = generate(model, pid, mask, num_samples=n, max_new_tokens=1, eos_token_ids=[tok.eos_token_id],
                 pad_token_id=tok.pad_token_id, temperature=T)
    freq = np.bincount(r.completion_ids.numpy()[:, 0], minlength=len(p)) / n
    # Binomial standard error of each frequency is sqrt(p(1-p)/n) <= 0.008; allow 5 of them.
    assert np.abs(freq - p).max() < 5 * np.sqrt(p.max() * (1 - p.max()) / n) + 1e-3


def test_chunking_by_max_num_seqs_gives_the_same_greedy_result(policy):
    model, tok = policy
    _, pid, mask = prompts(tok, TEXTS)
    kw = dict(num_samples=2, max_new_tokens=8, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
              do_sample=False)
    whole = generate(model, pid, mask, **kw)
    chunked = generate(model, pid, mask, max_num_seqs=2, **kw)
    assert (whole.completion_ids.numpy() == chunked.completion_ids.numpy()).all()
    assert (whole.lengths == chunked.lengths).all()


def numpy_top_p(p, top_p):
    out = np.zeros_like(p)
    for i, row in enumerate(p):
        order = np.argsort(-row, kind="stable")
        total, keep = 0.0, []
        for j in order:
            keep.append(j)
            total += row[j]
            if total >= top_p:
                break
        out[i, keep] = row[keep]
        out[i] /= out[i].sum()
    return out


@pytest.mark.parametrize("top_p", [0.3, 0.75, 0.95])
def test_top_p_filter_against_numpy(top_p):
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(40), size=6).astype(np.float32)
    got = top_p_filter(paddle.to_tensor(p), top_p).numpy()
    # kept probabilities renormalised by their sum (at most 40 terms <= 1, float32 here, float64 in the reference)
    np.testing.assert_allclose(got, numpy_top_p(p, top_p), atol=f32_sum_tol(40, 1.0))


def test_sampling_with_top_p_only_emits_nucleus_tokens(policy):
    model, tok = policy
    _, pid, mask = prompts(tok, ["Zoey is a"])
    logits = model(paddle.to_tensor(pid), return_dict=True).logits[0, -1].numpy().astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    allowed = set(np.nonzero(numpy_top_p(p[None], 0.5)[0])[0].tolist())
    paddle.seed(5)
    r = generate(model, pid, mask, num_samples=300, max_new_tokens=1, eos_token_ids=[tok.eos_token_id],
                 pad_token_id=tok.pad_token_id, top_p=0.5)
    assert set(r.completion_ids.numpy()[:, 0].tolist()) <= allowed


@pytest.mark.parametrize("top_k,top_p", [(5, 1.0), (20, 0.6)])
def test_sampling_with_top_k_only_emits_kept_tokens_and_keeps_logprob_contract(policy, top_k, top_p):
    model, tok = policy
    _, pid, mask = prompts(tok, ["Zoey is a"])
    logits = model(paddle.to_tensor(pid), return_dict=True).logits[0, -1].numpy().astype(np.float64)
    order = np.argsort(-logits, kind="stable")
    p = np.exp(logits - logits.max())
    p /= p.sum()
    allowed = set(order[:top_k].tolist()) & set(np.nonzero(numpy_top_p(p[None], top_p)[0])[0].tolist())
    r = generate(model, pid, mask, num_samples=300, max_new_tokens=3, eos_token_ids=[tok.eos_token_id],
                 pad_token_id=tok.pad_token_id, top_k=top_k, top_p=top_p, row_keys=row_keys(2, 0, np.arange(300)))
    first = r.completion_ids.numpy()[:, 0]
    assert set(first.tolist()) <= allowed and len(set(first.tolist())) > 1
    # the log-probs stay those of the unfiltered temperature-1 distribution
    np.testing.assert_allclose(r.sample_logprobs.numpy()[:, 0], np.log(p[first]), atol=LP_TOL)
    lp, _ = completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    m = r.completion_mask.numpy().astype(bool)
    np.testing.assert_allclose(r.sample_logprobs.numpy()[m], lp.numpy()[m], atol=LP_TOL)


def test_top_k_without_keys_uses_the_global_generator(policy):
    model, tok = policy
    _, pid, mask = prompts(tok, ["Zoey is a"])
    kw = dict(num_samples=50, max_new_tokens=2, eos_token_ids=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
              top_k=3)
    paddle.seed(1)
    a = generate(model, pid, mask, **kw).completion_ids.numpy()
    paddle.seed(1)
    b = generate(model, pid, mask, **kw).completion_ids.numpy()
    logits = model(paddle.to_tensor(pid), return_dict=True).logits[0, -1].numpy()
    assert (a == b).all() and set(a[:, 0].tolist()) <= set(np.argsort(-logits)[:3].tolist())
