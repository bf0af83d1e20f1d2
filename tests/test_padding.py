"""No compute on padding: micro-batches sorted by length and trimmed (use_remove_padding), formed by a token budget
(max_tokens_per_micro_batch), and the balanced row partition (data.balanced_partition).

The references are the padded path itself (fixed row slices at the batch's full width, as before these keys) run on
the same model object, and plain loops for the pure functions. A tiny random Qwen2 (biases random, so every
parameter is observable) reads a batch whose completions end at EOS at very different lengths (1 .. T tokens) after
prompts with different left padding.

Tolerances (tests/numerics.py): trimmed, re-sorted or token-budgeted micro-batches run other GEMM shapes, so other
kernels: log-probs and entropies within MODEL_TOL (tiny_lm_tol of make_model: hidden 32, intermediate 64, 2 layers,
vocab 96; SEQ2SEQ_TOL for the encoder-decoders), gradients within twice that relative to their largest. The update
is plain SGD, so a parameter's change is lr times its gradient and two updates differ by at most 2 MODEL_TOL times the
tensor's largest change. Metrics: rtol 2 MODEL_TOL, and atol for means over the P * G * T tokens whose terms (~1)
cancel (the policy loss): METRIC_ATOL.
"""
import threading

import numpy as np
import paddle
import pytest
from batch_helpers import random_bias_qwen2
from numerics import f32_sum_tol, tiny_lm_tol

from paddle_grpo import step
from paddle_grpo.algorithms import LOSS_AGG_MODES
from paddle_grpo.config import ConfigError, config_from_dict
from paddle_grpo.data import balance_rows, balanced_partition, form_micro_batches, row_extents
from paddle_grpo.parallel import ParallelContext
from paddle_grpo.policy import fast_decoder
from paddle_grpo.policy.causal import CausalPolicy
from paddle_grpo.rewards import RewardResult
from paddle_grpo.rollout import Rollout

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

V, P, G, L, T = 96, 4, 4, 9, 24
MODEL_TOL = tiny_lm_tol(64, 2, V)            # 1.6e-4
SEQ2SEQ_TOL = tiny_lm_tol(64, 6, 300)        # 4.6e-4 (as tests/policy/test_seq2seq.py)
METRIC_ATOL = f32_sum_tol(P * G * T, 1.0)    # 4.6e-5


def make_model(seed=0):
    return random_bias_qwen2(V, seed)


def skewed_batch(seed=0):
    """P prompts x G samples; prompts left-padded by 0..5 columns; completions of 1 .. T tokens (most short)."""
    rng = np.random.default_rng(seed)
    prompt_len = np.repeat([L, 4, 7, 5], G)
    pm = (np.arange(L)[None] >= L - prompt_len[:, None]).astype("int64")
    pid = np.repeat(rng.integers(3, V, size=(P, L)), G, 0) * pm
    lengths = np.array([T, 1, 3, 2, 6, 1, 2, 4, 1, 18, 2, 5, 3, 1, 9, 2])
    cm = (np.arange(T)[None] < lengths[:, None]).astype("int64")
    cid = rng.integers(3, V, size=(P * G, T)) * cm
    rollout = Rollout(prompt_ids=paddle.to_tensor(pid), prompt_mask=paddle.to_tensor(pm),
                      completion_ids=paddle.to_tensor(cid), completion_mask=paddle.to_tensor(cm), lengths=lengths,
                      truncated=lengths == T,
                      sample_logprobs=paddle.to_tensor((-rng.random((P * G, T)) * cm).astype("float32")))
    scores = [float(s) for s in rng.integers(0, 3, size=P * G)]
    result = RewardResult(scores=scores, scores_by_function={"f": scores}, errors=[None] * (P * G))
    return step.Batch.from_rollout(rollout, ["t"] * (P * G), result, list(range(P)), G)


def cfg_of(**values):
    base = dict(actor_model_name_or_path="unused", use_rm_server=False, reward_funcs="kk", train_datasets="unused",
                rollout_n=G, global_batch_size=P, global_mini_batch_size=2, max_dec_len=T, min_dec_len=1,
                max_prompt_len=L, max_length=L + T, kl_coeff=0.0, temperature=0.9, per_device_train_batch_size=4,
                per_device_logprob_batch_size=4)
    return config_from_dict({**base, **values})


# --------------------------------------------------------------------------------------------- pure functions

def test_row_extents_are_the_columns_each_row_uses():
    pm = np.array([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]])
    cm = np.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    p, c = row_extents(pm, cm)
    assert p.tolist() == [2, 4, 0] and c.tolist() == [2, 1, 0]


