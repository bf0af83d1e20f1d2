"""The chunked LM head wired into every log-prob path (issue 15): `lm_head.head_logprobs` and its callers
(causal.completion_logprobs on the fast Qwen2 path and PaddleNLP's forward, LoRA, seq2seq T5/BART), the config keys
use_fused_head_and_loss_fn / fused_head_chunk_size, `Policy.head_chunk_size`, and one trainer step.

Every comparison is chunked against the unchunked path (full logits + algorithms' log-softmax, itself checked
against numpy elsewhere) on values, entropies and the gradient of every parameter; T (completion length) is not a
multiple of the chunk sizes, and chunk sizes run from 1 to beyond n * T.

Tolerances (tests/numerics.py): chunked and unchunked runs share the transformer, the same kernels in one process, so
their values differ only in the head: logits summed over H = 32 (terms ~0.02 x ~1, sum|terms| < 1) then the
log-softmax over V positive terms, HEAD_TOL. Gradients flow back through the whole model from logits' gradients that
differ by that much, and the fast and PaddleNLP paths differ everywhere: MODEL_TOL = tiny_lm_tol for the 2-layer
models here (intermediate 64), twice that for gradients.
"""
import json
import logging

import numpy as np
import paddle
import pytest

from paddle_grpo.config import ConfigError, Config, config_from_dict, key_effect
from paddle_grpo.policy import causal, lora, seq2seq
from paddle_grpo.policy.base import freeze
from paddle_grpo.policy.lm_head import LMHead, head_logprobs, lm_head_of
from paddle_grpo.precision import precision_plan
from lora_helpers import randomize_adapters
from numerics import assert_adam_close, f32_sum_tol, tiny_lm_tol

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

V, N, L, T = 97, 3, 6, 5                  # n * T = 15 positions
CHUNKS = (1, 3, 7, N * T, N * T + 4)
TEMPERATURE = 0.7
HEAD_TOL = f32_sum_tol(32, 1.0 / TEMPERATURE, depth=2) + f32_sum_tol(V, 1.0)  # 2.2e-5
MODEL_TOL = tiny_lm_tol(64, 2, V)  # 1.6e-4


def _batch(seed=0):
    """Prompts [N, L] (two rows share a prompt, one is left-padded) and completions [N, T]."""
    rng = np.random.default_rng(seed)
    pid = rng.integers(3, V, size=(N, L))
    pid[1] = pid[0]
    pm = np.ones((N, L), dtype="int64")
    pm[2, :2] = 0
    cid = rng.integers(3, V, size=(N, T))
    cm = np.ones((N, T), dtype="int64")
    cm[1, 3:] = 0
    return [paddle.to_tensor(x) for x in (pid, pm, cid, cm)]


def _qwen2(tie=False, seed=1):
    from paddlenlp.transformers import Qwen2Config, Qwen2ForCausalLM

    paddle.seed(seed)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tie))


def _llama(seed=1):
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    paddle.seed(seed)
    return LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


def _seq2seq(arch, tie=False, seed=2):
    from paddlenlp.transformers import (BartConfig, BartForConditionalGeneration, T5Config,
                                        T5ForConditionalGeneration)

    paddle.seed(seed)
    if arch == "t5":
        model = T5ForConditionalGeneration(T5Config(
            vocab_size=V, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4,
            relative_attention_num_buckets=8, dropout_rate=0.0, pad_token_id=0, eos_token_id=1,
            decoder_start_token_id=0, tie_word_embeddings=tie))
    else:
        model = BartForConditionalGeneration(BartConfig(
            vocab_size=V, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
            dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=0, bos_token_id=0,
            eos_token_id=1, decoder_start_token_id=1, init_std=0.2))
        # A non-zero final_logits_bias (zeros in a fresh model), so the bias path is exercised.
        model.final_logits_bias.set_value(paddle.randn(model.final_logits_bias.shape))
    return model


