"""paddle_grpo/policy/lora.py: only adapters train, the reference is the base model exactly, adapters round-trip."""
import importlib.util
import json
import math
import os

import numpy as np
import paddle
import pytest
from numerics import tiny_lm_tol

from paddle_grpo.policy import lora as L
from paddle_grpo.policy.causal import completion_logprobs, load_causal_lm

TARGETS = [r".*\.q_proj", r".*\.v_proj", r".*\.down_proj"]


@pytest.fixture
def paddlenlp_forward(monkeypatch):
    """Plain Qwen2 models may take the lean forward of fast_decoder.py (equal up to float rounding), a LoRAModel
    never does; bit-for-bit comparisons between the two need the same forward: PaddleNLP's."""
    monkeypatch.setenv("PADDLE_GRPO_FAST", "0")


@pytest.fixture(scope="module")
def batch(tiny_policy_dir):
    """Left-padded prompts and right-padded completions of random tokens (ids below the vocabulary size)."""
    vocab = load_causal_lm(tiny_policy_dir, trainable=False).config.vocab_size
    rng = np.random.default_rng(0)
    pid = rng.integers(3, vocab, size=(4, 9))
    pm = np.ones_like(pid)
    pm[1, :3] = 0
    pm[3, :6] = 0
    cid = rng.integers(3, vocab, size=(4, 7))
    cm = np.ones_like(cid)
    cm[2, 4:] = 0
    return [paddle.to_tensor(a, dtype="int64") for a in (pid, pm, cid, cm)]


def logprobs(model, batch):
    with paddle.no_grad():
        return completion_logprobs(model, *batch)[0].numpy()


def randomize_adapters(model, seed=1, scale=0.2):
    """Give every lora_A/lora_B random values (LoRA starts with B = 0, which would make many checks vacuous)."""
    rng = np.random.default_rng(seed)
    with paddle.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.set_value(paddle.to_tensor(rng.normal(0, scale, size=p.shape).astype("float32")))


def base_snapshot(model):
    return {n: p.numpy().copy() for n, p in model.named_parameters() if "lora_" not in n}


# ------------------------------------------------------------------------------------------------ training

def test_only_adapters_have_gradients_and_change(tiny_policy_dir, batch):
    model = L.apply_lora(load_causal_lm(tiny_policy_dir), rank=4, alpha=8, dropout=0.0, target_modules=TARGETS)
    trainable = {n for n, p in model.named_parameters() if not p.stop_gradient}
    layers = L.lora_layers(model)
    assert len(layers) == 3 * model.config.num_hidden_layers
    assert trainable == {f"model.{name}.{ab}" for name in layers for ab in ("lora_A", "lora_B")}
    expected = sum(4 * (layer.weight.shape[0] + layer.weight.shape[1]) for layer in layers.values())
    trainable_count, total = L.parameter_counts(model)
    assert trainable_count == expected and total > 10 * expected
    assert [p.name for p in L.trainable_parameters(model)] == [p.name for n, p in model.named_parameters()
                                                              if n in trainable]

    before_base, before = base_snapshot(model), {n: p.numpy().copy() for n, p in model.named_parameters()}
    # All parameters and a large weight decay, as the trainer's AdamW today: stop_gradient alone must protect W.
    opt = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters(), weight_decay=0.5)
    model.train()
    for step in range(2):
        lp = completion_logprobs(model, *batch)[0]
        (-(lp * batch[3].astype("float32")).sum()).backward()
        with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
        assert with_grad == trainable
        assert all(float(paddle.abs(p.grad).sum()) > 0 for n, p in model.named_parameters()
                   if n.endswith("lora_B"))
        opt.step()
        opt.clear_grad()
    after_base = base_snapshot(model)
    assert after_base.keys() == before_base.keys()
    for name in before_base:
        np.testing.assert_array_equal(after_base[name], before_base[name], err_msg=name)
    for name in trainable:  # B moves at step 1; A once B != 0 (step 2)
        assert not np.array_equal(model.state_dict()[name].numpy(), before[name]), name


