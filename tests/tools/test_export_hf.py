"""tools/models/export_hf.py: a PaddleNLP policy (LoRA merged) written as a transformers checkpoint.

Round trip in this environment: tiny random models (conftest's Qwen2; a Llama with grouped-query attention and a
non-default rope theta, tied and untied) exported, then loaded back through hf_weights' conversion (the path every
PyTorch-written checkpoint takes in a run): same float32 weights through the same kernels, so the logits must equal
the original's bit for bit. The exported tensors are also checked against this file's own expectation of
transformers' names and [out, in] layout (not the PaddleNLP mapping the tool runs). Where the `.[peer]` environment
exists (PADDLE_GRPO_PEER_PYTHON), transformers itself loads the exports and its logits, token ids and chat template
text are compared with PaddleNLP's.
"""
import json
import os
import shutil
import subprocess

import numpy as np
import paddle
import pytest

from lora_helpers import randomize_adapters
from numerics import f32_sum_tol, tiny_lm_tol
from peer_helpers import peer_python
from paddle_grpo.data import tokenize_prompts
from paddle_grpo.policy import load_policy, load_tokenizer
from paddle_grpo.policy import lora as L
from paddle_grpo.policy.causal import load_causal_lm
from paddle_grpo.policy.hf_weights import read_safetensors

HIDDEN, INTER, LAYERS = 64, 128, 2  # conftest's tiny Qwen2 and the Llama below
TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
IDS = np.array([[5, 17, 42, 99, 3, 250, 7, 8, 11, 12], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]], dtype="int64")
STRINGS = ["Hello world", "<|im_start|>user\nWhat is 12 + 35?<|im_end|>\n", "  42\n\n\tx = 3.14159",
           "café naïve 日本語 😀 don't I'M", "Zoey says Ethan is a knave. #### 47", "<|endoftext|>a  b   c"]


@pytest.fixture(scope="module")
def exporter(load_tool):
    return load_tool("models/export_hf")


@pytest.fixture(autouse=True)
def ppnlp_cache(tmp_path, monkeypatch):
    """Conversions of the exports (loading them back) go to a fresh directory for each test."""
    import paddlenlp.utils.env

    monkeypatch.setattr(paddlenlp.utils.env, "MODEL_HOME", str(tmp_path / "ppnlp" / "models"))


def with_template(src, dst):
    """A copy of model directory `src` whose tokenizer_config.json has a Jinja chat template."""
    shutil.copytree(src, dst)
    path = os.path.join(dst, "tokenizer_config.json")
    config = json.load(open(path, encoding="utf-8"))
    config["chat_template"] = TEMPLATE
    json.dump(config, open(path, "w", encoding="utf-8"))
    return str(dst)


def tiny_llama(src, dst, tied):
    """A random PaddleNLP LlamaForCausalLM (4 query / 2 key-value heads, rope theta 1e5) with `src`'s tokenizer."""
    from paddlenlp.transformers import LlamaConfig, LlamaForCausalLM

    os.makedirs(dst)
    for name in os.listdir(src):
        if name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(os.path.join(src, name), dst)
    config = LlamaConfig(vocab_size=320, hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rope_theta=1e5,
                         rms_norm_eps=1e-5, tie_word_embeddings=tied, bos_token_id=0, eos_token_id=2, pad_token_id=0,
                         dtype="float32")
    paddle.seed(7)
    model = LlamaForCausalLM(config)
    with paddle.no_grad():  # norms away from 1 so that a swapped norm weight would show
        rng = np.random.default_rng(7)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.set_value(paddle.to_tensor((1 + 0.2 * rng.standard_normal(p.shape)).astype("float32")))
    model.save_pretrained(dst)
    return str(dst)


