"""Multi-turn masks (docs/tools.md, "Masks"): tool-output tokens are context, not actions.

A batch whose completions hold tool output inside (between two assistant turns) and at the end (a row whose budget
ran out in a tool turn), read by a tiny random Qwen2 (random biases: every parameter observable):
- the forward passes attend over actions and tool output (`Batch.attention_mask`): the action log-probs equal a
  plain forward of each row's whole conversation as one unpadded sequence, and differ from a forward that masks the
  tool tokens out (so the check can fail);
- the loss (policy loss, KL loss, entropy bonus, positive-example NLL; every loss_agg_mode) sends exactly zero
  gradient to the logits at tool positions and is bitwise unchanged when the tool positions' advantages, old,
  sample and reference log-probs change arbitrarily; a real `step.update` (AdamW, micro-batches) ends bitwise equal;
- the critic (PPO): values attend over the tool output; the value loss ignores tool positions; GAE gives them 0.

Tolerances (tests/numerics.py): the reference forward runs other kernels (PaddleNLP's decoder on unpadded rows vs the
lean forward on the padded batch): MODEL_TOL = tiny_lm_tol(hidden 32 / intermediate 64, 2 layers, vocab 96).
Exact equalities are within one process on the same kernels, where every masked term is multiplied by 0 or dropped
by `where` (algorithms._common.masked), so the same float operations run on the same action values.
"""
import numpy as np
import paddle
import pytest
from batch_helpers import loss_test_cfg, random_bias_qwen2
from numerics import f32_sum_tol, tiny_lm_tol

from paddle_grpo import step
from paddle_grpo.algorithms import LOSS_AGG_MODES
from paddle_grpo.parallel import ParallelContext
from paddle_grpo.policy import fast_decoder
from paddle_grpo.policy.causal import CausalPolicy, logprobs_from_completion_logits
from paddle_grpo.policy.critic import Critic
from paddle_grpo.rewards import RewardResult
from paddle_grpo.rollout import Rollout

pytestmark = pytest.mark.numerics

V, G, L, T = 96, 2, 6, 12
MODEL_TOL = tiny_lm_tol(64, 2, V)
# Per row: "a" action, "t" tool output (context), "." padding. Row 0: tool output inside and at the end; row 2:
# inside; row 3: ends in a tool turn (budget ran out); row 1 single-turn.
LAYOUT = ["aaatttaaattt",
          "aaaaaaaaaaaa",
          "aatttaa.....",
          "aaaatttttt.."]
ACTIONS = np.array([[c == "a" for c in r] for r in LAYOUT], dtype="int64")
TOOLS = np.array([[c == "t" for c in r] for r in LAYOUT], dtype="int64")
N = len(LAYOUT)


def make_model(seed=0):
    return random_bias_qwen2(V, seed)


