"""The lean decoder path (paddle_grpo/policy/fast_decoder.py) against PaddleNLP's own `Qwen2ForCausalLM.forward` and
`LlamaForCausalLM.forward`, and its switch (`refusal`: what it accepts, and the reason for everything else).

Every comparison runs the same model object twice: once with the fast path and once with `PADDLE_GRPO_FAST=0`
(PaddleNLP's forward; the straightforward code that tests/policy/test_causal.py and tests/rollout/ check against
unpadded full forwards and naive loops). Float32 tolerances, derived (tests/numerics.py): the two paths sum in other
orders, so log-probs, entropies and logits agree within LP_TOL absolutely (tiny_lm_tol of make_model's sizes), and
gradients within GRAD_TOL of each parameter's largest gradient (the backward is as deep again); greedy and
key-sampled generations must be identical token for token (a flip would need a rounding-sized tie).

Both families are built tiny and random with grouped-query attention: Qwen2 8 query / 2 key-value heads with random
q/k/v biases; Llama 4 / 2 heads (no biases), rope_theta 100,000 and rms_norm_eps 1e-5 (SmolLM2's values, not the
defaults 10,000 and 1e-6, so that reading either from the config is observable), tied and untied embeddings.
"""
import numpy as np
import paddle
import pytest
from batch_helpers import grouped_batch
from fast_decoder_helpers import V, make_model
from numerics import tiny_lm_tol
from paddlenlp.transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from paddle_grpo.policy import fast_decoder
from paddle_grpo.policy.causal import completion_logprobs, decoder_path, generate
from paddle_grpo.rollout.sampling import row_keys

pytestmark = pytest.mark.numerics  # compares float results: CI reruns it on other CPU kernels

LP_TOL = tiny_lm_tol(160, 2, V)  # 3.9e-4: make_model's sizes (intermediate 160 the longest sum, 2 layers)
GRAD_TOL = 2 * LP_TOL
FAMILIES = ["qwen2", "llama"]


def batch_of(**kwargs):
    """`grouped_batch` (tests/batch_helpers.py) over this file's vocabulary."""
    return grouped_batch(V, **kwargs)


def both_paths(monkeypatch, fn, expect_fast=True, only_fast=False):
    """(fn() with the fast path, fn() with PaddleNLP's forward). Checks that the first run did build the lean forward
    (else a refused model would compare PaddleNLP's forward with itself) and the second did not. `only_fast`:
    (fn() with the fast path, None)."""
    built = []
    original = fast_decoder.FastDecoder.__init__

    def counting(self, model):
        built.append(type(model).__name__)
        original(self, model)

    monkeypatch.setattr(fast_decoder.FastDecoder, "__init__", counting)
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, "1")
    fast = fn()
    assert bool(built) == expect_fast, built
    if only_fast:
        return fast, None
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, "0")
    slow = fn()
    assert bool(built) == expect_fast, built  # nothing more built
    monkeypatch.delenv(fast_decoder.ENV_SWITCH)
    monkeypatch.setattr(fast_decoder.FastDecoder, "__init__", original)
    return fast, slow


# ------------------------------------------------------------------------------------------------ the switch

def test_accepts_both_families_and_says_so():
    for family in FAMILIES:
        for tied in (False, True):
            model = make_model(family, tie_word_embeddings=tied)
            assert fast_decoder.refusal(model) is None, (family, tied)
            assert decoder_path(model) == f"decoder: fast path ({family})"
    # SmolLM2's config.json spells out fields PaddleNLP's LlamaConfig does not read; at these values they say what
    # the model computes, so the fast path still applies.
    smol = make_model("llama", tie_word_embeddings=True, head_dim=16, attention_bias=False, mlp_bias=False,
                      rope_scaling=None, hidden_act="silu", attention_dropout=0.0, pretraining_tp=1)
    assert decoder_path(smol) == "decoder: fast path (llama)"
    assert decoder_path(make_model("qwen2", attention_bias=True)) == "decoder: fast path (qwen2)"