def test_lora_at_init_equals_base_model_exactly(tiny_policy_dir, batch, paddlenlp_forward):
    model = load_causal_lm(tiny_policy_dir)
    model.eval()
    base = logprobs(model, batch)
    wrapped = L.apply_lora(model, rank=8, alpha=16, dropout=0.0)
    wrapped.eval()
    assert all(float(paddle.abs(layer.lora_A).sum()) > 0 and float(paddle.abs(layer.lora_B).sum()) == 0
               for layer in L.lora_layers(wrapped).values())
    np.testing.assert_array_equal(logprobs(wrapped, batch), base)


def test_default_targets_cover_qwen2_projections(tiny_policy_dir):
    model = L.apply_lora(load_causal_lm(tiny_policy_dir), rank=2, alpha=4, dropout=0.0)
    kinds = {name.rsplit(".", 1)[-1] for name in L.lora_layers(model)}
    assert kinds == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert len(L.lora_layers(model)) == 7 * model.config.num_hidden_layers
    assert model.lora_config.target_modules == [p for p in L.DEFAULT_TARGET_MODULES
                                                if "fused" not in p and "qkv" not in p]


# ----------------------------------------------------------------------------------------------- reference

def test_adapters_disabled_is_the_base_model_exactly(tiny_policy_dir, batch, paddlenlp_forward):
    model = load_causal_lm(tiny_policy_dir)
    model.eval()
    base = logprobs(model, batch)
    wrapped = L.apply_lora(model, rank=4, alpha=8, dropout=0.5, target_modules=TARGETS)
    randomize_adapters(wrapped)
    wrapped.train()  # as during the update; the context must switch dropout off and restore train mode after
    with L.adapters_disabled(wrapped) as ref:
        assert ref is wrapped and not wrapped.training
        np.testing.assert_array_equal(logprobs(ref, batch), base)
        np.testing.assert_array_equal(logprobs(ref, batch), base)
    assert wrapped.training and all(layer.training and not layer.disable_lora
                                    for layer in L.lora_layers(wrapped).values())
    wrapped.eval()
    adapted = logprobs(wrapped, batch)
    assert np.abs(adapted - base).max() > 1e-3  # the adapters are back on and do matter


def test_adapters_disabled_restores_after_an_exception_and_refuses_merged(tiny_policy_dir):
    wrapped = L.apply_lora(load_causal_lm(tiny_policy_dir), rank=2, alpha=4, dropout=0.0, target_modules=TARGETS)
    with pytest.raises(RuntimeError, match="boom"):
        with L.adapters_disabled(wrapped):
            raise RuntimeError("boom")
    assert wrapped.training and not any(layer.disable_lora for layer in L.lora_layers(wrapped).values())
    wrapped.merge()
    with pytest.raises(L.LoRAError, match="merged"):
        with L.adapters_disabled(wrapped):
            pass
    with pytest.raises(L.LoRAError, match="no LoRA layers"):
        with L.adapters_disabled(load_causal_lm(tiny_policy_dir)):
            pass


# ------------------------------------------------------------------------------------------------ save/load