def tool_batch(seed=0, tool_mask=True):
    """N rows (N / G prompts, left-padded), completions laid out as LAYOUT; every row judged."""
    rng = np.random.default_rng(seed)
    pm = (np.arange(L)[None] >= L - np.repeat([L, 4], G)[:, None]).astype("int64")
    pid = np.repeat(rng.integers(3, V, size=(N // G, L)), G, 0) * pm
    union = ACTIONS | TOOLS
    cid = rng.integers(3, V, size=(N, T)) * union
    rollout = Rollout(prompt_ids=paddle.to_tensor(pid), prompt_mask=paddle.to_tensor(pm),
                      completion_ids=paddle.to_tensor(cid), completion_mask=paddle.to_tensor(ACTIONS),
                      lengths=ACTIONS.sum(1), truncated=np.array([True, False, False, True]),
                      sample_logprobs=paddle.to_tensor((-rng.random((N, T)) * ACTIONS).astype("float32")))
    scores = [1.0, 0.0, 0.5, 0.0]
    batch = step.Batch.from_rollout(rollout, ["t"] * N, RewardResult(scores, {"f": scores}, [None] * N),
                                    list(range(N // G)), G)
    if tool_mask:
        batch.tool_mask = paddle.to_tensor(TOOLS)
        batch.turns = [[{"role": "assistant", "content": f"row {i}"}] for i in range(N)]
    return batch


def cfg_of(**values):
    return loss_test_cfg(G, N, T, L, **values)


def reference_logprobs(model, batch, temperature):
    """[N, T] float64: each row's prompt + completion (actions and tool output) as ONE unpadded sequence through
    PaddleNLP's own forward (no attention mask, positions 0..S-1): tool output is plain context there."""
    pid, pm, cid = batch.prompt_ids.numpy(), batch.prompt_mask.numpy(), batch.completion_ids.numpy()
    union = batch.attention_mask().numpy()
    out = np.zeros((N, T))
    with paddle.no_grad():
        for i in range(N):
            n = int(union[i].sum())
            prompt = pid[i][pm[i] == 1]
            ids = np.concatenate([prompt, cid[i, :n]])[None]
            logits = model(input_ids=paddle.to_tensor(ids), return_dict=True).logits.numpy()[0].astype(np.float64)
            z = logits[len(prompt) - 1:len(prompt) - 1 + n] / temperature
            z = z - z.max(-1, keepdims=True)
            lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
            out[i, :n] = lp[np.arange(n), cid[i, :n]]
    return out


def test_batch_carries_the_tool_mask_and_turns_through_take_groups_concat():
    batch = tool_batch()
    assert np.array_equal(batch.attention_mask().numpy(), ACTIONS | TOOLS)
    part = batch.take([3, 0])
    assert np.array_equal(part.tool_mask.numpy(), TOOLS[[3, 0]]) and part.turns == [batch.turns[3], batch.turns[0]]
    assert np.array_equal(batch.groups([1], G).tool_mask.numpy(), TOOLS[2:])
    # A part without tools (single-turn round) concatenated with one with tools: its tool mask is all 0.
    plain = tool_batch(tool_mask=False).take([1])
    both = step.Batch.concat([plain, batch.take([0])], pad_id=0)
    assert np.array_equal(both.tool_mask.numpy(), np.stack([np.zeros(T, "int64"), TOOLS[0]]))
    assert both.turns == [[], batch.turns[0]]
    assert step.Batch.concat([plain, plain], pad_id=0).tool_mask is None
    rows = batch.sample_rows([{"src": "p0"}, {"src": "p1"}], k=2)
    assert [r["turns"] for r in rows] == batch.turns[:2] and rows[0]["length"] == 6  # actions only


@pytest.mark.parametrize("fast", ["1", "0"])
def test_forward_attends_over_tool_output_as_context(monkeypatch, fast):
    """The lean forward (fast "1") and PaddleNLP's decoder with an attention mask ("0"), in micro-batches sorted
    and trimmed by the union (use_remove_padding), against whole unpadded rows."""
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, fast)
    model, batch, cfg = make_model(), tool_batch(), cfg_of(use_remove_padding=True)
    policy = CausalPolicy(model)
    ref = reference_logprobs(model, batch, cfg.temperature)
    lp = step.logprobs(policy, batch, cfg)[0].numpy()
    a = ACTIONS == 1
    np.testing.assert_allclose(lp[a], ref[a], rtol=0, atol=MODEL_TOL)
    # The micro-batch plan cut no row inside its tool output: the last tool tokens were computed too.
    t = TOOLS == 1
    np.testing.assert_allclose(lp[t], ref[t], rtol=0, atol=MODEL_TOL)
    # Control: tool output masked out of attention changes the actions after it (rows 0 and 2) beyond the bound
    # on rounding (a random tiny model reads its context weakly: ~1e-3 .. 1e-2 here).
    blind = step.logprobs(policy, tool_batch(tool_mask=False), cfg)[0].numpy()
    after = np.zeros_like(a)
    after[0, 6:9] = after[2, 5:7] = True
    assert np.abs(blind[after] - ref[after]).max() > 10 * MODEL_TOL


def loss_inputs(seed, batch, perturb_tools=False):
    """Advantages, old, reference log-probs [N, T] and the positive-example mask; `perturb_tools`: other random
    values (|x| up to 50) at the tool positions only."""
    rng = np.random.default_rng(seed)
    adv, old, ref = rng.standard_normal((3, N, T)).astype("float32")
    old, ref = -np.abs(old), -np.abs(ref)
    if perturb_tools:
        t = TOOLS == 1
        for x in (adv, old, ref):
            x[t] = np.random.default_rng(seed + 99).uniform(-50, 50, size=t.sum())
    positive = ACTIONS * np.array([[1], [0], [1], [0]])
    return [paddle.to_tensor(x) for x in (adv, old, ref, positive)]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_loss_gives_tool_positions_exactly_zero_gradient_and_ignores_their_values(mode):
    """Through the logits: a full forward, the log-probs and entropies of `logprobs_from_completion_logits` (the
    pipeline's loss path) and `step.rl_loss` with every term on. Exact zeros are right here: every term of a tool
    position is dropped by `where` or multiplied by a 0 mask, so its gradient is 0 * (finite) = 0, not a small
    number."""
    model, batch = make_model(), tool_batch()
    cfg = cfg_of(loss_agg_mode=mode, kl_loss_coeff=0.1, entropy_coeff=0.05, positive_example_lm_coeff=0.2)
    ids = paddle.concat([batch.prompt_ids, batch.completion_ids], axis=1)
    attn = paddle.concat([batch.prompt_mask, batch.attention_mask()], axis=1)
    positions = paddle.to_tensor(np.maximum(np.cumsum(attn.numpy(), 1) - 1, 0))
    logits = model(input_ids=ids, attention_mask=attn, position_ids=positions, return_dict=True).logits
    agg = {"num_global_tokens": float(ACTIONS.sum()), "num_global_seqs": float(N), "max_dec_len": T,
           "positive_tokens": float(ACTIONS[[0, 2]].sum())}

    def loss_of(seed, perturb, lp_noise=None):
        lp, ent = logprobs_from_completion_logits(logits[:, L - 1:-1], batch.completion_ids, cfg.temperature, True)
        if lp_noise is not None:  # the policy's own log-probs at tool positions changed too
            lp = lp + paddle.to_tensor(lp_noise * TOOLS.astype("float32"))
        adv, old, ref, positive = loss_inputs(seed, batch, perturb)
        loss, sums = step.rl_loss(cfg, lp, ent, old, adv, batch.completion_mask, ref, dict(agg), positive)
        return loss, sums

    loss, sums = loss_of(0, False)
    (grad,) = paddle.grad(loss, [logits])
    g = np.abs(grad.numpy()[:, L - 1:-1]).sum(-1)  # [N, T]: column t = the logits predicting completion token t
    assert (g[TOOLS == 1] == 0).all(), "a tool position's logits got a gradient"
    assert (g[ACTIONS == 1] > 0).all(), "every action's logits get a gradient (the check can fail)"
    for noise in (None, np.random.default_rng(3).uniform(-30, 30, (N, T)).astype("float32")):
        loss2, sums2 = loss_of(0, True, noise)
        assert float(loss2) == float(loss) and np.array_equal(sums2, sums)
    # Control: the same perturbation on one action position changes the loss.
    adv, old, ref, positive = loss_inputs(0, batch)
    adv_np = adv.numpy()
    adv_np[0, 7] += 1.0
    lp, ent = logprobs_from_completion_logits(logits[:, L - 1:-1], batch.completion_ids, cfg.temperature, True)
    changed = step.rl_loss(cfg, lp, ent, old, paddle.to_tensor(adv_np), batch.completion_mask, ref, dict(agg),
                           positive)[0]
    assert float(changed) != float(loss)
    assert sums[-1] == ACTIONS.sum()  # the token count of the statistics counts actions only


def run_update(batch, adv, old, ref, positive):
    """One real `step.update` (AdamW, 2 micro-batches sorted and trimmed) of a fresh model; its parameters after."""
    model = make_model()
    cfg = cfg_of(kl_loss_coeff=0.1, entropy_coeff=0.05, positive_example_lm_coeff=0.2, use_remove_padding=True,
                 update_iters=1)
    scheduler = paddle.optimizer.lr.LambdaDecay(1e-2, lambda s: 1.0)
    learner = step.Learner(CausalPolicy(model), None, paddle.optimizer.AdamW(learning_rate=scheduler,
                                                                             parameters=model.parameters()), scheduler)
    inputs = step.UpdateInputs(batch, adv, batch.completion_mask, old, ref, positive)
    metrics = step.update(ParallelContext(), learner, inputs, cfg, cfg.batch_geometry(1), 0).as_dict()
    return metrics, {k: v.numpy().copy() for k, v in model.state_dict().items()}


def test_a_real_update_does_not_depend_on_what_tool_positions_hold():
    batch = tool_batch()
    m0, p0 = run_update(batch, *loss_inputs(0, batch))
    other = tool_batch()
    other.sample_logprobs = other.sample_logprobs + paddle.to_tensor(7.0 * TOOLS.astype("float32"))
    m1, p1 = run_update(other, *loss_inputs(0, other, perturb_tools=True))
    assert m1 == m0
    assert all(np.array_equal(p1[k], p0[k]) for k in p0)
    initial = {k: v.numpy() for k, v in make_model().state_dict().items()}
    assert sum(not np.array_equal(p0[k], initial[k]) for k in p0) > len(p0) // 2  # the update moved the model


def make_critic(model):
    """A critic on the policy's backbone with a random (not zero) value head, so values differ per position."""
    head = paddle.nn.Linear(32, 1)
    with paddle.no_grad():
        head.weight.set_value(paddle.randn([32, 1]) * 0.5)
    return Critic(model, model.qwen2, head, "test")


def test_critic_values_attend_over_tool_output_and_the_value_loss_ignores_it(monkeypatch):
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, "0")
    model, batch = make_model(), tool_batch()
    critic = make_critic(model)
    cfg = cfg_of(rl_algorithm="ppo", critic_model_name_or_path="unused", use_remove_padding=True,
                 per_device_value_batch_size=2)
    v = step.values(critic, batch, cfg).numpy()
    blind = step.values(critic, tool_batch(tool_mask=False), cfg).numpy()
    pid, pm, cid = batch.prompt_ids.numpy(), batch.prompt_mask.numpy(), batch.completion_ids.numpy()
    with paddle.no_grad():  # reference: row 0's conversation unpadded, tool output as plain context
        ids = np.concatenate([pid[0][pm[0] == 1], cid[0]])[None]
        hidden = model.qwen2(input_ids=paddle.to_tensor(ids), return_dict=True).last_hidden_state
        ref = critic.head(hidden).numpy()[0, L - 1:-1, 0]
    # The hidden states differ by at most the transformer's share of MODEL_TOL (which adds the log-softmax's vocab
    # term on top); the value head's dot product multiplies that by at most sum |w| (~13 for 32 weights ~N(0, 0.25)),
    # and adds its own rounding, 32 u * the value's size (<< MODEL_TOL): (sum |w| + 1) * MODEL_TOL bounds it.
    value_tol = (float(np.abs(critic.head.weight.numpy()).sum()) + 1.0) * MODEL_TOL
    np.testing.assert_allclose(v[0][ACTIONS[0] == 1], ref[ACTIONS[0] == 1], rtol=0, atol=value_tol)
    assert np.abs(blind[0, 6:9] - ref[6:9]).max() > 10 * value_tol  # masking the tools out differs: it can fail

    from paddle_grpo.algorithms import value_loss
    rng = np.random.default_rng(1)
    vt = paddle.to_tensor(v, stop_gradient=False)
    # V_old within clip_range_value (0.2) of V: the unclipped term is live, so every action gets a gradient.
    old = (v + 0.05 * rng.standard_normal((N, T))).astype("float32")
    ret = rng.standard_normal((N, T)).astype("float32")
    out = value_loss(vt, paddle.to_tensor(old), paddle.to_tensor(ret), batch.completion_mask, 0.2,
                     num_global_tokens=float(ACTIONS.sum()))
    (grad,) = paddle.grad(out["loss"], [vt])
    assert (grad.numpy()[TOOLS == 1] == 0).all() and (grad.numpy()[ACTIONS == 1] != 0).all()
    old[TOOLS == 1], ret[TOOLS == 1] = 40.0, -40.0
    out2 = value_loss(vt, paddle.to_tensor(old), paddle.to_tensor(ret), batch.completion_mask, 0.2,
                      num_global_tokens=float(ACTIONS.sum()))
    assert float(out2["loss"]) == float(out["loss"])


def test_gae_skips_tool_output_and_gives_it_zero_advantage():
    """estimate_advantages (ppo) over the gathered rows of a tool batch: 0 at tool positions, and the actions'
    advantages and returns are a numpy GAE over the actions alone (tool positions removed from the row)."""
    batch = tool_batch()
    rng = np.random.default_rng(2)
    values = (rng.standard_normal((N, T)) * (ACTIONS | TOOLS)).astype("float32")
    rows = step.gather(ParallelContext(), batch, None, None, paddle.to_tensor(values))
    cfg = cfg_of(rl_algorithm="ppo", critic_model_name_or_path="unused", lam=0.9, gamma=0.95, kl_coeff=0.0)
    rewards = np.array([1.0, 0.0, 0.5, -1.0], dtype=np.float32)
    est = step.estimate_advantages(rows, rewards, cfg)
    assert (est.advantages[TOOLS == 1] == 0).all() and (est.returns[TOOLS == 1] == 0).all()
    for i in range(N):
        cols = np.flatnonzero(ACTIONS[i])
        r = np.zeros(len(cols))
        r[-1] = rewards[i]
        adv, next_v, next_a = np.zeros(len(cols)), 0.0, 0.0
        for k in reversed(range(len(cols))):
            delta = r[k] + 0.95 * next_v - values[i, cols[k]]
            next_a = delta + 0.95 * 0.9 * next_a
            adv[k], next_v = next_a, values[i, cols[k]]
        # gae.py recurs in float64 and rounds once to float32; the reference is float64 on the same float32 inputs:
        # one rounding of a value of size <= sum_k |delta_k| <= n * (|r| + 2 max |V|), |r| <= 1.
        size = len(cols) * (1.0 + 2.0 * float(np.abs(values).max()))
        np.testing.assert_allclose(est.advantages[i, cols], adv, rtol=0, atol=f32_sum_tol(1, size))