# SmolLM2-135M-Instruct's config.json (the Llama this path is for next), as published.
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "head_dim": 64, "hidden_act": "silu", "hidden_size": 576,
    "initializer_range": 0.041666666666666664, "intermediate_size": 1536, "is_llama_config": True,
    "max_position_embeddings": 8192, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 9,
    "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_interleaved": False, "rope_scaling": None, "rope_theta": 100000, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "transformers_version": "4.42.3", "use_cache": True, "vocab_size": 49152,
}


def test_smollm2s_config_takes_the_fast_path(tmp_path):
    """Its config.json read by PaddleNLP (AutoConfig), one layer built (the fields are per model, not per layer):
    every field it spells out is one the lean path implements at that value."""
    import json

    from paddlenlp.transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    config = AutoConfig.from_pretrained(str(tmp_path))
    config.num_hidden_layers = 1
    paddle.seed(0)
    model = LlamaForCausalLM(config)
    assert model.lm_head.transpose_y and model.llama.layers[0].self_attn.rotary_emb.base == 100000
    assert decoder_path(model) == "decoder: fast path (llama)"


# config field -> (value, the reason's text): set on a built model, where the check reads them (the model's layers
# are as PaddleNLP built them; the field says something this path does not implement).
REFUSED_FIELDS = {
    "tensor_parallel_degree": (2, "tensor_parallel_degree is 2"),
    "context_parallel_degree": (2, "context_parallel_degree is 2"),
    "sep_parallel_degree": (2, "sep_parallel_degree is 2"),
    "sequence_parallel": (True, "sequence_parallel is True"),
    "fuse_attention_qkv": (True, "fuse_attention_qkv is True"),
    "fuse_attention_ffn": (True, "fuse_attention_ffn is True"),
    "refined_recompute": ({"mlp_row_ln": 1}, "refined_recompute is {'mlp_row_ln': 1}"),
    "use_flash_attention": (True, "use_flash_attention is set"),
    "use_fused_rms_norm": (True, "use_fused_rms_norm is set"),
    "use_fused_rope": (True, "use_fused_rope is set"),
    "use_flash_attention_for_generation": (True, "use_flash_attention_for_generation is set"),
    "alibi": (True, "alibi is True"),
    "use_long_sequence_strategies": (True, "use_long_sequence_strategies is True"),
    "use_sliding_window": (True, "use_sliding_window is True"),
    "mlp_bias": (True, "mlp_bias is True"),
    "rope_scaling": ({"rope_type": "llama3", "factor": 8.0}, "rope_scaling is {'rope_type': 'llama3', 'factor': 8.0}"),
    "rope_scaling_type": ("linear", "rope_scaling_type is 'linear'"),
    "hidden_act": ("gelu", "hidden_act is 'gelu' (SiLU only)"),
    "attention_dropout": (0.1, "attention_dropout is 0.1"),
    "head_dim": (32, "head_dim is 32, not hidden_size / num_attention_heads"),
    "rope_interleaved": (True, "rope_interleaved is True"),
}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("field", list(REFUSED_FIELDS))
def test_each_refused_config_field_gives_its_reason(family, field):
    model = make_model(family, num_hidden_layers=1)
    value, reason = REFUSED_FIELDS[field]
    setattr(model.config, field, value)
    assert not fast_decoder.enabled_for(model)
    assert reason in fast_decoder.refusal(model)
    assert decoder_path(model).startswith(f"decoder: PaddleNLP's forward ({reason}")