def _run(fn, model, chunk_size, with_entropy=True, seed=0):
    """(logprobs, entropy, {param name: grad}) of a loss that weights both outputs with random coefficients."""
    pid, pm, cid, cm = _batch(seed)
    lp, ent = fn(model, pid, pm, cid, cm, temperature=TEMPERATURE, with_entropy=with_entropy, chunk_size=chunk_size)
    rng = np.random.default_rng(seed + 10)
    a, b = (paddle.to_tensor(rng.normal(size=(N, T)).astype("float32")) for _ in range(2))
    loss = (lp * a).sum() + ((ent * b).sum() if with_entropy is True else 0.0)
    loss.backward()
    grads = {n: p.grad.numpy().copy() for n, p in model.named_parameters() if p.grad is not None}
    model.clear_gradients()
    return lp.numpy(), None if ent is None else ent.numpy(), grads


def _assert_same(got, ref, atol=HEAD_TOL):
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=atol)
    if ref[1] is not None:
        np.testing.assert_allclose(got[1], ref[1], rtol=1e-5, atol=atol)
    assert got[2].keys() == ref[2].keys() and len(ref[2]) > 0
    for name in ref[2]:
        np.testing.assert_allclose(got[2][name], ref[2][name], rtol=1e-4, atol=2 * MODEL_TOL, err_msg=name)


# ------------------------------------------------------------------------------------------ causal models


@pytest.mark.parametrize("fast", ["1", "0"])
@pytest.mark.parametrize("tie", [False, True])
def test_qwen2_chunked_equals_full_logits(monkeypatch, fast, tie):
    """Fast Qwen2 path and PaddleNLP's forward (PADDLE_GRPO_FAST=0); untied `[H, V]` and tied `[V, H]` heads."""
    monkeypatch.setenv("PADDLE_GRPO_FAST", fast)
    model = _qwen2(tie)
    assert causal.fast_decoder.enabled_for(model) == (fast == "1")
    ref = _run(causal.completion_logprobs, model, None)
    assert "lm_head.weight" in ref[2] or tie
    for chunk in CHUNKS:
        _assert_same(_run(causal.completion_logprobs, model, chunk), ref)


def test_fast_and_paddlenlp_paths_agree_when_chunked(monkeypatch):
    model = _qwen2()
    fast = _run(causal.completion_logprobs, model, 4)
    monkeypatch.setenv("PADDLE_GRPO_FAST", "0")
    _assert_same(_run(causal.completion_logprobs, model, 4), fast, atol=MODEL_TOL)  # two paths: other kernels


def test_llama_chunked_equals_full_logits():
    model = _llama()
    ref = _run(causal.completion_logprobs, model, None)
    for chunk in (1, 4, N * T + 1):
        _assert_same(_run(causal.completion_logprobs, model, chunk), ref)


@pytest.mark.parametrize("with_entropy", [False, "detached"])
def test_entropy_modes(with_entropy):
    """No entropy, or a detached one: same values as the full path, no graph for the entropy, same gradients."""
    model = _qwen2()
    ref = _run(causal.completion_logprobs, model, None, with_entropy=with_entropy)
    got = _run(causal.completion_logprobs, model, 4, with_entropy=with_entropy)
    _assert_same(got, ref)
    full_entropy = _run(causal.completion_logprobs, model, None, with_entropy=True)[1]
    if with_entropy:
        np.testing.assert_allclose(got[1], full_entropy, rtol=1e-5, atol=HEAD_TOL)
        pid, pm, cid, cm = _batch()
        _, ent = causal.completion_logprobs(model, pid, pm, cid, cm, with_entropy="detached", chunk_size=4)
        assert ent.stop_gradient
    else:
        assert got[1] is None


def test_frozen_reference_under_no_grad():
    model = freeze(_qwen2())
    pid, pm, cid, cm = _batch()
    with paddle.no_grad():
        ref = causal.completion_logprobs(model, pid, pm, cid, cm, temperature=TEMPERATURE, with_entropy=True)
        for chunk in (1, 7):
            lp, ent = causal.completion_logprobs(model, pid, pm, cid, cm, temperature=TEMPERATURE,
                                                 with_entropy=True, chunk_size=chunk)
            assert lp.stop_gradient and ent.stop_gradient
            np.testing.assert_allclose(lp.numpy(), ref[0].numpy(), rtol=1e-5, atol=HEAD_TOL)
            np.testing.assert_allclose(ent.numpy(), ref[1].numpy(), rtol=1e-5, atol=HEAD_TOL)