@pytest.mark.parametrize("max_rows, max_tokens", [(4, 0), (3, 0), (1, 0), (8, 30), (8, 60), (8, 7), (2, 200)])
def test_micro_batches_hold_every_row_once_within_the_budget(max_rows, max_tokens):
    rng = np.random.default_rng(max_rows * 100 + max_tokens)
    p, c = rng.integers(0, 12, size=37), rng.integers(1, 40, size=37)
    parts = form_micro_batches(p, c, max_rows, max_tokens)
    assert sorted(np.concatenate(parts).tolist()) == list(range(37))
    for part in parts:
        assert part.tolist() == sorted(part.tolist())  # ascending: a prompt's samples stay adjacent
        cost = len(part) * (p[part].max() + c[part].max())
        if max_tokens:
            assert cost <= max_tokens or len(part) == 1  # a row longer than the budget is alone
        else:
            assert len(part) <= max_rows
    if not max_tokens:  # all full but the last
        assert [len(x) for x in parts[:-1]] == [max_rows] * (len(parts) - 1)
    # Longest first and of similar lengths: every row of a micro-batch is at least as long as every later one.
    totals = [(p + c)[part] for part in parts]
    assert all(a.min() >= b.max() for a, b in zip(totals, totals[1:]))


def test_a_budget_packs_greedily_by_the_padded_area():
    p, c = np.array([2, 2, 2, 2, 2]), np.array([10, 1, 1, 1, 20])
    # sorted: row 4 (22), row 0 (12), rows 1, 2, 3 (3 each)
    parts = form_micro_batches(p, c, 0, 24)
    assert [x.tolist() for x in parts] == [[4], [0, 1], [2, 3]]  # 22; 2 x 12; 2 x 3
    assert [x.tolist() for x in form_micro_batches(p, c, 0, 10)] == [[4], [0], [1, 2, 3]]
    assert [x.tolist() for x in form_micro_batches(p, c, 0, 8)] == [[4], [0], [1, 2], [3]]
    with pytest.raises(ValueError):
        form_micro_batches(p, c, 0, 0)