def test_refused_models_and_layers_give_their_reason(monkeypatch):
    from paddlenlp.peft import LoRAConfig, LoRAModel
    from paddlenlp.transformers import LlamaModel, Qwen2Model

    model = make_model("llama", num_hidden_layers=1)
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, "0")
    assert fast_decoder.refusal(model) == "PADDLE_GRPO_FAST=0"
    monkeypatch.delenv(fast_decoder.ENV_SWITCH)
    # Llama has no q/k/v biases in PaddleNLP: a config asking for them would have its bias weights dropped.
    model.config.attention_bias = True
    assert fast_decoder.refusal(model) == "attention_bias is True"
    model.config.attention_bias = False
    qwen = make_model("qwen2", num_hidden_layers=1)
    qwen.config.attention_bias = False  # Qwen2's layers have them: the field contradicts the model
    assert fast_decoder.refusal(qwen) == "attention_bias is False"
    # Another class, a subclass (exact type only), the bare decoder, a LoRA wrapper and the model inside it
    assert fast_decoder.refusal(Qwen2Model(qwen.config)).startswith("Qwen2Model is not a class it implements")
    assert fast_decoder.refusal(type("MyLlama", (LlamaForCausalLM,), {})(model.config)).startswith("MyLlama is not")
    assert fast_decoder.refusal(LlamaModel(model.config)).startswith("LlamaModel is not")
    lora = LoRAModel(model, LoRAConfig(target_modules=[".*q_proj"], r=2, lora_alpha=4))
    assert fast_decoder.refusal(lora).startswith("LoRA adapters (LoRAModel)")
    assert fast_decoder.refusal(lora.model) == "layer 0 q_proj is LoRALinear, not a plain nn.Linear"
    # A bias PaddleNLP's builder would not make, on one projection only
    llama = make_model("llama", num_hidden_layers=1)
    o = llama.llama.layers[0].self_attn.o_proj
    o.bias = o.create_parameter([o.weight.shape[1]], is_bias=True)
    assert fast_decoder.refusal(llama) == "layer 0 o_proj has a bias"
    k = qwen.qwen2.layers[0].self_attn.k_proj
    k.bias = None
    assert fast_decoder.refusal(qwen) == "layer 0 has a bias on some of q/k/v_proj only"
    # Rope scaling built into the model (PaddleNLP's other rotary classes)
    scaled = make_model("llama", num_hidden_layers=1, rope_scaling_type="ntk", rope_scaling_factor=2.0)
    assert fast_decoder.refusal(scaled).startswith("the rotary embedding is LlamaNTKScalingRotaryEmbedding")
    # Low precision and AMP
    half = make_model("llama", num_hidden_layers=1)
    half.to(dtype="bfloat16")
    assert fast_decoder.refusal(half) == "the parameters are bfloat16 (float32 only)"
    with paddle.amp.auto_cast(True, level="O1", dtype="bfloat16"):
        if paddle.amp.is_autocast_enabled():  # paddle builds without CPU autocast keep it off
            assert fast_decoder.refusal(make_model("llama", num_hidden_layers=1)) == "an autocast (AMP) is active"


def test_a_refused_model_computes_paddlenlps_numbers(monkeypatch):
    """Refused means PaddleNLP's forward, not something else: with NTK rope scaling (which the fast path does not
    implement) the lean forward is never built, and log-probs and generations equal PADDLE_GRPO_FAST=0's bit for
    bit (the same code)."""
    scaled = make_model("llama", rope_scaling_type="ntk", rope_scaling_factor=4.0)
    scaled.eval()
    batch = batch_of()

    def never(*args, **kwargs):
        raise AssertionError("the lean forward was built for a refused model")

    monkeypatch.setattr(fast_decoder.FastDecoder, "__init__", never)

    def run():
        with paddle.no_grad():
            lp = completion_logprobs(scaled, *batch)[0].numpy()
        r = generate(scaled, batch[0][::4], batch[1][::4], max_new_tokens=4, eos_token_ids=[1], do_sample=False)
        return lp, r.completion_ids.numpy()

    (lp_f, ids_f), (lp_s, ids_s) = both_paths(monkeypatch, run, expect_fast=False)
    np.testing.assert_array_equal(lp_f, lp_s)
    np.testing.assert_array_equal(ids_f, ids_s)


