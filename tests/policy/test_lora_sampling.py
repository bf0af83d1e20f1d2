"""LoRA sampling on the lean decoder path (fast_decoder.sampling_decoder): a LoRAModel's rollout decodes with merged
copies W' = W + scaling * A @ B of its adapted projections (lora.merged_weight), against PaddleNLP's own LoRA forward
(PaddleNLPStepper: LoRALinear computes x W + scaling * (x A) B) on the same tokens; its parameters untouched; the
refusal naming what cannot be merged. The trainer-level check (a rollout after an optimizer step uses the new
adapters) is in test_fast_decoder_startup.py.

Adapters: PaddleNLP initialises B to 0 (the adapters would change nothing), so B is drawn from N(0, B_STD) and A kept
at its Kaiming-uniform init (|A| <= 1 / sqrt(in)): with R = 4 and scaling 2 the delta's entries have about 1.4x the
std of the base weights (0.02), so the adapters change the logits by far more than rounding.

Tolerance (tests/numerics.py): the two sides compute each projection in other orders. PaddleNLP sums D terms for x W
and chains two sums (D, then R terms) and an add for the adapter; the lean side rounds each W' entry once more (an
R-term sum and an add) and then sums D terms. To first order a projection's result is therefore within
f32_sum_tol(D + R + 1) of the other, with magnitude sum |x| |W'|: about twice the base model's ~1 (W' ~1.4x to 1.75x
the std of W, see above), taken as 2. Through the decoder's 9 chained sums per layer and 2 for the final norm and
head (the depth test_decode_engine.py's LOGIT_TOL uses) the logits agree within LOGIT_TOL below (7.9e-4).
"""
import numpy as np
import paddle
import pytest
from fast_decoder_helpers import V, make_model
from numerics import f32_sum_tol
from paddlenlp.peft import LoRAConfig, LoRAModel
from paddlenlp.peft.lora import LoRALinear

from paddle_grpo.policy import fast_decoder
from paddle_grpo.policy.causal import FastDecoderStepper, PaddleNLPStepper, decoder_path, generate, stepper_for
from paddle_grpo.policy.lora import adapters_disabled, apply_lora, lora_layers, merge_refusal
from paddle_grpo.rollout.sampling import row_keys

pytestmark = pytest.mark.numerics

LAYERS, R, ALPHA, B_STD = 2, 4, 8.0, 0.1
LOGIT_TOL = f32_sum_tol(160 + R + 1, 2.0, depth=9 * LAYERS + 2)
ALL = None  # apply_lora's default: every projection
# (family, target modules, rslora): Llama with every projection adapted; Qwen2 (q/k/v biases) with a subset, so
# plain nn.Linear projections sit beside LoRALinear ones; rsLoRA (scaling alpha / sqrt(r)) through LoRAConfig.
CASES = [("llama", ALL, False), ("qwen2", [r".*\.q_proj", r".*\.v_proj", r".*\.down_proj"], False),
         ("qwen2", [r".*\.k_proj", r".*\.o_proj", r".*\.up_proj"], True)]


def lora_model(family, targets=ALL, rslora=False, seed=0):
    """make_model(family) wrapped in LoRA adapters of rank R with random B (N(0, B_STD)), in eval mode."""
    model = make_model(family)
    if rslora:
        lora = LoRAModel(model, LoRAConfig(target_modules=targets, r=R, lora_alpha=ALPHA, rslora=True))
    else:
        lora = apply_lora(model, rank=R, alpha=ALPHA, target_modules=targets)
    rng = np.random.default_rng(seed)
    with paddle.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.set_value(paddle.to_tensor(rng.normal(0, B_STD, size=p.shape).astype("float32")))
    lora.eval()
    return lora


def prompts(P=3, L=7, seed=3):
    """[P, L] left-padded prompt ids and mask (paddle), rows with 0, 2 and 3 pads."""
    rng = np.random.default_rng(seed)
    mask = np.ones((P, L), dtype=np.int64)
    mask[1, :2] = 0
    mask[2, :3] = 0
    return paddle.to_tensor(np.where(mask == 1, rng.integers(3, V, size=(P, L)), 0)), paddle.to_tensor(mask)


