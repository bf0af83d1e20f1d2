"""The Policy interface (paddle_grpo/policy/base.py, load.py): `load_policy` picks the class from the model's config,
and every method gives exactly what the module functions it stands for give (same numbers, bit for bit)."""
import os

import numpy as np
import paddle
import pytest

from paddle_grpo import rollout
from paddle_grpo.policy import (CausalPolicy, Policy, Seq2SeqPolicy, is_encoder_decoder, load_policy,
                                policy_class)
from paddle_grpo.policy import causal, lora, seq2seq
from paddle_grpo.recipes.seq2seq import build_tiny_seq2seq
from paddle_grpo.rollout.sampling import row_keys

CORPUS = ["summarize: The Ostley Guild found a new snail near Morholm.", "A new snail was found.",
          "summarize: On Tuesday the Harriers won the cup, beating Vellmouth 5 to 1."] * 5


@pytest.fixture(scope="module")
def seq2seq_dirs(tmp_path_factory):
    """{"t5": directory, "bart": directory} of tiny random encoder-decoders."""
    dirs = {}
    for arch in ("t5", "bart"):
        dirs[arch] = str(tmp_path_factory.mktemp(f"policy_{arch}"))
        build_tiny_seq2seq(dirs[arch], CORPUS, arch=arch, vocab_size=300, d_model=32, ffn_dim=64, num_heads=4, seed=3)
    return dirs


@pytest.fixture(params=["t5", "bart"])
def seq2seq_dir(request, seq2seq_dirs):
    return seq2seq_dirs[request.param]


@pytest.fixture(params=["causal", "t5", "bart"])
def model_dir(request, tiny_policy_dir, seq2seq_dirs):
    return tiny_policy_dir if request.param == "causal" else seq2seq_dirs[request.param]


def _batch(vocab, seed=0):
    """Left-padded prompts [4, 6] (rows 0/1 and 2/3 equal: groups of G = 2), right-padded completions [4, 5]."""
    rng = np.random.default_rng(seed)
    prompt = np.repeat(rng.integers(3, vocab, size=(2, 6)), 2, axis=0)
    prompt_mask = np.ones_like(prompt)
    prompt_mask[2:, :2] = 0
    completion = rng.integers(3, vocab, size=(4, 5))
    completion_mask = (np.arange(5)[None] < np.array([[5], [2], [4], [1]])).astype(np.int64)
    return [paddle.to_tensor(a, dtype="int64") for a in (prompt, prompt_mask, completion, completion_mask)]


def _module(policy):
    """The module whose functions the policy's class stands for."""
    return seq2seq if policy.is_encoder_decoder else causal


# ------------------------------------------------------------------------------------------------------ loading

def test_load_policy_picks_the_class_from_the_config(tiny_policy_dir, seq2seq_dir):
    causal_policy, s2s_policy = load_policy(tiny_policy_dir), load_policy(seq2seq_dir)
    assert type(causal_policy) is CausalPolicy and not causal_policy.is_encoder_decoder
    assert type(s2s_policy) is Seq2SeqPolicy and s2s_policy.is_encoder_decoder
    assert isinstance(causal_policy, Policy) and isinstance(s2s_policy, Policy)
    assert type(causal_policy.model).__name__ == "Qwen2ForCausalLM"
    assert type(s2s_policy.model).__name__ in ("T5ForConditionalGeneration", "BartForConditionalGeneration")
    assert policy_class(tiny_policy_dir) is CausalPolicy and policy_class(seq2seq_dir) is Seq2SeqPolicy
    assert is_encoder_decoder(s2s_policy.model) and not is_encoder_decoder(causal_policy.model)
    assert causal_policy.model.training and not any(p.stop_gradient for p in causal_policy.model.parameters())


def test_load_policy_forwards_the_loading_options(tiny_policy_dir, seq2seq_dir, tmp_path):
    for path in (tiny_policy_dir, seq2seq_dir):
        frozen = load_policy(path, trainable=False)
        assert not frozen.model.training and all(p.stop_gradient for p in frozen.model.parameters())
    with pytest.raises(NotImplementedError, match="tensor_parallel_degree"):
        load_policy(seq2seq_dir, tensor_parallel_degree=2)
    with pytest.raises(FileNotFoundError, match="is not a local model directory"):
        load_policy(str(tmp_path / "nope"))


def test_prompt_token_ids(tiny_policy_dir, seq2seq_dir):
    class Wrapping:  # a tokenizer that adds special tokens around a sequence (as T5's and BART's do)
        def build_inputs_with_special_tokens(self, ids, pair):
            return [1] + list(ids) + [2]

    ids = [7, 8, 9]
    assert load_policy(tiny_policy_dir).prompt_token_ids(Wrapping(), ids) == [7, 8, 9]
    assert load_policy(seq2seq_dir).prompt_token_ids(Wrapping(), ids) == [1, 7, 8, 9, 2]