@pytest.mark.parametrize("n, parts, seed", [(16, 2, 0), (24, 4, 1), (30, 3, 2), (8, 8, 3), (64, 2, 4)])
def test_balanced_partition_has_equal_sizes_and_sums_within_the_heaviest_row(n, parts, seed):
    rng = np.random.default_rng(seed)
    w = rng.integers(1, 500, size=n) * (rng.random(n) < 0.8) + 1  # skewed, some tiny
    split = balanced_partition(w, parts)
    assert sorted(np.concatenate(split).tolist()) == list(range(n))
    assert all(len(s) == n // parts and s.tolist() == sorted(s.tolist()) for s in split)
    sums = [w[s].sum() for s in split]
    assert max(sums) - min(sums) <= w.max()
    again = balanced_partition(w.copy(), parts)
    assert all(np.array_equal(a, b) for a, b in zip(split, again))  # deterministic: the same on every rank
    # Better than the contiguous split the ranks hold without balancing, on a length-sorted batch.
    contiguous = np.sort(w)[::-1].reshape(parts, -1).sum(1)
    assert max(sums) - min(sums) <= contiguous.max() - contiguous.min()
    for bad in ((np.ones(5), 2), (w, 0)):
        with pytest.raises(ValueError):
            balanced_partition(*bad)


@pytest.mark.parametrize("ranks, n, m", [(2, 16, 8), (2, 16, 16), (4, 8, 4), (3, 6, 2), (2, 16, 5)])
def test_balance_rows_keeps_every_mini_batch_and_balances_each_ranks_share(ranks, n, m):
    rng = np.random.default_rng(ranks * 10 + n)
    w = rng.integers(1, 300, size=ranks * n)
    held = balance_rows(w, ranks, m)
    assert sorted(np.concatenate(held).tolist()) == list(range(ranks * n))
    m = m if n % m == 0 else n  # a size that does not divide: the whole share is one mini-batch
    for k in range(0, n, m):
        original = {r * n + k + i for r in range(ranks) for i in range(m)}
        shares = [h[k:k + m] for h in held]
        assert set(np.concatenate(shares).tolist()) == original  # mini-batch k keeps its rows
        sums = [w[x].sum() for x in shares]
        assert max(sums) - min(sums) <= w[list(original)].max()
    assert all(np.array_equal(a, b) for a, b in zip(held, balance_rows(w, ranks, m)))


class ThreadRanks:
    """`ranks` data-parallel ranks as threads of one process: all_gather_object / all_reduce_sum through a shared
    list and a barrier (what the step's collectives do over gloo)."""

    def __init__(self, ranks):
        self.barrier, self.slots = threading.Barrier(ranks), [None] * ranks

    def context(self, rank):
        ranks = self

        class Par:
            dp_world, dp_rank = len(ranks.slots), rank

            def all_gather_object(self, obj):
                ranks.slots[rank] = obj
                ranks.barrier.wait()
                out = list(ranks.slots)
                ranks.barrier.wait()
                return out

        return Par()


def test_balance_then_gather_gives_the_unbalanced_global_rows_and_balanced_shares():
    """Two ranks (threads) with skewed batches: after `balance` each holds the same number of rows per
    mini-batch with about the same tokens, and `gather` / `local_rows` give exactly the unbalanced global arrays."""
    batches = [skewed_batch(0), skewed_batch(1)]
    batches[1].completion_mask[:, 3:] = 0  # rank 1's completions all short: the unbalanced shares are skewed
    cfg = cfg_of(balance_batch=True)
    per_mini = cfg.batch_geometry(2).sequences_per_mini_batch
    ref = step.gather(unbalanced_par(batches), batches[0], None, None)
    out, errors = [None, None], []
    ranks = ThreadRanks(2)

    def run(r):
        try:
            par = ranks.context(r)
            mine = step.balance(par, batches[r], cfg, per_mini, pad_id=0)
            rows = step.gather(par, mine, mine.sample_logprobs, mine.sample_logprobs * 2, mine.sample_logprobs * 4)
            out[r] = (mine, rows)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)
            ranks.barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors, errors
    tokens = lambda b: b.prompt_mask.numpy().sum(1) + b.completion_mask.numpy().sum(1)  # noqa: E731
    for k in range(0, 2 * P * G // 2, per_mini):
        before = [tokens(b)[k:k + per_mini].sum() for b in batches]
        after = [tokens(o[0])[k:k + per_mini].sum() for o in out]
        assert sum(before) == sum(after) and abs(after[0] - after[1]) <= max(abs(before[0] - before[1]), 9 + T)
    assert abs(tokens(out[0][0]).sum() - tokens(out[1][0]).sum()) < abs(tokens(batches[0]).sum()
                                                                      - tokens(batches[1]).sum())
    for mine, rows in out:
        assert len(mine) == P * G and rows.rows is not None
        for key in ("rewards", "valid", "lengths", "truncated"):
            np.testing.assert_array_equal(getattr(rows, key), getattr(ref, key), err_msg=key)
        np.testing.assert_array_equal(rows.mask[:, :ref.mask.shape[1]], ref.mask)
        assert not rows.mask[:, ref.mask.shape[1]:].any()
        # Each rank's rows of a global array are its own rows: the tokens and log-probs it holds.
        np.testing.assert_array_equal(step.local_rows(rows, rows.mask, mine), mine.completion_mask.numpy())
        # values moved between rows, no arithmetic (2 * x is exact): numpy's default rtol 1e-7 holds exactly
        np.testing.assert_allclose(step.local_rows(rows, rows.old, mine), mine.sample_logprobs.numpy())
        np.testing.assert_allclose(rows.ref, 2 * rows.old)
        # the critic's values (PPO / VAPO) travel with the other per-row data, back in rank order
        np.testing.assert_allclose(rows.values, 4 * rows.old)
        np.testing.assert_allclose(step.local_rows(rows, rows.values, mine), 4 * mine.sample_logprobs.numpy())
        # The rows a rank now holds are exactly some rows of the original batches (ids and masks), trimmed.
        assert mine.prompt_mask.numpy()[:, 0].any() and mine.completion_mask.numpy()[:, -1].any()
    held = np.sort(np.concatenate([o[0].row_ids for o in out]))
    assert held.tolist() == list(range(2 * P * G))


def unbalanced_par(batches):
    """A one-call stand-in for two ranks' unbalanced gather: all_gather_object returns each batch's own dict."""
    class Par:
        dp_world, dp_rank = 2, 0

        def all_gather_object(self, obj):
            return [obj] + [{**obj, **{"rewards": b.rewards, "valid": b.valid, "lengths": b.lengths,
                                       "truncated": b.truncated, "by_function": b.scores_by_function,
                                       "mask": b.completion_mask.numpy(), "row_ids": None}} for b in batches[1:]]

    return Par()


# ------------------------------------------------------------------------------------- micro-batch plans

def test_plan_is_fixed_row_slices_at_full_width_by_default():
    b = skewed_batch()
    plan = step.plan_micro_batches(b.prompt_mask.numpy(), b.completion_mask.numpy(), np.arange(16), 4, cfg_of())
    assert [mb.rows.tolist() for mb in plan] == [list(range(s, s + 4)) for s in range(0, 16, 4)]
    assert all(mb.prompt_cols == slice(0, L) and mb.width == T for mb in plan)


@pytest.mark.parametrize("values", [dict(use_remove_padding=True), dict(max_tokens_per_micro_batch=60),
                                    dict(use_remove_padding=True, max_tokens_per_micro_batch=20)])
def test_trimmed_plans_cut_only_columns_no_row_of_the_micro_batch_uses(values):
    b = skewed_batch()
    pm, cm = b.prompt_mask.numpy(), b.completion_mask.numpy()
    plan = step.plan_micro_batches(pm, cm, np.arange(16), 4, cfg_of(**values))
    for mb in plan:
        kept_p = np.zeros(L, bool)
        kept_p[mb.prompt_cols] = True
        assert not pm[mb.rows][:, ~kept_p].any() and cm[mb.rows][:, mb.width:].sum() == 0
        assert pm[mb.rows][:, mb.prompt_cols.start].any() and cm[mb.rows][:, mb.width - 1].any()  # tight
        assert mb.prompt_cols.stop == L


def test_computed_positions_shrink_on_a_skewed_batch():
    """The model's positions (rows x (prompt + completion columns)) of the log-prob pass: padded vs trimmed."""
    b = skewed_batch()
    pm, cm = b.prompt_mask.numpy(), b.completion_mask.numpy()
    area = lambda plan: sum(len(m.rows) * (m.prompt_cols.stop - m.prompt_cols.start + m.width)  # noqa: E731
                            for m in plan)
    padded = area(step.plan_micro_batches(pm, cm, np.arange(16), 4, cfg_of()))
    trimmed = area(step.plan_micro_batches(pm, cm, np.arange(16), 4, cfg_of(use_remove_padding=True)))
    assert padded == 16 * (L + T) and trimmed < 0.6 * padded
    real = int(pm.sum() + cm.sum())
    assert trimmed >= real


# ------------------------------------------------------------------------------------ log-probs, update

@pytest.mark.parametrize("fast", ["1", "0"])
@pytest.mark.parametrize("values", [dict(use_remove_padding=True), dict(max_tokens_per_micro_batch=50),
                                    dict(max_tokens_per_micro_batch=1)])
def test_logprobs_equal_the_padded_path(monkeypatch, fast, values):
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, fast)
    policy, b = CausalPolicy(make_model()), skewed_batch()
    lp0, e0 = step.logprobs(policy, b, cfg_of(), with_entropy=True)
    lp1, e1 = step.logprobs(policy, b, cfg_of(**values), with_entropy=True)
    m = b.completion_mask.numpy() == 1
    assert lp1.shape == [P * G, T]
    np.testing.assert_allclose(lp1.numpy()[m], lp0.numpy()[m], rtol=0, atol=MODEL_TOL)
    np.testing.assert_allclose(e1.numpy()[m], e0.numpy()[m], rtol=0, atol=MODEL_TOL)
    # Beyond its micro-batch's longest completion a row holds 0 (no model ran there).
    plan = step.plan_micro_batches(b.prompt_mask.numpy(), b.completion_mask.numpy(), np.arange(16), 4,
                                   cfg_of(**values))
    for mb in plan:
        assert not lp1.numpy()[mb.rows, mb.width:].any()
    assert len(plan) < 16 or values.get("max_tokens_per_micro_batch") == 1