def test_lora_policy_and_its_reference():
    """A LoRAModel goes through PaddleNLP's forward (get_output_embeddings of the wrapped model): the adapters'
    gradients, and the reference (adapters disabled, no_grad), equal the unchunked ones."""
    model = lora.apply_lora(_qwen2(), rank=4, alpha=8)
    randomize_adapters(model, np.random.default_rng(0))
    assert type(model.get_output_embeddings()).__name__ == "Qwen2LMHead"
    ref = _run(causal.completion_logprobs, model, None)
    assert ref[2] and all("lora" in n for n in ref[2])
    for chunk in (1, 7, N * T + 4):
        _assert_same(_run(causal.completion_logprobs, model, chunk), ref)
    pid, pm, cid, cm = _batch()
    with lora.adapters_disabled(model), paddle.no_grad():
        base = causal.completion_logprobs(model, pid, pm, cid, cm, temperature=TEMPERATURE)[0]
        chunked = causal.completion_logprobs(model, pid, pm, cid, cm, temperature=TEMPERATURE, chunk_size=4)[0]
    np.testing.assert_allclose(chunked.numpy(), base.numpy(), rtol=1e-5, atol=HEAD_TOL)
    assert np.abs(base.numpy() - ref[0]).max() > 1e-3  # the adapters do change the policy


class _RecordingVocabParallel:
    """Stands in for parallel.VocabParallel with one rank (the shard is the whole vocabulary): records the call
    causal.py makes when chunking is on, and answers with lm_head's own chunked head."""

    def __init__(self):
        self.calls = []

    def chunked_logprobs_and_entropy(self, hidden, weight, labels, *, temperature, chunk_size, with_entropy,
                                     transpose_y):
        from paddle_grpo.policy.lm_head import chunked_logprobs_and_entropy

        self.calls.append((list(hidden.shape), weight, chunk_size, with_entropy, transpose_y, temperature))
        return chunked_logprobs_and_entropy(hidden, weight, labels, temperature=temperature, chunk_size=chunk_size,
                                            with_entropy=with_entropy, transpose_y=transpose_y)


@pytest.mark.parametrize("tie", [False, True])
def test_vocab_parallel_path_hands_the_shard_weight_to_the_parallel_chunked_head(tie):
    model = _qwen2(tie)
    ref = _run(causal.completion_logprobs, model, None)
    # As rank 0 of tp=2 sees it: its head holds half of the vocabulary (the recording stand-in reduces nothing).
    model.config.vocab_size *= 2
    vp = _RecordingVocabParallel()
    got = _run(lambda *a, **k: causal.completion_logprobs(*a, vocab_parallel=vp, **k), model, 4)
    _assert_same(got, ref)
    shape, weight, chunk, with_entropy, transpose_y, temperature = vp.calls[0]
    assert shape == [N, T, 32] and weight is model.lm_head.weight and chunk == 4 and with_entropy is True
    assert transpose_y == tie and temperature == TEMPERATURE
    pid, pm, cid, cm = _batch()
    _, ent = causal.completion_logprobs(model, pid, pm, cid, cm, with_entropy="detached", vocab_parallel=vp,
                                        chunk_size=4)
    assert ent.stop_gradient


def test_an_unsplit_head_is_not_reduced_as_a_vocabulary_shard():
    # PaddleNLP leaves the head whole when tensor_parallel_degree does not divide vocab_size (151,936 over 3 ranks):
    # the vocab-parallel reduction would then add log(tp) to every log-prob. The whole head's path is used instead.
    model = _qwen2(False)
    ref = _run(causal.completion_logprobs, model, None)
    vp = _RecordingVocabParallel()
    got = _run(lambda *a, **k: causal.completion_logprobs(*a, vocab_parallel=vp, **k), model, 4)
    _assert_same(got, ref)
    assert vp.calls == []
    assert not causal.head_is_vocab_sharded(model.lm_head, model.config.vocab_size)
    assert causal.head_is_vocab_sharded(model.lm_head, 2 * model.config.vocab_size)