@pytest.fixture(scope="module", params=["qwen2", "llama-tied", "llama-untied"])
def source(request, tiny_policy_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(request.param)
    if request.param == "qwen2":
        return with_template(tiny_policy_dir, tmp / "model")
    return with_template(tiny_llama(tiny_policy_dir, str(tmp / "raw"), request.param == "llama-tied"), tmp / "model")


@pytest.fixture(scope="module")
def exported(source, exporter, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("export") / "hf")
    summary = exporter.export(source, out)
    return source, out, summary


def logits(model_dir):
    policy = load_policy(model_dir, trainable=False)
    with paddle.no_grad():
        return policy.model(paddle.to_tensor(IDS), return_dict=True).logits.numpy()


def expected_transformers_tensors(model_dir):
    """{transformers name: array} of a PaddleNLP Qwen2 / Llama directory, by this file's own rule: `qwen2.` /
    `llama.` -> `model.`, every 2-D weight but the embedding transposed (paddle's Linear is [in, out]), a tied head
    left out."""
    from paddlenlp.transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tied = model.config.tie_word_embeddings
    out = {}
    for name, value in model.state_dict().items():
        array = value.numpy()
        if name == "lm_head.weight" and tied:
            continue
        if array.ndim == 2 and "embed_tokens" not in name:
            array = array.T
        out["model." + name.split(".", 1)[1] if not name.startswith("lm_head") else name] = array
    return out


def test_the_export_is_transformers_layout(exported):
    source, out, _ = exported
    tensors, metadata = read_safetensors(os.path.join(out, "model.safetensors"))
    assert metadata == {"format": "pt"}
    expected = expected_transformers_tensors(source)
    assert set(tensors) == set(expected)
    for name, (tag, array) in tensors.items():
        assert tag == "F32" and np.array_equal(array, expected[name]), name
    config = json.load(open(os.path.join(out, "config.json")))
    src = json.load(open(os.path.join(source, "config.json")))
    assert config["architectures"] == src["architectures"] and config["torch_dtype"] == "float32"
    assert config["tie_word_embeddings"] == src.get("tie_word_embeddings", False)
    assert config["rope_theta"] == src["rope_theta"] and config["num_key_value_heads"] == 2
    # transformers 5's keys (the `.[peer]` version), beside transformers 4's
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": src["rope_theta"]}
    assert config["dtype"] == "float32" and config["rope_scaling"] is None
    assert "paddlenlp_version" not in config
    assert ("lm_head.weight" in tensors) != config["tie_word_embeddings"]
    tok = json.load(open(os.path.join(out, "tokenizer_config.json"), encoding="utf-8"))
    assert tok["chat_template"] == TEMPLATE and tok["eos_token"] == "<|im_end|>"
    assert open(os.path.join(out, "chat_template.jinja"), encoding="utf-8").read() == TEMPLATE
    assert os.path.isfile(os.path.join(out, "tokenizer.json"))
    assert json.load(open(os.path.join(out, "generation_config.json")))["eos_token_id"] == 2


def test_the_export_loads_back_with_the_original_logits(exported):
    """Through hf_weights' conversion of PyTorch-written safetensors: the same float32 numbers and kernels."""
    source, out, _ = exported
    assert np.array_equal(logits(out), logits(source))
    # tokenizer.json as the `tokenizers` library reads it (transformers' PreTrainedTokenizerFast wraps it as is;
    # PaddleNLP 3.0.0b4's AutoTokenizer does not know that class name)
    from tokenizers import Tokenizer

    # against the run's tokenization (data.tokenize_prompts: ChatML markers and registered tokens whole)
    ours, theirs = load_tokenizer(source), Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    for s in STRINGS:
        assert theirs.encode(s).ids == tokenize_prompts(ours, [s])[0], s


def test_a_runs_checkpoint_exports_its_policy(exporter, tiny_policy_dir, tmp_path):
    """A full checkpoint as the trainer writes it (checkpoint.save_checkpoint: policy, tokenizer, optimizer state,
    trainer state, RNG state), after one AdamW step so the weights are the trained ones, not the initial ones."""
    from paddle_grpo.run.checkpoint import save_checkpoint

    model = load_causal_lm(tiny_policy_dir)
    optimizer = paddle.optimizer.AdamW(learning_rate=1e-2, parameters=model.parameters())
    loss = model(input_ids=paddle.to_tensor(IDS), return_dict=True).logits.square().mean()
    loss.backward()
    optimizer.step()
    model.eval()
    with paddle.no_grad():
        trained = model(input_ids=paddle.to_tensor(IDS), return_dict=True).logits.numpy()
    checkpoint = save_checkpoint(str(tmp_path / "run"), 1, model, load_tokenizer(tiny_policy_dir),
                                 trainer_state={"global_step": 1}, optimizer=optimizer)
    assert {"optimizer.pdopt", "trainer_state.json"} <= set(os.listdir(checkpoint))
    exporter.export(checkpoint, str(tmp_path / "hf"))
    assert not {"optimizer.pdopt", "trainer_state.json", "rng_state.pkl"} & set(os.listdir(tmp_path / "hf"))
    assert np.array_equal(logits(str(tmp_path / "hf")), trained)  # same float32 weights and kernels
    assert np.abs(logits(tiny_policy_dir) - trained).max() > 1e-3  # the step did change the model


def lora_checkpoint(tiny_policy_dir, tmp_path):
    """(a LoRA checkpoint as a `lora: true` run writes it: adapters with random non-zero A and B, tokenizer, the base
    recorded in lora_config.json; the base model's directory; the LoRA model's logits of IDS)."""
    base = with_template(tiny_policy_dir, tmp_path / "base")
    model = L.apply_lora(load_causal_lm(base), rank=4, alpha=8, dropout=0.0, base_model_name_or_path=base)
    randomize_adapters(model, np.random.default_rng(3))
    with paddle.no_grad():
        lora_logits = model(input_ids=paddle.to_tensor(IDS), return_dict=True).logits.numpy()
    checkpoint = str(tmp_path / "checkpoint-1")
    L.save_adapters(model, checkpoint)
    load_tokenizer(base).save_pretrained(checkpoint)
    return checkpoint, base, lora_logits


def test_lora_checkpoint_exports_merged(exporter, tiny_policy_dir, tmp_path):
    """A LoRA checkpoint (adapters + tokenizer, the base recorded in lora_config.json) exports as base + adapters."""
    checkpoint, base, lora_logits = lora_checkpoint(tiny_policy_dir, tmp_path)
    summary = exporter.export(checkpoint, str(tmp_path / "hf"))
    assert summary["lora_r"] == 4 and summary["base"] == os.path.abspath(base)
    got = logits(str(tmp_path / "hf"))
    # x W + s (x A) B against x (W + s A B): tests/numerics.py's bound for the tiny model's logits (as merge_lora's)
    tol = tiny_lm_tol(INTER, LAYERS, 0)
    assert np.abs(got - lora_logits).max() < tol
    assert np.abs(logits(base) - lora_logits).max() > 1e-2  # the adapters change the model: they were merged


def test_bfloat16_export(exporter, tiny_policy_dir, tmp_path):
    """--dtype bfloat16: each weight rounded to nearest even (bits checked against numpy's float32 values)."""
    out = str(tmp_path / "hf")
    exporter.export(tiny_policy_dir, out, dtype="bfloat16")
    tensors, _ = read_safetensors(os.path.join(out, "model.safetensors"))
    expected = expected_transformers_tensors(tiny_policy_dir)
    for name, (tag, bits) in tensors.items():
        assert tag == "BF16"
        back = (bits.astype(np.uint32) << 16).view(np.float32)
        # bfloat16 keeps 8 significant bits: rounding to nearest is within its unit roundoff 2^-8 relative
        assert np.all(np.abs(back - expected[name]) <= np.abs(expected[name]) * 2.0 ** -8), name
        # and it is the nearest: the neighbouring bfloat16 values on either side are not closer
        for step in (-1, 1):
            other = ((bits.astype(np.int64) + step).astype(np.uint32) << 16).view(np.float32)
            finite = np.isfinite(other)  # below +0 / -0 the bit pattern wraps to NaN: no neighbour there
            assert np.all(np.abs(other - expected[name])[finite] >= np.abs(back - expected[name])[finite]), name
    assert json.load(open(os.path.join(out, "config.json")))["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("field,value,message", [
    ("architectures", ["MistralForCausalLM"], "field 'architectures' is ['MistralForCausalLM']"),
    ("quantization_config", {"weight_quantize_algo": "weight_only_int8"},
     "field 'quantization_config.weight_quantize_algo' is 'weight_only_int8'"),
    ("rope_scaling_type", "linear", "field 'rope_scaling_type' is 'linear'"),
    ("fuse_attention_qkv", True, "field 'fuse_attention_qkv' is True"),
])
def test_unsupported_sources_are_refused_naming_the_field(exporter, tiny_policy_dir, tmp_path, field, value,
                                                          message, capsys):
    src = shutil.copytree(tiny_policy_dir, tmp_path / "src")
    config = json.load(open(src / "config.json"))
    config[field] = value
    json.dump(config, open(src / "config.json", "w"))
    assert exporter.main([str(src), "--out", str(tmp_path / "hf")]) == 2
    assert message in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "hf")