@pytest.mark.parametrize("arch", ["t5", "bart"])
def test_encoder_decoder_logprobs_equal_the_padded_path(tmp_path, arch):
    """Encoder-decoders (BART: learned absolute positions) through the same micro-batch plans."""
    from paddle_grpo.policy import seq2seq
    from paddle_grpo.recipes.seq2seq import build_tiny_seq2seq

    corpus = ["summarize: a knight and a knave met on the island", "the knight lies"] * 5
    build_tiny_seq2seq(str(tmp_path), corpus, arch=arch, vocab_size=300, d_model=32, ffn_dim=64, num_heads=4, seed=3)
    policy, b = seq2seq.Seq2SeqPolicy(seq2seq.load_seq2seq_lm(str(tmp_path))), skewed_batch()
    lp0, e0 = step.logprobs(policy, b, cfg_of(), with_entropy=True)
    for values in (dict(use_remove_padding=True), dict(max_tokens_per_micro_batch=50)):
        lp1, e1 = step.logprobs(policy, b, cfg_of(**values), with_entropy=True)
        m = b.completion_mask.numpy() == 1
        np.testing.assert_allclose(lp1.numpy()[m], lp0.numpy()[m], rtol=0, atol=SEQ2SEQ_TOL)
        np.testing.assert_allclose(e1.numpy()[m], e0.numpy()[m], rtol=0, atol=SEQ2SEQ_TOL)