# ------------------------------------------------------------------------------------- the same numbers, exactly

@pytest.mark.parametrize("with_entropy", [False, True])
def test_logprobs_equal_the_module_function(model_dir, with_entropy):
    policy = load_policy(model_dir)
    batch = _batch(policy.model.config.vocab_size)
    lp, ent = policy.logprobs(*batch, temperature=0.7, with_entropy=with_entropy)
    want_lp, want_ent = _module(policy).completion_logprobs(policy.model, *batch, temperature=0.7,
                                                            with_entropy=with_entropy)
    assert lp.shape == [4, 5] and not lp.stop_gradient  # differentiable: the update pass uses it
    np.testing.assert_array_equal(lp.numpy(), want_lp.numpy())
    if with_entropy:
        np.testing.assert_array_equal(ent.numpy(), want_ent.numpy())
    else:
        assert ent is None and want_ent is None


def test_generate_equals_the_module_function(model_dir):
    policy = load_policy(model_dir, trainable=False)
    prompt, prompt_mask = _batch(policy.model.config.vocab_size)[:2]
    eos = int(policy.model.config.eos_token_id)
    kwargs = dict(num_samples=3, max_new_tokens=6, min_new_tokens=1, eos_token_ids=[eos], pad_token_id=0,
                  temperature=0.9, top_p=0.95, repetition_penalty=1.1, row_keys=row_keys(4, 0, np.arange(12)))
    got = policy.generate(prompt, prompt_mask, **kwargs)
    generate = seq2seq.generate if policy.is_encoder_decoder else causal.generate
    want = generate(policy.model, prompt, prompt_mask, **kwargs)
    assert isinstance(got, rollout.Rollout) and got.completion_ids.shape[0] == 12
    for field in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "sample_logprobs"):
        np.testing.assert_array_equal(getattr(got, field).numpy(), getattr(want, field).numpy())
    np.testing.assert_array_equal(got.lengths, want.lengths)


# --------------------------------------------------------------------------------------------------------- LoRA

def _logprobs(policy, batch):
    with paddle.no_grad():
        return policy.logprobs(*batch)[0].numpy()


def test_lora_through_the_policy(tiny_policy_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_GRPO_FAST", "0")  # a LoRAModel runs PaddleNLP's forward; compare like with like
    base = load_policy(tiny_policy_dir, trainable=False)
    batch = _batch(base.model.config.vocab_size)
    policy = load_policy(tiny_policy_dir)
    assert [id(p) for p in policy.trainable_parameters()] == [id(p) for p in policy.model.parameters()]  # all train
    plain = policy.model
    policy.apply_lora(4, 8, 0.0, [r".*\.q_proj", r".*\.v_proj"], base_model_name_or_path=tiny_policy_dir)
    assert lora.is_lora_model(policy.model) and policy.model.model is plain
    trainable = policy.trainable_parameters()
    names = {id(p): n for n, p in policy.model.named_parameters()}
    assert trainable and all("lora_" in names[id(p)] for p in trainable)
    assert len(trainable) == 2 * 2 * plain.config.num_hidden_layers  # A and B of q_proj and v_proj per layer
    with paddle.no_grad():  # B starts at 0 (adapted == base); a non-zero B makes the checks below meaningful
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.set_value(paddle.full(p.shape, 0.05, dtype=p.dtype))
    adapted = _logprobs(policy, batch)
    assert not np.array_equal(adapted, _logprobs(base, batch))
    with policy.adapters_disabled():
        np.testing.assert_array_equal(_logprobs(policy, batch), _logprobs(base, batch))
    np.testing.assert_array_equal(_logprobs(policy, batch), adapted)  # adapters back on after the context

    out = policy.save(str(tmp_path / "adapters"))
    assert sorted(f for f in os.listdir(out) if f.startswith("lora_")) == [lora.ADAPTER_CONFIG, lora.ADAPTER_WEIGHTS]
    fresh = load_policy(tiny_policy_dir)
    fresh.load_adapters(out)
    assert lora.is_lora_model(fresh.model)
    np.testing.assert_array_equal(_logprobs(fresh, batch), adapted)


def test_save_writes_a_model_load_policy_reads(seq2seq_dir, tmp_path):
    policy = load_policy(seq2seq_dir)
    with paddle.no_grad():
        for p in policy.model.parameters():
            p.set_value(p * 1.5)  # differs from the directory it came from
    batch = _batch(policy.model.config.vocab_size)
    out = policy.save(str(tmp_path / "saved"))
    reloaded = load_policy(out)
    assert type(reloaded) is Seq2SeqPolicy
    np.testing.assert_array_equal(_logprobs(reloaded, batch), _logprobs(policy, batch))
