"""Safetensors written by PyTorch (transformers' save_pretrained: torch's names and layout, metadata format "pt")
load in a real run (policy/hf_weights.py): converted once into PaddleNLP's layout in a cache under PPNLP_HOME.

The PyTorch-written copies are made here without torch: the tiny PaddleNLP Qwen2's own weights renamed
(`qwen2.` -> `model.`) and each linear weight transposed to torch's [out, in], by this file's own mapping (not
PaddleNLP's name mappings, which the conversion uses), written by the safetensors library with format "pt" as
transformers writes it. The reference is the original PaddleNLP model: the same float32 numbers through the same
kernels in one process, so logits must be equal bit for bit.
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest
from dry_run_helpers import one_step_run_argv
from safetensors.numpy import save_file

from paddle_grpo.policy import hf_weights, load_policy, load_tokenizer, resolve_model_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINEAR = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight", "up_proj.weight",
          "down_proj.weight")


def torch_layout(paddle_state):
    """{transformers name: array} of a PaddleNLP Qwen2ForCausalLM state dict: torch's names and [out, in] linears."""
    out = {}
    for name, value in paddle_state.items():
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value)
        if name.endswith(LINEAR) or name == "lm_head.weight":  # paddle Linear [in, out] -> torch [out, in]
            array = array.T
        out[name.replace("qwen2.", "model.", 1)] = np.ascontiguousarray(array)
    return out