def run_update(cfg, fast, monkeypatch, old_lp=False, kl=False):
    """One `step.update` (2 mini-batches) on a fresh copy of the model; (metrics, updated parameters, the
    gradients of the last mini-batch are gone, so the parameters carry them)."""
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, fast)
    model = make_model()
    policy, b = CausalPolicy(model), skewed_batch()
    rng = np.random.default_rng(5)
    adv = paddle.to_tensor((rng.standard_normal((P * G, T)) * b.completion_mask.numpy()).astype("float32"))
    valid = paddle.to_tensor(np.array([1] * 13 + [0] + [1] * 2, dtype="int64"))  # one row no function judged
    noise = lambda: paddle.to_tensor((rng.standard_normal((P * G, T)) * 0.05).astype("float32"))  # noqa: E731
    base = step.logprobs(policy, b, cfg_of())[0]
    old = base + noise() if old_lp else None
    ref = base + noise() if kl else None
    scheduler = paddle.optimizer.lr.LambdaDecay(0.5, lambda s: 1.0)
    learner = step.Learner(policy, None, paddle.optimizer.SGD(learning_rate=scheduler,
                                                              parameters=model.parameters()), scheduler)
    inputs = step.UpdateInputs(b, adv, b.completion_mask * valid[:, None], old, ref)
    metrics = step.update(ParallelContext(), learner, inputs, cfg, cfg.batch_geometry(1), 0).as_dict()
    return metrics, {k: v.numpy().copy() for k, v in model.state_dict().items()}


UPDATE_VARIANTS = [dict(use_remove_padding=True), dict(max_tokens_per_micro_batch=40),
                   dict(max_tokens_per_micro_batch=120), dict(max_tokens_per_micro_batch=1, use_remove_padding=True)]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("values", UPDATE_VARIANTS)
def test_update_equals_the_padded_path_for_every_loss_agg_mode(monkeypatch, mode, values):
    common = dict(loss_agg_mode=mode, entropy_coeff=0.01, kl_loss_coeff=0.1, update_iters=1)
    m0, p0 = run_update(cfg_of(**common), "1", monkeypatch, old_lp=True, kl=True)
    m1, p1 = run_update(cfg_of(**common, **values), "1", monkeypatch, old_lp=True, kl=True)
    for key in ("train/policy_loss", "train/kl_loss", "train/grad_norm", "train/entropy", "train/approx_kl_old",
                "train/clip_frac_low", "train/clip_frac_high"):
        np.testing.assert_allclose(m1[key], m0[key], rtol=2 * MODEL_TOL, atol=METRIC_ATOL, err_msg=key)
    assert m0["train/grad_norm"] > 1e-3
    initial = {k: v.numpy() for k, v in make_model().state_dict().items()}
    moved = 0
    for k in p0:
        change = np.abs(p0[k] - initial[k]).max()
        np.testing.assert_allclose(p1[k], p0[k], rtol=0, atol=2 * MODEL_TOL * change, err_msg=k)
        moved += int(change > 1e-4)
    assert moved > len(p0) // 2  # the update did change the model


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("values", [dict(use_remove_padding=True), dict(max_tokens_per_micro_batch=40)])
def test_update_equals_the_padded_path_on_paddlenlp_forward(monkeypatch, values, level):
    common = dict(loss_agg_mode="seq-mean-token-mean", importance_sampling_level=level)
    m0, p0 = run_update(cfg_of(**common), "0", monkeypatch, old_lp=level == "sequence")
    m1, p1 = run_update(cfg_of(**common, **values), "0", monkeypatch, old_lp=level == "sequence")
    np.testing.assert_allclose(m1["train/grad_norm"], m0["train/grad_norm"], rtol=2 * MODEL_TOL)
    np.testing.assert_allclose(m1["train/policy_loss"], m0["train/policy_loss"], rtol=2 * MODEL_TOL, atol=METRIC_ATOL)
    initial = {k: v.numpy() for k, v in make_model().state_dict().items()}
    for k in p0:
        change = np.abs(p0[k] - initial[k]).max()
        np.testing.assert_allclose(p1[k], p0[k], rtol=0, atol=2 * MODEL_TOL * change, err_msg=k)


def test_the_token_budget_must_not_be_negative():
    with pytest.raises(ConfigError, match="max_tokens_per_micro_batch"):
        cfg_of(max_tokens_per_micro_batch=-1)