def test_unique_rows_finds_groups():
    ids = np.array([[0, 5, 6], [0, 5, 6], [7, 8, 9], [0, 5, 6], [1, 5, 6]])
    mask = np.array([[0, 1, 1], [0, 1, 1], [1, 1, 1], [0, 1, 1], [0, 1, 1]])
    rows, first = fast_decoder.unique_rows(ids, mask)
    assert rows.tolist() == [0, 0, 1, 0, 2] and first.tolist() == [0, 2, 4]
    mask[1, 0] = 1  # same ids, different mask: a different prompt
    rows, _ = fast_decoder.unique_rows(ids, mask)
    assert rows.tolist() == [0, 1, 2, 0, 3]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("T", [6, 1])
@pytest.mark.parametrize("tied", [False, True])
def test_logprobs_and_entropy_match_paddlenlp(monkeypatch, T, tied, family):
    model = make_model(family, tie_word_embeddings=tied)
    model.eval()
    batch = batch_of(T=T)

    def run():
        with paddle.no_grad():
            lp, ent = completion_logprobs(model, *batch, temperature=0.7, with_entropy=True)
        return lp.numpy(), ent.numpy()

    (lp_f, ent_f), (lp_s, ent_s) = both_paths(monkeypatch, run)
    m = batch[3].numpy().astype(bool)
    np.testing.assert_allclose(lp_f[m], lp_s[m], atol=LP_TOL)
    np.testing.assert_allclose(ent_f[m], ent_s[m], atol=LP_TOL)


def logprob_gradients(model, batch, seed):
    """A run for `both_paths`: (log-probs, {parameter: gradient}) of sum(lp * weights * mask) + 0.1 sum(entropy *
    mask), weights N(0, 1) from `seed`."""
    weights = paddle.to_tensor(np.random.default_rng(seed).standard_normal(batch[2].shape).astype("float32"))

    def run():
        for p in model.parameters():
            p.clear_gradient(False)
        lp, ent = completion_logprobs(model, *batch, temperature=0.9, with_entropy=True)
        m = batch[3].astype("float32")
        ((lp * weights * m).sum() + 0.1 * (ent * m).sum()).backward()
        return lp.numpy(), {n: p.grad.numpy().copy() for n, p in model.named_parameters()}

    return run


def assert_gradients_close(model, fast, slow):
    """Every parameter has a nonzero gradient on PaddleNLP's path and the fast path's is within GRAD_TOL of its
    largest element."""
    assert fast.keys() == slow.keys() and len(fast) == len(list(model.parameters()))
    for name in slow:
        scale = np.abs(slow[name]).max()
        assert scale > 0, name
        np.testing.assert_allclose(fast[name], slow[name], atol=GRAD_TOL * scale, err_msg=name)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tied", [False, True])
def test_gradients_match_paddlenlp(monkeypatch, family, tied):
    model = make_model(family, tie_word_embeddings=tied)
    model.train()
    (_, fast), (_, slow) = both_paths(monkeypatch, logprob_gradients(model, batch_of(), seed=1))
    assert_gradients_close(model, fast, slow)


def test_key_padding_reaches_paddles_fast_softmax_width():
    fast = fast_decoder.SOFTMAX_FAST_KEYS
    assert [fast_decoder.key_padding(k) for k in (1, fast_decoder.PAD_KEYS_FROM - 1, fast_decoder.PAD_KEYS_FROM,
                                                  fast - 1, fast, fast + 1)] == [
        0, 0, fast - fast_decoder.PAD_KEYS_FROM, 1, 0, 0]


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_keys_change_nothing(monkeypatch, family):
    """Key axes of PAD_KEYS_FROM keys or more are padded with masked keys up to SOFTMAX_FAST_KEYS (paddle's faster
    softmax). Forced here on every attention of the tiny batch: log-probs and gradients still equal PaddleNLP's,
    and every attention did run over the padded width."""
    monkeypatch.setattr(fast_decoder, "PAD_KEYS_FROM", 1)
    widths = []
    attend = fast_decoder.FastDecoder.attend

    def spy(self, q, k, v, bias):
        widths.append((k.shape[2], v.shape[2], bias.shape[-1]))
        return attend(self, q, k, v, bias)

    monkeypatch.setattr(fast_decoder.FastDecoder, "attend", spy)
    model = make_model(family)
    model.train()
    batch = batch_of()
    (lp_f, fast), (lp_s, slow) = both_paths(monkeypatch, logprob_gradients(model, batch, seed=2))
    width = fast_decoder.SOFTMAX_FAST_KEYS
    assert widths and set(widths) == {(width, width, width)}, widths  # prompt and completion attentions, padded
    m = batch[3].numpy().astype(bool)
    np.testing.assert_allclose(lp_f[m], lp_s[m], atol=LP_TOL)
    assert_gradients_close(model, fast, slow)