def decode_logits(stepper, tokens, ids, mask, G):
    """Prefill `ids`/`mask` for G rows each, then feed `tokens` [N, T] one step at a time (None: greedy from the
    stepper's own logits). Returns (logits [T + 1, N, V], tokens [N, T])."""
    T = 6 if tokens is None else tokens.shape[1]
    with paddle.no_grad():
        out = [stepper.start(ids, mask, G, T).numpy()]
        fed = []
        for t in range(T):
            token = np.argmax(out[-1], -1) if tokens is None else tokens[:, t]
            fed.append(token)
            out.append(stepper.step(paddle.to_tensor(token, dtype="int64")).numpy())
    return np.stack(out), np.stack(fed, 1)


@pytest.mark.parametrize("engine", [True, False], ids=["decode_engine", "fast_decoder"])
@pytest.mark.parametrize("family,targets,rslora", CASES)
def test_merged_lean_logits_equal_paddlenlps_lora_forward(monkeypatch, family, targets, rslora, engine):
    """Greedy decoding with the merged lean stepper (through the CPU decode engine, or FastDecoder.decode with the
    engine off), then PaddleNLP's LoRA forward on the same tokens: the logits agree within LOGIT_TOL at every step,
    and differ from the base model's (adapters disabled) by far more (an adapter ignored, or merged with the wrong
    scaling or layout, fails here)."""
    if not engine:
        monkeypatch.setenv("PADDLE_GRPO_DECODE_ENGINE", "0")
    model = lora_model(family, targets, rslora)
    assert fast_decoder.sampling_refusal(model) is None and stepper_for(model) is FastDecoderStepper
    ids, mask = prompts()
    lean = FastDecoderStepper(model)
    got, tokens = decode_logits(lean, None, ids, mask, G=2)
    assert (lean.engine is not None) == engine
    want, _ = decode_logits(PaddleNLPStepper(model), tokens, ids, mask, G=2)
    with adapters_disabled(model):
        base, _ = decode_logits(PaddleNLPStepper(model), tokens, ids, mask, G=2)
    diff = np.abs(got - want).max()
    assert diff <= LOGIT_TOL, (diff, LOGIT_TOL)
    assert np.abs(base - want).max() > 100 * LOGIT_TOL, np.abs(base - want).max()


@pytest.mark.parametrize("family,targets,rslora", CASES[:2])
def test_keyed_lora_samples_equal_paddlenlps(monkeypatch, family, targets, rslora):
    """`generate` with counter-based row keys: the merged lean path (default) and PaddleNLP's LoRA forward
    (PADDLE_GRPO_FAST=0) draw the same tokens (a draw flips only when a uniform lands within rounding of a CDF
    boundary; not for these seeds), with the same sample log-probs within LOGIT_TOL plus the log-softmax's
    2 * V * u (tests/numerics.py)."""
    model = lora_model(family, targets, rslora)
    ids, mask = prompts()
    keys = row_keys(seed=5, step=0, rows=np.arange(3 * 4))

    def run():
        r = generate(model, ids, mask, num_samples=4, max_new_tokens=10, eos_token_ids=[2], temperature=0.9,
                     row_keys=keys)
        return r.completion_ids.numpy(), r.sample_logprobs.numpy()

    lean_ids, lean_lp = run()
    monkeypatch.setenv(fast_decoder.ENV_SWITCH, "0")
    assert stepper_for(model) is PaddleNLPStepper
    ref_ids, ref_lp = run()
    assert (lean_ids == ref_ids).all()
    np.testing.assert_allclose(lean_lp, ref_lp, atol=LOGIT_TOL + 2 * V * 2.0 ** -24)