def test_save_load_round_trip(tiny_policy_dir, batch, tmp_path):
    from paddlenlp.peft import LoRAModel

    wrapped = L.apply_lora(load_causal_lm(tiny_policy_dir), rank=4, alpha=8, dropout=0.1, target_modules=TARGETS,
                           base_model_name_or_path=tiny_policy_dir)
    randomize_adapters(wrapped)
    wrapped.eval()
    expected = logprobs(wrapped, batch)
    out = str(tmp_path / "adapters")
    L.save_adapters(wrapped, out)
    assert sorted(os.listdir(out)) == ["config.json", L.ADAPTER_CONFIG, L.ADAPTER_WEIGHTS]
    saved = paddle.load(os.path.join(out, L.ADAPTER_WEIGHTS), return_numpy=True)
    assert saved and all(".lora_A" in k or ".lora_B" in k for k in saved)  # adapters only
    with open(os.path.join(out, L.ADAPTER_CONFIG)) as f:
        config = json.load(f)
    assert (config["r"], config["lora_alpha"], config["lora_dropout"], config["target_modules"]) == \
        (4, 8, 0.1, TARGETS)
    assert config["base_model_name_or_path"] == os.path.abspath(tiny_policy_dir)

    # into a plain base model (settings from the file) ...
    loaded = L.load_adapters(load_causal_lm(tiny_policy_dir), out)
    loaded.eval()
    np.testing.assert_array_equal(logprobs(loaded, batch), expected)
    # ... into a model that already has (different, fresh) adapters: resuming
    fresh = L.apply_lora(load_causal_lm(tiny_policy_dir), rank=4, alpha=8, dropout=0.1, target_modules=TARGETS)
    assert L.load_adapters(fresh, out) is fresh
    fresh.eval()
    np.testing.assert_array_equal(logprobs(fresh, batch), expected)
    # ... and with paddlenlp.peft's own loader: the format is PaddleNLP's
    theirs = LoRAModel.from_pretrained(load_causal_lm(tiny_policy_dir), out)
    theirs.eval()
    np.testing.assert_array_equal(logprobs(theirs, batch), expected)


def test_load_refuses_mismatched_adapters(tiny_policy_dir, tmp_path):
    out = str(tmp_path / "adapters")
    L.save_adapters(L.apply_lora(load_causal_lm(tiny_policy_dir), rank=4, alpha=8, dropout=0.0,
                                 target_modules=TARGETS), out)
    other_rank = L.apply_lora(load_causal_lm(tiny_policy_dir), rank=2, alpha=8, dropout=0.0, target_modules=TARGETS)
    with pytest.raises(L.LoRAError, match=r"r = 4, the model's are 2"):
        L.load_adapters(other_rank, out)

    state = paddle.load(os.path.join(out, L.ADAPTER_WEIGHTS), return_numpy=True)
    dropped = next(iter(state))
    paddle.save({k: v for k, v in state.items() if k != dropped}, os.path.join(out, L.ADAPTER_WEIGHTS))
    with pytest.raises(L.LoRAError, match=r"missing \['" + dropped.replace(".", r"\.")):
        L.load_adapters(load_causal_lm(tiny_policy_dir), out)

    os.remove(os.path.join(out, L.ADAPTER_WEIGHTS))
    with pytest.raises(L.LoRAError, match="no lora_model_state.pdparams"):
        L.load_adapters(load_causal_lm(tiny_policy_dir), out)
    with pytest.raises(L.LoRAError, match="not a LoRA adapter directory"):
        L.load_adapters(load_causal_lm(tiny_policy_dir), tiny_policy_dir)


# -------------------------------------------------------------------------------------------------- errors

@pytest.mark.parametrize("targets,message", [
    ([r".*\.qproj"], r"'\.\*\\\.qproj' matches no module of Qwen2ForCausalLM .*linear layers of this model: "
                     r"qwen2\.layers\.N\.mlp\.down_proj, .*qwen2\.layers\.N\.self_attn\.q_proj"),
    ([r".*\.q_proj", "q_proj"], r"'q_proj' matches no module .*whole dotted name"),
    ([r".*self_attn"], r"matches qwen2\.layers\.0\.self_attn \(Qwen2Attention\), which is not a linear layer"),
    ([r".*self_attn.*"], r"not a linear layer \(LoRA adapts linear layers only; anchor the pattern"),
    ([r".*lm_head"], r"matches lm_head \(Qwen2LMHead\), which is not a linear layer"),
    (["(q_proj"], r"'\(q_proj' is not a valid regular expression"),
])
def test_bad_target_modules_are_named(tiny_policy_dir, targets, message):
    model = load_causal_lm(tiny_policy_dir)
    with pytest.raises(L.LoRAError, match=message):
        L.apply_lora(model, rank=4, alpha=8, dropout=0.0, target_modules=targets)
    assert not L.lora_layers(model)  # nothing was replaced before the error