@pytest.mark.parametrize("family", FAMILIES)
def test_positions_beyond_the_rope_cache(monkeypatch, family):
    """Sequences longer than max_position_embeddings: the lean path extends the RoPE table. PaddleNLP's Qwen2 does
    too; PaddleNLP's Llama slices its table at max_position_embeddings (NaN log-probs there on this CPU), so for
    Llama the reference is PaddleNLP's forward of the same weights with a table long enough."""
    model = make_model(family, max_position_embeddings=8)
    model.eval()
    batch = batch_of(L=7, T=6)

    def run(m):
        with paddle.no_grad():
            return completion_logprobs(m, *batch)[0].numpy()

    if family == "llama":
        # PaddleNLP's own Llama forward past its table is not run at all: what it does there depends on the kernel
        # (NaN on one run, a gather index error after other tests set paddle's flags), and it is not the reference.
        fast, _ = both_paths(monkeypatch, lambda: run(model), only_fast=True)
        monkeypatch.setenv(fast_decoder.ENV_SWITCH, "0")
        slow = run(make_model(family, max_position_embeddings=64))  # same seed: the same weights
    else:
        fast, slow = both_paths(monkeypatch, lambda: run(model))
    m = batch[3].numpy().astype(bool)
    assert np.isfinite(fast[m]).all()
    np.testing.assert_allclose(fast[m], slow[m], atol=LP_TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_logits_match_full_forward(family):
    """Prefill + cached decode steps give the logits of a full forward over the whole sequence."""
    model = make_model(family)
    model.eval()
    pid, pm, cid, _ = batch_of(P=2, G=3, T=5)
    fast = fast_decoder.FastDecoder(model)
    with paddle.no_grad():
        steps = [fast.start_decoding(pid[::3], pm[::3], 3, 5)]
        for t in range(4):
            steps.append(fast.decode(cid[:, t]))
        full = model(input_ids=paddle.concat([pid, cid], 1), attention_mask=paddle.concat([pm, paddle.ones_like(cid)],
                                                                                            1),
                     position_ids=paddle.clip(paddle.cumsum(paddle.concat([pm, paddle.ones_like(cid)], 1), -1) - 1,
                                              min=0), return_dict=True).logits.numpy()
    L = pid.shape[1]
    for t, logits in enumerate(steps):
        np.testing.assert_allclose(logits.numpy(), full[:, L - 1 + t], atol=LP_TOL)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("penalty,min_new", [(1.0, 0), (1.3, 4)])
def test_greedy_generations_identical(monkeypatch, penalty, min_new, family):
    model = make_model(family)
    pid, pm, _, _ = batch_of(G=1)
    first = generate(model, pid, pm, max_new_tokens=6, eos_token_ids=[1], do_sample=False).completion_ids.numpy()
    eos = [int(first[0, 3])]  # row 0 meets it at its 4th token (and others maybe elsewhere): EOS handling is tested

    def run():
        r = generate(model, pid, pm, num_samples=2, max_new_tokens=10, min_new_tokens=min_new, eos_token_ids=eos,
                     do_sample=False, repetition_penalty=penalty, max_num_seqs=4)
        return r.completion_ids.numpy(), r.lengths, r.sample_logprobs.numpy()

    (ids_f, len_f, lp_f), (ids_s, len_s, lp_s) = both_paths(monkeypatch, run)
    assert (ids_f == ids_s).all() and (len_f == len_s).all()
    np.testing.assert_allclose(lp_f, lp_s, atol=LP_TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_keyed_sampling_identical(monkeypatch, family):
    """With counter-based row keys both paths draw the same tokens (float rounding could flip a draw only when a
    uniform lands within ~1e-6 of a CDF boundary; it does not happen for this seed)."""
    model = make_model(family)
    pid, pm, _, _ = batch_of(G=1)
    keys = row_keys(seed=3, step=0, rows=np.arange(3 * 4))

    def run():
        r = generate(model, pid, pm, num_samples=4, max_new_tokens=12, eos_token_ids=[2], temperature=0.8,
                     top_p=0.9, row_keys=keys)
        return r.completion_ids.numpy(), r.sample_logprobs.numpy()

    (ids_f, lp_f), (ids_s, lp_s) = both_paths(monkeypatch, run)
    assert (ids_f == ids_s).all()
    np.testing.assert_allclose(lp_f, lp_s, atol=LP_TOL)


@pytest.mark.parametrize("family", FAMILIES)
def test_updated_weights_still_load_with_paddlenlp(tmp_path, family):
    """The fast path trains PaddleNLP's own parameters: a checkpoint saved after an update loads with
    AutoModelForCausalLM and gives the same log-probs."""
    model = make_model(family)
    model.train()
    batch = batch_of()
    opt = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters())
    lp, _ = completion_logprobs(model, *batch)
    (lp * batch[3].astype("float32")).sum().backward()
    opt.step()
    model.save_pretrained(str(tmp_path))
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype="float32")
    loaded.eval()
    model.eval()
    with paddle.no_grad():
        a = completion_logprobs(model, *batch)[0].numpy()
        b = completion_logprobs(loaded, *batch)[0].numpy()
    np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------------------------------------------ LoRA, critic