def write_torch_copy(src, dst, shards=1, dtype=None, extra=None, fmt="pt"):
    """`src` (a PaddleNLP model directory) as transformers would save it: config and tokenizer files copied, the
    weights in torch's layout as model.safetensors (or `shards` shards and their index), metadata format `fmt`."""
    os.makedirs(dst)
    for name in os.listdir(src):
        if name != "model_state.pdparams":
            shutil.copy(os.path.join(src, name), dst)
    tensors = torch_layout(paddle.load(os.path.join(src, "model_state.pdparams")))
    if dtype is not None:
        tensors = {k: v.astype(dtype) for k, v in tensors.items()}
    tensors.update(extra or {})
    names = list(tensors)
    if shards == 1:
        save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": fmt})
        return dst
    weight_map = {}
    for i, part in enumerate(np.array_split(np.arange(len(names)), shards)):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({names[j]: tensors[names[j]] for j in part}, os.path.join(dst, file), metadata={"format": fmt})
        weight_map.update({names[j]: file for j in part})
    with open(os.path.join(dst, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return dst


def logits(policy, ids):
    with paddle.no_grad():
        return policy.model(paddle.to_tensor(ids), return_dict=True).logits.numpy()


IDS = np.array([[5, 17, 42, 99, 3, 250, 7, 8], [1, 2, 3, 4, 5, 6, 7, 8]], dtype="int64")


@pytest.fixture(scope="module")
def reference_logits(tiny_policy_dir):
    return logits(load_policy(tiny_policy_dir, trainable=False), IDS)


@pytest.fixture
def ppnlp_cache(tmp_path, monkeypatch):
    """Conversions go to a fresh directory for each test (hf_weights reads PaddleNLP's MODEL_HOME when it runs)."""
    import paddlenlp.utils.env

    monkeypatch.setattr(paddlenlp.utils.env, "MODEL_HOME", str(tmp_path / "ppnlp" / "models"))
    return tmp_path / "ppnlp"


def test_paddlenlp_alone_refuses_pytorch_safetensors(tmp_path, tiny_policy_dir):
    """The failure this module exists for: PaddleNLP's own loader on transformers' safetensors."""
    from paddlenlp.transformers import AutoModelForCausalLM

    hf = write_torch_copy(tiny_policy_dir, str(tmp_path / "hf"))
    with pytest.raises(OSError, match="does not contain the valid metadata"):
        AutoModelForCausalLM.from_pretrained(hf)


@pytest.mark.parametrize("shards", [1, 3])
def test_pytorch_safetensors_load_with_the_original_logits(tmp_path, tiny_policy_dir, reference_logits, shards,
                                                           ppnlp_cache, caplog):
    hf = write_torch_copy(tiny_policy_dir, str(tmp_path / "hf"), shards=shards)
    with caplog.at_level("INFO", logger="paddle_grpo.policy"):
        converted = resolve_model_dir(hf)
    assert converted.startswith(str(ppnlp_cache / "converted" / "hf-")), converted
    assert "holds safetensors written by PyTorch" in caplog.text and "converted once" in caplog.text
    assert hf_weights.weight_format(converted) == "np"
    got = logits(load_policy(hf, trainable=False), IDS)
    assert np.array_equal(got, reference_logits)  # same float32 weights, same kernels: bit for bit
    # The tokenizer read through the converted directory is the original's.
    text = "<|im_start|>user\nWho is Zoey? 12 + 35<|im_end|>"
    assert load_tokenizer(hf)(text)["input_ids"] == load_tokenizer(tiny_policy_dir)(text)["input_ids"]


def test_the_conversion_is_done_once_and_redone_when_the_checkpoint_changes(tmp_path, tiny_policy_dir, ppnlp_cache,
                                                                             caplog):
    hf = write_torch_copy(tiny_policy_dir, str(tmp_path / "hf"))
    first = resolve_model_dir(hf)
    stamp = os.stat(os.path.join(first, "model.safetensors")).st_mtime_ns
    with caplog.at_level("INFO", logger="paddle_grpo.policy"):
        again = resolve_model_dir(hf)
    assert again == first and os.stat(os.path.join(first, "model.safetensors")).st_mtime_ns == stamp
    plan = hf_weights.plan(hf)
    assert plan.convert and plan.cached and plan.tensors == 27
    # A new checkpoint written over the old one gets its own copy.
    shutil.rmtree(hf)
    write_torch_copy(tiny_policy_dir, hf, dtype=np.float16)
    assert not hf_weights.plan(hf).cached
    assert resolve_model_dir(hf) != first


def test_bfloat16_weights_keep_their_bits(tmp_path, tiny_policy_dir, ppnlp_cache):
    """bfloat16 (numpy has none) is converted as raw 16-bit words: the model loaded in float32 holds exactly the
    bfloat16 values, i.e. the original weights rounded to bfloat16 (ml_dtypes, PaddleNLP's own bfloat16 type)."""
    import ml_dtypes

    state = paddle.load(os.path.join(tiny_policy_dir, "model_state.pdparams"))
    hf = str(tmp_path / "hf")
    os.makedirs(hf)
    for name in os.listdir(tiny_policy_dir):
        if name != "model_state.pdparams":
            shutil.copy(os.path.join(tiny_policy_dir, name), hf)
    tensors = torch_layout(state)
    bf16 = [(k, "BF16", v.astype(ml_dtypes.bfloat16).view(np.uint16)) for k, v in tensors.items()]
    hf_weights.write_safetensors(os.path.join(hf, "model.safetensors"), bf16, {"format": "pt"})
    header, _, _ = hf_weights.read_header(os.path.join(hf, "model.safetensors"))
    assert {v["dtype"] for v in header.values()} == {"BF16"}
    model = load_policy(hf, trainable=False).model
    for name, param in model.state_dict().items():
        expected = np.asarray(state[name].numpy()).astype(ml_dtypes.bfloat16).astype(np.float32)
        assert np.array_equal(param.numpy(), expected), name


def test_tensors_that_do_not_map_are_named(tmp_path, tiny_policy_dir, ppnlp_cache):
    hf = write_torch_copy(tiny_policy_dir, str(tmp_path / "hf"),
                          extra={"model.layers.0.self_attn.q_norm.weight": np.ones(16, np.float32)})
    with pytest.raises(hf_weights.WeightFormatError, match="q_norm.weight"):
        resolve_model_dir(hf)
    # the dry run and the run's preflight (exit 2 before loading) name it with the key
    from paddle_grpo.dry_run import model_dir_problems

    [problem] = model_dir_problems(hf, "actor_model_name_or_path")
    assert problem.startswith("actor_model_name_or_path: ") and "q_norm.weight" in problem
    hf2 = write_torch_copy(tiny_policy_dir, str(tmp_path / "tf"), fmt="tf")
    with pytest.raises(hf_weights.WeightFormatError, match="format 'tf'"):
        resolve_model_dir(hf2)


def test_a_paddlenlp_directory_is_left_as_it_is(tiny_policy_dir):
    assert resolve_model_dir(tiny_policy_dir) == tiny_policy_dir
    assert not hf_weights.plan(tiny_policy_dir).convert


# ------------------------------------------------------------------------------------- a real run, as a user


def run(args, home, cwd, timeout=400):
    env = {k: v for k, v in os.environ.items() if k not in ("PPNLP_ENDPOINT",)}
    env.update(PPNLP_HOME=str(home), PYTHONPATH=os.pathsep.join(filter(None, [REPO, env.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_dry_run_and_real_run_load_pytorch_safetensors(tmp_path, tiny_policy_dir):
    """A transformers-written Qwen2 passes --dry_run, which names the conversion, and the real run then trains a
    step from it (before, the dry run said ok and the run died in PaddleNLP's loader)."""
    hf = write_torch_copy(tiny_policy_dir, str(tmp_path / "hf"))
    argv, out_dir = one_step_run_argv(tmp_path, hf)
    home = tmp_path / "ppnlp"
    dry = run(argv + ["--dry_run"], home, cwd=tmp_path)
    assert dry.returncode == 0, dry.stdout[-3000:] + dry.stderr[-3000:]
    assert "dry run: ok" in dry.stdout
    assert f"actor_model_name_or_path: {hf} holds safetensors written by PyTorch" in dry.stdout
    assert "converted once to PaddleNLP's layout into" in dry.stdout
    assert not (home / "converted").exists()  # the dry run converts nothing
    out = run(argv, home, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "holds safetensors written by PyTorch" in out.stderr and "converted once" in out.stderr
    with open(out_dir / "metrics.jsonl") as f:
        metrics = [json.loads(line) for line in f]
    assert [r["step"] for r in metrics] == [1]
    # A second dry run sees the copy the run made.
    dry = run(argv + ["--dry_run"], home, cwd=tmp_path)
    assert "loading the PaddleNLP copy converted before" in dry.stdout, dry.stdout[-2000:]
