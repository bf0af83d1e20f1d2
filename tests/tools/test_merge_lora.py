"""tools/models/merge_lora.py: the merged model loads with AutoModelForCausalLM and computes what base + adapters
did."""
import json
import os

import numpy as np
import paddle
import pytest

from lora_helpers import randomize_adapters
from numerics import tiny_lm_tol
from paddle_grpo.policy import lora as L
from paddle_grpo.policy.causal import load_causal_lm


@pytest.fixture(scope="module")
def merge(load_tool):
    return load_tool("models/merge_lora")


@pytest.fixture(scope="module")
def trained_adapters(tiny_policy_dir, tmp_path_factory):
    """Adapters with random (non-zero) A and B on attention and MLP layers, saved; plus their logits."""
    model = L.apply_lora(load_causal_lm(tiny_policy_dir), rank=4, alpha=8, dropout=0.0,
                         base_model_name_or_path=tiny_policy_dir)
    rng = np.random.default_rng(3)
    randomize_adapters(model, rng)
    ids = paddle.to_tensor(rng.integers(3, model.config.vocab_size, size=(3, 12)), dtype="int64")
    with paddle.no_grad():
        logits = model(input_ids=ids, return_dict=True).logits.numpy()
    out = str(tmp_path_factory.mktemp("adapters"))
    L.save_adapters(model, out)
    return out, ids, logits


@pytest.mark.numerics
def test_merged_model_matches_lora_model(merge, tiny_policy_dir, trained_adapters, tmp_path, capsys):
    from paddlenlp.transformers import AutoModelForCausalLM, AutoTokenizer

    adapters, ids, lora_logits = trained_adapters
    out = str(tmp_path / "merged")
    assert merge.main(["--base", tiny_policy_dir, "--adapters", adapters, "--out", out]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    # x W + s (x A) B against x (W + s A B): each merged weight rounded once more and every sum of the forward over
    # other terms; conftest's tiny policy (hidden 64, intermediate 128, 2 layers): tests/numerics.py's bound for logits
    logit_tol = tiny_lm_tol(128, 2, 0)  # 3.1e-4
    assert report["r"] == 4 and report["check_max_abs_logit_diff"] < logit_tol

    merged = AutoModelForCausalLM.from_pretrained(out)
    merged.eval()
    base = AutoModelForCausalLM.from_pretrained(tiny_policy_dir)
    base.eval()
    assert set(merged.state_dict()) == set(base.state_dict())  # a plain model: no lora_* and nothing extra
    with paddle.no_grad():
        merged_logits = merged(input_ids=ids, return_dict=True).logits.numpy()
        base_logits = base(input_ids=ids, return_dict=True).logits.numpy()
    np.testing.assert_allclose(merged_logits, lora_logits, rtol=0, atol=logit_tol)
    assert np.abs(base_logits - lora_logits).max() > 1e-2  # the adapters do change the model
    assert AutoTokenizer.from_pretrained(out)("hello")["input_ids"] == \
        AutoTokenizer.from_pretrained(tiny_policy_dir)("hello")["input_ids"]
    with open(os.path.join(out, "merge_info.json")) as f:
        info = json.load(f)
    assert info["scaling"] == 2.0 and info["base_model"] == os.path.abspath(tiny_policy_dir)


def test_base_defaults_to_the_recorded_path(merge, trained_adapters, tmp_path):
    adapters, ids, lora_logits = trained_adapters
    out = str(tmp_path / "merged")
    assert merge.main(["--adapters", adapters, "--out", out, "--no-check"]) == 0
    merged = load_causal_lm(out, trainable=False)
    with paddle.no_grad():
        np.testing.assert_allclose(merged(input_ids=ids, return_dict=True).logits.numpy(), lora_logits,
                                   atol=tiny_lm_tol(128, 2, 0))  # as above


def test_errors_are_reported_not_raised(merge, tiny_policy_dir, trained_adapters, tmp_path, capsys):
    assert merge.main(["--adapters", tiny_policy_dir, "--out", str(tmp_path / "x")]) == 2
    assert "is not a LoRA adapter directory" in capsys.readouterr().err
    adapters = trained_adapters[0]
    assert merge.main(["--adapters", adapters, "--base", str(tmp_path / "nope"), "--out", str(tmp_path / "y")]) == 2
    assert "base model directory" in capsys.readouterr().err
    assert merge.main(["--adapters", adapters, "--out", adapters]) == 2
    assert "--out must be a new directory" in capsys.readouterr().err