def test_command_line(exporter, tiny_policy_dir, tmp_path, capsys):
    assert exporter.main([tiny_policy_dir, "--out", str(tmp_path / "hf")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["architecture"] == "Qwen2ForCausalLM" and summary["tensors"] == 27
    assert summary["out"] == str(tmp_path / "hf") and summary["dtype"] == "float32"


def test_an_existing_output_is_not_overwritten(exporter, tiny_policy_dir, tmp_path, capsys):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "mine.txt").write_text("keep")
    assert exporter.main([tiny_policy_dir, "--out", str(tmp_path / "hf")]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert os.listdir(tmp_path / "hf") == ["mine.txt"]


# ----------------------------------------------------------------------------------------- transformers itself

PEER_SCRIPT = r'''
import json, sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
out = {}
for directory in json.loads(sys.argv[1]):
    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor(json.loads(sys.argv[2]))).logits.double().numpy()
    out[directory] = {"logits": logits.tolist(), "ids": [tok(s)["input_ids"] for s in json.loads(sys.argv[3])],
                      "chat": tok.apply_chat_template([{"role": "user", "content": "Hi 12"}], tokenize=False,
                                                      add_generation_prompt=True)}
print(json.dumps(out))
'''


def test_transformers_loads_the_exports(exporter, tiny_policy_dir, tmp_path):
    """transformers' AutoModelForCausalLM / AutoTokenizer on the exports of all three tiny models: logits within
    float32 rounding of PaddleNLP's forward of the originals, the same token ids, the same chat template text."""
    python = peer_python()
    if python is None:
        pytest.skip("transformers and torch are not installed here (the peer has its own environment: "
                    "../shared/peer/make_peer_venv.sh .peer-venv; then set PADDLE_GRPO_PEER_PYTHON="
                    ".peer-venv/bin/python)")
    sources = {"qwen2": with_template(tiny_policy_dir, tmp_path / "qwen2")}
    for tied in (True, False):
        name = f"llama-{'tied' if tied else 'untied'}"
        sources[name] = with_template(tiny_llama(tiny_policy_dir, str(tmp_path / f"raw-{name}"), tied),
                                      tmp_path / name)
    checkpoint, _, lora_logits = lora_checkpoint(tiny_policy_dir, tmp_path / "lora")
    outs = {name: str(tmp_path / f"hf-{name}") for name in [*sources, "lora"]}
    for name, src in [*sources.items(), ("lora", checkpoint)]:
        exporter.export(src, outs[name])
    peer = subprocess.run([python, "-c", PEER_SCRIPT, json.dumps(list(outs.values())), json.dumps(IDS.tolist()),
                           json.dumps(STRINGS)], capture_output=True, text=True, timeout=600)
    assert peer.returncode == 0, peer.stderr[-3000:]
    theirs = json.loads(peer.stdout.strip().splitlines()[-1])
    for name, src in sources.items():
        got = theirs[outs[name]]
        ours = logits(src).astype(np.float64)
        # Two float32 implementations of the same maths: per layer ~9 chained sums of at most INTER terms
        # (numerics.tiny_lm_tol's count), terms adding up to at most the largest |logit| + 1; doubled for two
        # evaluations, as test_import_gguf's comparison with transformers
        tol = 2 * f32_sum_tol(INTER, np.abs(ours).max() + 1, depth=9 * LAYERS + 2)
        assert np.abs(ours - np.array(got["logits"])).max() < tol, name
        tok = load_tokenizer(src)
        assert got["ids"] == tokenize_prompts(tok, STRINGS), name
        assert got["chat"] == tok.apply_chat_template([{"role": "user", "content": "Hi 12"}], tokenize=False,
                                                      add_generation_prompt=True) == \
            "<|im_start|>user\nHi 12<|im_end|>\n<|im_start|>assistant\n"
    # The merged LoRA export against the LoRA model: the bound above plus merging's rounding (as
    # test_lora_checkpoint_exports_merged)
    tol = 2 * f32_sum_tol(INTER, np.abs(lora_logits).max() + 1, depth=9 * LAYERS + 2) + tiny_lm_tol(INTER, LAYERS, 0)
    assert np.abs(lora_logits - np.array(theirs[outs["lora"]]["logits"])).max() < tol


def test_chat_markers_that_are_not_special_are_exported(exporter, tmp_path):
    """A tokenizer with registered non-special markers (the tools quickstart's <tool_call>, ...): the exported
    tokenizer.json keeps each whole with the source's id, not special (decode keeps it), and tokenizes like the
    run (data.tokenize_prompts; before: the export split the markers into pieces)."""
    from tokenizers import Tokenizer

    from paddle_grpo.recipes.quickstart_tools import MARKERS
    from paddle_grpo.recipes.tiny import build_model, build_tokenizer

    source = str(tmp_path / "src")
    corpus = [f"{m} call 12 + 35 = 47 {m}" for m in MARKERS] * 20 + ["Hello world, what is 3 + 4?"] * 20
    tokenizer = build_tokenizer(corpus, source, vocab_size=300, added_tokens=MARKERS)
    build_model(source, tokenizer)
    summary = exporter.export(source, str(tmp_path / "hf"))
    assert summary["tokenizer"]["registered_tokens"] == len(MARKERS)
    assert summary["tokenizer"]["written_class"] == "PreTrainedTokenizerFast"
    written = Tokenizer.from_file(str(tmp_path / "hf" / "tokenizer.json"))
    ours = load_tokenizer(source)
    for marker in MARKERS:
        text = f"a {marker}12 {marker}"
        ids = written.encode(text, add_special_tokens=False).ids
        assert ids == tokenize_prompts(ours, [text])[0]  # the run's tokenization: markers whole
        assert ours.convert_tokens_to_ids(marker) in ids
        assert written.decode(ids, skip_special_tokens=True) == text