# ------------------------------------------------------------------------------------------ seq2seq models


@pytest.mark.parametrize("arch, tie", [("t5", False), ("t5", True), ("bart", False)])
def test_seq2seq_chunked_equals_full_logits(arch, tie):
    """T5 (lm_head, or the tied embedding with T5's d_model ** -0.5 scaling) and BART (lm_head_weight plus
    final_logits_bias); also checks decoder_hidden + head against the model's own forward logits."""
    model = _seq2seq(arch, tie)
    model.eval()
    pid, pm, cid, cm = _batch()
    hidden, mask = seq2seq.encode(model, pid, pm)
    dec_in = paddle.concat([paddle.full([N, 1], seq2seq.decoder_start_id(model), "int64"), cid[:, :-1]], axis=1)
    with paddle.no_grad():
        seq_out, head = seq2seq.decoder_hidden(model, hidden, mask, dec_in)
        forward_logits, _ = seq2seq.decoder_logits(model, hidden, mask, dec_in)
    # one process, the same head's kernels on the same input
    np.testing.assert_array_equal(head(seq_out).numpy(), forward_logits.numpy())
    ref = _run(seq2seq.completion_logprobs, model, None)
    for chunk in (1, 3, 7, N * T + 4):
        _assert_same(_run(seq2seq.completion_logprobs, model, chunk), ref)


def test_seq2seq_family_without_a_known_head_uses_the_models_forward(monkeypatch, caplog):
    model = _seq2seq("bart")
    model.eval()
    ref = _run(seq2seq.completion_logprobs, model, None)
    monkeypatch.setattr(seq2seq, "decoder_hidden", lambda *args: None)
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.seq2seq"):
        got = _run(seq2seq.completion_logprobs, model, 4)
    assert any("full logits for BartForConditionalGeneration" in r.message for r in caplog.records)
    _assert_same(got, ref)


# ------------------------------------------------------------------------------------------ head_logprobs


# A head alone (_head_case): logits summed over 16 inputs ~N(0, 1) times weights <= 0.25 plus a bias, at
# temperature 1.3, then 11 classes: f32_sum_tol(16, 2, depth=2) + f32_sum_tol(11, 1) = 9e-6 for values, and gradients
# are sums of 11 or 14 such terms: atol 1e-5 plus rtol 1e-5.


def _head_case(head_fn, params, chunk, with_entropy=True):
    rng = np.random.default_rng(3)
    hidden = paddle.to_tensor(rng.normal(size=(2, 7, 16)).astype("float32"), stop_gradient=False)
    labels = paddle.to_tensor(rng.integers(0, 11, size=(2, 7)))
    lp, ent = head_logprobs(hidden, head_fn(), labels, temperature=1.3, with_entropy=with_entropy, chunk_size=chunk)
    (lp.sum() * 0.5 + ent.sum() * 0.3).backward()
    out = [lp.numpy(), ent.numpy(), hidden.grad.numpy()] + [p.grad.numpy().copy() for p in params]
    for p in params:
        p.clear_gradient()
    return out


def test_linear_head_with_a_trainable_bias():
    paddle.seed(4)
    head = paddle.nn.Linear(16, 11)
    head.bias.set_value(paddle.randn([11]))
    spec, why = lm_head_of(head)
    assert spec is not None and spec.bias is head.bias and not spec.transpose_y and why == ""
    ref = _head_case(lambda: head, [head.weight, head.bias], None)
    for chunk in (1, 4, 14, 20):
        for got, want in zip(_head_case(lambda: head, [head.weight, head.bias], chunk), ref):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # see _head_case


def test_lmhead_spec_with_a_frozen_bias_and_transposed_weight():
    paddle.seed(5)
    weight = paddle.create_parameter([11, 16], "float32")
    bias = paddle.randn([1, 11])  # a buffer, as BART's final_logits_bias
    ref = _head_case(lambda: LMHead(weight, True, bias), [weight], None)
    for chunk in (1, 5, 14):
        for got, want in zip(_head_case(lambda: LMHead(weight, True, bias), [weight], chunk), ref):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # see _head_case