def test_llama_lora_merged_into_the_weights_runs_the_fast_path_with_the_lora_models_numbers(monkeypatch):
    """A LoRA-wrapped Llama runs PaddleNLP's forward (its LoRALinear layers); with its adapters merged into the
    weights (W + scaling A B) it is a plain LlamaForCausalLM again, on the lean path, with the same log-probs; and
    with its adapters disabled it computes the base model, which the lean path computes from an identical copy."""
    from paddle_grpo.policy.lora import adapters_disabled, apply_lora, merge_adapters

    batch = batch_of()
    m = batch[3].numpy().astype(bool)

    def logprobs(model):
        with paddle.no_grad():
            return completion_logprobs(model, *batch, temperature=0.8)[0].numpy()

    base = make_model("llama", tie_word_embeddings=True)
    base.eval()
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, "1")
    base_fast = logprobs(base)
    lora = apply_lora(make_model("llama", tie_word_embeddings=True), rank=2, alpha=4)  # same seed: base's weights
    lora.eval()
    with paddle.no_grad():  # B is 0 at init (the base model): random B so that the adapters change the numbers
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.set_value(paddle.randn(p.shape) * 0.2)
    assert fast_decoder.refusal(lora).startswith("LoRA adapters")
    with adapters_disabled(lora):
        disabled = logprobs(lora)
    np.testing.assert_allclose(disabled[m], base_fast[m], atol=LP_TOL)
    with_adapters = logprobs(lora)  # PaddleNLP's forward through the LoRA layers
    merged = merge_adapters(lora)
    assert type(merged) is LlamaForCausalLM and fast_decoder.enabled_for(merged)
    merged_fast = logprobs(merged)
    # the adapters matter (well above rounding), and merging them into W changes nothing beyond rounding: the
    # merged product adds one rank-2 sum per weight to LP_TOL's sums
    assert np.abs(with_adapters[m] - base_fast[m]).max() > 10 * LP_TOL
    np.testing.assert_allclose(merged_fast[m], with_adapters[m], atol=LP_TOL)