@pytest.mark.parametrize("kwargs,message", [
    (dict(rank=0), "lora_rank must be a positive integer"),
    (dict(rank=2.5), "lora_rank must be a positive integer"),
    (dict(alpha=0), "lora_alpha must be positive"),
    (dict(dropout=1.0), r"lora_dropout must be in \[0, 1\)"),
])
def test_bad_settings_are_named(tiny_policy_dir, kwargs, message):
    settings = {**dict(rank=4, alpha=8, dropout=0.0), **kwargs}
    with pytest.raises(L.LoRAError, match=message):
        L.apply_lora(load_causal_lm(tiny_policy_dir), **settings)


# ----------------------------------------------------------------------------------------------- recompute

def test_recompute_gives_the_same_adapter_gradients(tiny_policy_dir, batch):
    """PaddleNLP recomputes a decoder layer only when its input needs a gradient; apply_lora makes the (frozen)
    embedding's output need one, so the first layer is recomputed too, and the gradients must equal those without
    recompute."""
    grads = []
    for recompute in (False, True):
        paddle.seed(0)
        model = L.apply_lora(load_causal_lm(tiny_policy_dir, recompute=recompute), rank=4, alpha=8, dropout=0.0,
                             target_modules=TARGETS)
        randomize_adapters(model)
        model.train()
        embedded = model.get_input_embeddings()(batch[0])
        assert model.config.recompute == recompute
        lp = completion_logprobs(model, *batch)[0]
        (-(lp * batch[3].astype("float32")).sum()).backward()
        grads.append({n: p.grad.numpy() for n, p in model.named_parameters() if p.grad is not None})
        # the first decoder layer's input: without the hook it needs no gradient and that layer is not recomputed
        assert embedded.stop_gradient != recompute
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        # recompute reruns the same kernels on the same inputs in one process: equal in practice (test_recompute.py)
        np.testing.assert_allclose(grads[1][name], grads[0][name], rtol=1e-4, atol=1e-6, err_msg=name)


# ------------------------------------------------------------------------------------------ in the trainer

def _trainer_has_lora():
    from paddle_grpo.config import FIELDS

    return "lora" in FIELDS


needs_wiring = pytest.mark.skipif(not _trainer_has_lora(), reason="the config has no 'lora' key yet: "
                                  "paddle_grpo/policy/lora.py is not wired into config/ and trainer.py")

REWARD = '''
def letter_reward(prompts, completions, **kwargs):
    return [sum(ch in "aeiou" for ch in c) / max(1, len(c)) for c in completions]
'''


def lora_cfg(tmp_path, tiny_policy_dir, out, **overrides):
    from paddle_grpo.config import config_from_dict

    (tmp_path / "rewards.py").write_text(REWARD)
    rows = [{"src": f"<|im_start|>user\nName {i}?<|im_end|>\n<|im_start|>assistant\n", "tgt": ""} for i in range(8)]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    values = dict(actor_model_name_or_path=tiny_policy_dir, use_rm_server=False,
                  reward_funcs=f"{tmp_path / 'rewards.py'}:letter_reward", train_datasets=str(tmp_path / "train.jsonl"),
                  output_dir=str(out), logging_dir=str(out / "vdl"), max_prompt_len=32, max_dec_len=6, min_dec_len=1,
                  max_length=40, global_batch_size=2, rollout_n=4, per_device_train_batch_size=8,
                  per_device_logprob_batch_size=8, learning_rate=2e-2, max_steps=2, kl_coeff=0.05,
                  kl_loss_coeff=0.05, save_strategy="steps", save_steps=10, disable_tqdm=True, seed=3,
                  temperature=1.0, lora=True, lora_rank=4, lora_alpha=8, target_modules=TARGETS)
    values.update(overrides)
    return config_from_dict(values)