def _lora_head():
    from paddlenlp.peft.lora.lora_layers import LoRALinear

    paddle.seed(6)
    head = LoRALinear(16, 11, r=3, lora_alpha=6)
    head.weight.stop_gradient = True
    head.lora_B.set_value(paddle.randn(head.lora_B.shape) * 0.3)
    return head


def test_lora_linear_head_uses_the_merged_weight_inside_autograd():
    head = _lora_head()
    params = [head.lora_A, head.lora_B, head.bias]
    ref = _head_case(lambda: head, params, None)
    for chunk in (1, 6, 14):
        for got, want in zip(_head_case(lambda: head, params, chunk), ref):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)  # see _head_case
    head.disable_lora = True
    assert lm_head_of(head)[0].weight is head.weight


def test_heads_that_cannot_be_chunked_fall_back_to_full_logits_with_one_warning(caplog):
    head = _lora_head()
    head.lora_dropout = paddle.nn.Dropout(p=0.5)
    head.eval()
    assert lm_head_of(head)[0] is not None  # dropout is off in eval
    head.train()
    spec, why = lm_head_of(head)
    assert spec is None and "dropout" in why
    rng = np.random.default_rng(0)
    hidden = paddle.to_tensor(rng.normal(size=(2, 3, 16)).astype("float32"))
    labels = paddle.to_tensor(rng.integers(0, 11, size=(2, 3)))
    results = []
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.lm_head"):
        for chunk in (2, 2, None):
            paddle.seed(0)  # the same dropout mask for each call
            results.append(head_logprobs(hidden, head, labels, chunk_size=chunk, with_entropy=True))
    warnings = [r.message for r in caplog.records if "full logits instead of the chunked LM head" in r.message]
    assert len(warnings) == 1 and "dropout" in warnings[0]
    for lp, ent in results[:2]:  # the fallback is the full path itself
        np.testing.assert_array_equal(lp.numpy(), results[2][0].numpy())
        np.testing.assert_array_equal(ent.numpy(), results[2][1].numpy())
    assert lm_head_of(paddle.nn.LayerNorm(16))[0] is None


# ------------------------------------------------------------------------------------------ config and policy


def test_config_keys():
    assert Config().lm_head_decision(V)[0] is None  # unset at a small vocabulary (the rule: test_head_default.py)
    cfg = config_from_dict({"use_fused_head_and_loss_fn": True})
    assert cfg.lm_head_decision(V)[0] == Config().fused_head_chunk_size == 512
    assert config_from_dict({"use_fused_head_and_loss_fn": True,
                             "fused_head_chunk_size": 3}).lm_head_decision(V)[0] == 3
    assert config_from_dict({"fused_head_chunk_size": 3}).lm_head_decision(V)[0] is None
    with pytest.raises(ConfigError, match="key 'fused_head_chunk_size' = 0: must be at least 1"):
        config_from_dict({"use_fused_head_and_loss_fn": True, "fused_head_chunk_size": 0})
    for key in ("use_fused_head_and_loss_fn", "fused_head_chunk_size"):
        assert key_effect(key, "cpu").active and key_effect(key, "gpu").active
    for device in ("cpu", "gpu"):  # no longer a precision/kernel key: never reported as not applied
        plan = precision_plan(cfg, device)
        assert "use_fused_head_and_loss_fn" not in dict(plan.not_applied)
        assert "use_fused_head_and_loss_fn" not in dict(plan.model_flags)


def test_load_policy_sets_the_chunk_size_and_logprobs_use_it(tiny_policy_dir):
    from paddle_grpo.policy import load_policy

    assert load_policy(tiny_policy_dir).head_chunk_size is None
    policy = load_policy(tiny_policy_dir, head_chunk_size=2)
    assert policy.head_chunk_size == 2
    calls = []
    original = causal.head_logprobs

    def spy(*args, **kwargs):
        calls.append(kwargs["chunk_size"])
        return original(*args, **kwargs)

    pid, pm, cid, cm = _batch()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(causal, "head_logprobs", spy)
        lp, _ = policy.logprobs(pid % 300, pm, cid % 300, cm, temperature=TEMPERATURE)
    assert calls == [2]
    ref, _ = causal.completion_logprobs(policy.model, pid % 300, pm, cid % 300, cm, temperature=TEMPERATURE)
    # the same transformer; the tiny policy's head: H = 64, V = 320
    np.testing.assert_allclose(lp.numpy(), ref.numpy(), rtol=1e-5,
                               atol=f32_sum_tol(64, 1.0 / TEMPERATURE, depth=2) + f32_sum_tol(320, 1.0))