def test_a_rollout_leaves_every_parameter_and_switch_as_it_was():
    """Sampling reads the adapters and base weights only: every parameter bit for bit, its stop_gradient flag, the
    LoRA layers' merged / disable_lora switches and the train mode are unchanged by a rollout (with gradients on
    outside it, as in the trainer)."""
    model = lora_model("llama")
    model.train()
    before = {n: p.numpy().copy() for n, p in model.named_parameters()}
    frozen = {n: p.stop_gradient for n, p in model.named_parameters()}
    ids, mask = prompts()
    r = generate(model, ids, mask, num_samples=2, max_new_tokens=6, eos_token_ids=[2],
                 row_keys=row_keys(seed=1, step=0, rows=np.arange(6)))
    assert r.completion_ids.shape[0] == 6 and model.training
    for n, p in model.named_parameters():
        assert np.array_equal(p.numpy(), before[n]), n
        assert p.stop_gradient == frozen[n], n
    assert all(not layer.merged and not layer.disable_lora for layer in lora_layers(model).values())


def test_merged_weights_follow_the_adapters_and_their_switches():
    """sampling_decoder reads the adapters when it is built: new adapter values give new merged weights (W + s A B,
    against numpy in float64: each entry one R-term sum and an add, within (R + 1) * u of its magnitude), and
    inside adapters_disabled it decodes the base model's own weights (no copy)."""
    model = lora_model("llama")
    layer = model.model.llama.layers[1].self_attn.o_proj
    first = fast_decoder.sampling_decoder(model).layers[1]["wo"].numpy()
    with paddle.no_grad():
        layer.lora_B.set_value(layer.lora_B * 3.0)
    second = fast_decoder.sampling_decoder(model).layers[1]["wo"].numpy()
    W, A, B = (t.numpy().astype(np.float64) for t in (layer.weight, layer.lora_A, layer.lora_B))
    want = W + (A @ B) * (ALPHA / R)
    tol = 2 * (R + 1) * 2.0 ** -24 * (np.abs(W) + (np.abs(A) @ np.abs(B)) * (ALPHA / R))
    assert (np.abs(second - want) <= tol).all()
    assert np.abs(second - first).max() > 1000 * tol.max()  # not the stale merge
    with adapters_disabled(model):
        assert fast_decoder.sampling_decoder(model).layers[1]["wo"] is layer.weight


def test_refusal_names_what_cannot_be_merged():
    """A LoRA layer the merge does not implement (another LoRA class, MoRA), or an adapter outside the projections
    the lean path reads, keeps PaddleNLP's forward, and the start-up line says which layer and why."""

    class OtherLoRALinear(LoRALinear):
        pass

    model = lora_model("llama")
    assert fast_decoder.describe(model) == (
        "decoder: sampling on the fast path (llama) with the LoRA adapters merged (W + scaling * A @ B, once per "
        "rollout); log-probs and updates on PaddleNLP's forward (its LoRA layers)")
    assert fast_decoder.refusal(model) == fast_decoder.LORA_REFUSAL  # log-probs keep PaddleNLP's forward
    attn = model.model.llama.layers[0].self_attn
    attn.q_proj.__class__ = OtherLoRALinear
    why = ("LoRA adapters (LoRAModel): llama.layers.0.self_attn.q_proj is OtherLoRALinear (adapters are merged "
           "from a plain LoRALinear only)")
    assert fast_decoder.sampling_refusal(model) == why
    assert fast_decoder.describe(model) == f"decoder: PaddleNLP's forward ({why})"
    assert stepper_for(model) is PaddleNLPStepper
    assert decoder_path(model, "float32") == f"decoder: PaddleNLP's forward ({why})"
    with pytest.raises(ValueError, match="OtherLoRALinear"):
        stepper_for(model, "bfloat16")
    attn.q_proj.__class__ = LoRALinear
    assert fast_decoder.sampling_refusal(model) is None

    mora = LoRAModel(make_model("llama"), LoRAConfig(target_modules=[r".*\.v_proj"], r=R, lora_alpha=ALPHA,
                                                     use_mora=True))
    assert merge_refusal(mora) == "llama.layers.0.self_attn.v_proj uses use_mora (not W + scaling * A @ B)"
    assert fast_decoder.sampling_refusal(mora).endswith("uses use_mora (not W + scaling * A @ B)")

    model.model.llama.extra = LoRALinear(64, 64, r=R, lora_alpha=ALPHA)  # adapted, but never read by the lean path
    assert fast_decoder.sampling_refusal(model) == (
        "LoRA adapters (LoRAModel): llama.extra is adapted, which the lean path does not read")