@pytest.fixture
def load_merge_tool(repo_root):
    spec = importlib.util.spec_from_file_location("_merge_lora_for_test_lora",
                                                  repo_root / "tools" / "models" / "merge_lora.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@needs_wiring
def test_trainer_trains_adapters_only_with_the_base_as_reference(tiny_policy_dir, tmp_path, load_merge_tool):
    from paddlenlp.transformers import AutoModelForCausalLM

    from paddle_grpo.trainer import Trainer

    trainer = Trainer(lora_cfg(tmp_path, tiny_policy_dir, tmp_path / "out"))
    assert trainer.reference is None and L.is_lora_model(trainer.policy.model)
    assert {id(p) for p in trainer.learner.optimizer._parameter_list} == \
        {id(p) for p in L.trainable_parameters(trainer.policy.model)}
    base, adapters = base_snapshot(trainer.policy.model), {n: p.numpy().copy() for n, p in trainer.policy.model.named_parameters()
                                                    if "lora_" in n}
    metrics = trainer.train()
    assert math.isfinite(metrics["train/kl"]) and math.isfinite(metrics["train/kl_loss"])
    after = base_snapshot(trainer.policy.model)
    assert all(np.array_equal(after[n], base[n]) for n in base)
    assert all(not np.array_equal(trainer.policy.model.state_dict()[n].numpy(), v) for n, v in adapters.items()
               if n.endswith("lora_B"))
    with open(tmp_path / "out" / "metrics.jsonl") as f:
        first, second = (json.loads(line) for line in f)
    # step 1: B = 0 adds exact zeros, so the policy that sampled is the reference function; the two passes differ
    # only by rounding, whose mean over the tokens (random signs, ~sqrt(n) u each) is far below 1e-4
    assert abs(first["train/kl"]) < 1e-4
    assert second["train/kl"] > 1e-5      # step 2: the adapters moved the policy away from the base model

    ckpt = tmp_path / "out" / "checkpoint-2"
    files = set(os.listdir(ckpt))
    assert {L.ADAPTER_WEIGHTS, L.ADAPTER_CONFIG} <= files and "model_state.pdparams" not in files
    merged_dir = tmp_path / "merged"
    assert load_merge_tool.main(["--adapters", str(ckpt), "--out", str(merged_dir)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(merged_dir))
    merged.eval()
    trainer.policy.model.eval()
    ids = paddle.to_tensor([[5, 9, 17, 33, 65, 7]], dtype="int64")
    with paddle.no_grad():
        np.testing.assert_allclose(merged(input_ids=ids, return_dict=True).logits.numpy(),
                                   trainer.policy.model(input_ids=ids, return_dict=True).logits.numpy(),
                                   atol=tiny_lm_tol(128, 2, 0))  # merged weights: see test_hub.py


@needs_wiring
def test_trainer_resumes_lora_runs_exactly(tiny_policy_dir, tmp_path):
    from resume_helpers import full_and_resumed

    full, resumed = full_and_resumed(lambda out, **kw: lora_cfg(tmp_path, tiny_policy_dir, out, **kw), tmp_path, 1,
                                     max_steps=3, save_steps=1, ignore_save_lr_and_optim=False)
    a, b = ({n: p.numpy() for n, p in t.policy.model.named_parameters()} for t in (full, resumed))
    assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)


@needs_wiring
def test_grpo_lora_config_loads(repo_root):
    from paddle_grpo.config import load_config

    cfg = load_config(str(repo_root / "configs" / "grpo_lora.yaml"), warn=False)
    assert cfg.lora and cfg.lora_rank == 8 and cfg.lora_alpha_value == 16
    # PaddleNLP's GRPO values: kl_coeff 0.001 has no effect on grpo and kl_loss_coeff is 0, so no reference is needed
    assert cfg.kl_coeff == 0.001 and cfg.kl_loss_coeff == 0 and not cfg.needs_reference_model
    assert cfg.target_modules == list(L.DEFAULT_TARGET_MODULES[:4]) + list(L.DEFAULT_TARGET_MODULES[5:8])