# ------------------------------------------------------------------------------------------ one trainer step

REWARD = '''
def reward(prompts, completions, **kwargs):
    return [0.05 * len(c) + float("a" in c) for c in completions]
'''


@pytest.mark.parametrize("extra", [{"kl_loss_coeff": 0.05}, {"lora": True, "kl_loss_coeff": 0.05}])
def test_trainer_step_is_the_same_with_the_chunked_head(tiny_policy_dir, tmp_path, extra):
    """One `train_step` with use_fused_head_and_loss_fn true vs false: same rollout (generation does not use the
    head setting), same loss and metrics and parameters within float32 tolerance; the reference (a separate model,
    or the LoRA base) gets the setting too."""
    from paddle_grpo.trainer import Trainer

    (tmp_path / "rewards.py").write_text(REWARD)
    rows = [{"src": f"<|im_start|>user\nWho is {n}?<|im_end|>\n<|im_start|>assistant\n", "tgt": "x"}
            for n in ("Ann", "Bob", "Cid", "Dan")]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    results, befores = [], []
    for fused in (False, True):
        out = tmp_path / f"out{fused}"
        cfg = config_from_dict(dict(
            actor_model_name_or_path=tiny_policy_dir, use_rm_server=False,
            reward_funcs=f"{tmp_path / 'rewards.py'}:reward", train_datasets=str(tmp_path / "train.jsonl"),
            output_dir=str(out), logging_dir=str(out / "vdl"), max_prompt_len=32, max_dec_len=6, min_dec_len=1,
            max_length=40, global_batch_size=2, rollout_n=4, per_device_train_batch_size=8,
            per_device_logprob_batch_size=8, learning_rate=2e-3, max_steps=1, save_strategy="no",
            disable_tqdm=True, seed=7, temperature=0.9, use_fused_head_and_loss_fn=fused, fused_head_chunk_size=5,
            **extra))
        trainer = Trainer(cfg)
        assert trainer.policy.head_chunk_size == (5 if fused else None)
        if trainer.reference is not None:
            assert trainer.reference.head_chunk_size == trainer.policy.head_chunk_size
        befores.append({n: p.numpy().copy() for n, p in trainer.policy.model.named_parameters()})
        metrics = trainer.train_step()
        results.append((metrics, {n: p.numpy().copy() for n, p in trainer.policy.model.named_parameters()}))
    (m0, p0), (m1, p1) = results
    before = befores[0]
    assert all(np.array_equal(before[n], befores[1][n]) for n in before)  # the same start
    # The tiny policy (2 layers, hidden 64, vocab 320) on 8 rows of at most 40 positions: about 42 chained float32
    # sums forward and backward, the longest over 320 positions (numerics.f32_sum_tol). A metric that is a mean whose
    # terms (~1) cancel (the policy loss) is off by at most `cancel` absolutely.
    rel, cancel = f32_sum_tol(320, 1.0, depth=42), f32_sum_tol(320, 1.0)
    compared = [k for k in m0 if k.startswith(("train/", "response_length/")) and k != "train/lr"]
    assert {"train/policy_loss", "train/entropy", "train/kl_loss"} <= set(compared)
    for key in compared:
        np.testing.assert_allclose(m1[key], m0[key], rtol=rel, atol=cancel, err_msg=key)
    # One AdamW step of lr 2e-3 (LoRA: only the adapters move; the frozen weights must stay equal).
    trained = {n for n in p0 if np.abs(p0[n] - before[n]).max() > 0}
    assert trained and all(np.array_equal(p1[n], p0[n]) for n in set(p0) - trained)
    assert_adam_close({n: p0[n] for n in trained}, {n: p1[n] for n in trained}, before, lr=2e-3, steps=1, rel=rel)