def test_llama_critic_value_model_runs_the_fast_path(monkeypatch):
    """The critic of a Llama (a ValueModel: LlamaModel + value head, PaddleNLP 3.0.0b4 has no Llama sequence
    classifier) on the lean path: values and every gradient equal PaddleNLP's forward's."""
    from paddle_grpo.policy.critic import CAUSAL_LM, Critic
    from paddle_grpo.policy.value_model import ValueModel, new_head

    model = make_model("llama")
    w = np.random.default_rng(4).normal(size=(64, 1)).astype("float32") / 8.0  # |value| ~ 1
    value_model = ValueModel(model.llama, new_head(64, weight=w))
    critic = Critic(value_model, value_model.llama, value_model.score, CAUSAL_LM)
    assert fast_decoder.describe(value_model) == "decoder: fast path (llama)"
    batch = batch_of()
    coeff = paddle.to_tensor(np.random.default_rng(5).normal(size=batch[3].shape).astype("float32"))
    coeff = coeff * batch[3].astype("float32")

    def run():
        for p in value_model.parameters():
            p.clear_gradient(False)
        values = critic.values(*batch)
        (values * coeff).sum().backward()
        return values.numpy(), {n: p.grad.numpy().copy() for n, p in value_model.named_parameters()}

    (fast, fast_grads), (slow, slow_grads) = both_paths(monkeypatch, run)
    m = batch[3].numpy().astype(bool)
    # a value is the final hidden state (each element within LP_TOL relative to its size, at most hidden_max)
    # weighted by the head: within LP_TOL * hidden_max * sum|w|
    with paddle.no_grad():
        hidden_max = float(paddle.abs(value_model.llama(input_ids=paddle.concat([batch[0], batch[2]], 1),
                                                        return_dict=True).last_hidden_state).max())
    np.testing.assert_allclose(fast[m], slow[m], atol=LP_TOL * hidden_max * np.abs(w).sum())
    for name in slow_grads:
        scale = np.abs(slow_grads[name]).max()
        assert scale > 0, name
        np.testing.assert_allclose(fast_grads[name], slow_grads[name], atol=GRAD_TOL * scale, err_msg=name)


@pytest.mark.parametrize("granularity", ["full", "full_attn", "core_attn"])
@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non_reentrant"])
def test_llama_recompute_leaves_gradients_unchanged(monkeypatch, granularity, reentrant):
    """Recompute on the lean path for Llama, whose attention sub-block has no q/k/v bias (None goes through paddle's
    recompute): the same loss and gradients as without (no dropout: the rerun computes the same values; rtol 1e-6,
    as tests/policy/test_recompute.py asserts for Qwen2), and the layers really are rerun."""
    from paddle_grpo.parallel import recompute

    batch = batch_of()

    def loss_and_grads(model):
        model.train()
        lp, _ = completion_logprobs(model, *batch, temperature=0.9)
        loss = (lp * batch[3].astype("float32")).sum()
        loss.backward()
        return float(loss), {n: p.grad.numpy() for n, p in model.named_parameters()}

    monkeypatch.setenv(fast_decoder.ENV_SWITCH, "1")
    loss0, grads0 = loss_and_grads(make_model("llama"))
    model = make_model("llama")
    model.config.recompute, model.config.recompute_granularity = True, granularity
    model.config.recompute_use_reentrant = reentrant
    assert fast_decoder.enabled_for(model) and fast_decoder.recompute_granularity(model) == granularity
    calls = []
    original = recompute.checkpoint
    monkeypatch.setattr(fast_decoder, "checkpoint", lambda *a, **k: calls.append(1) or original(*a, **k))
    loss1, grads1 = loss_and_grads(model)
    assert len(calls) >= model.config.num_hidden_layers  # per layer; core_attn: per prompt and completion block
    assert loss1 == pytest.approx(loss0, rel=1e-6)
    for name in grads0:
        np.testing.assert_allclose(grads1[name], grads0[name], rtol=1e-6, atol=1e-9, err_msg=name)
