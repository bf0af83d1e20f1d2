"""Export a trained policy as a transformers checkpoint: config.json, model.safetensors, tokenizer, generation config.

    python tools/models/export_hf.py SOURCE --out DIR [--base DIR] [--dtype float32|bfloat16|float16]

SOURCE: a checkpoint of run_rl.py (`<output_dir>/checkpoint-<step>`), any PaddleNLP model directory (or a hub ID
that PaddleNLP's cache holds), or, for a `lora: true` run, its LoRA checkpoint: the adapters are merged into the base
model first (W + (lora_alpha / r) * A @ B in float32, paddle_grpo.policy.lora's merge), the base model found at
--base or at the `base_model_name_or_path` recorded in lora_config.json, as tools/models/merge_lora.py does.

DIR gets what transformers' `save_pretrained` writes, so that transformers' `AutoModelForCausalLM` /
`AutoTokenizer.from_pretrained(DIR)` load it, and with them vLLM and llama.cpp's convert_hf_to_gguf.py:
- config.json in transformers 5's form, the version the `.[peer]` extra resolves (architectures LlamaForCausalLM or
  Qwen2ForCausalLM, model_type, dtype, tie_word_embeddings, rope_parameters with the theta and any scaling, head
  counts, rms_norm_eps, token ids), with transformers 4's rope_theta / rope_scaling / torch_dtype beside them, and
  without PaddleNLP's own keys;
- model.safetensors with metadata {"format": "pt"}: transformers' tensor names and torch's [out, in] linear layout,
  obtained by running PaddleNLP's own name mapping of the model class (the one paddle_grpo/policy/hf_weights.py uses
  to load such files) in reverse; a tied LM head is left out, as transformers saves it;
- tokenizer.json (the byte-level BPE as the `tokenizers` library reads it: PaddleNLP's fast tokenizer of SOURCE,
  converted from vocab.json + merges.txt by PaddleNLP's own converter when SOURCE has no tokenizer.json),
  the source's own tokenizer.json when it has one; every token of its added_tokens_decoder registered, chat markers
  that are not special included), tokenizer_config.json (tokenizer_class PreTrainedTokenizerFast, which transformers
  4 and 5 both read from tokenizer.json as it is; the special tokens; the chat template), chat_template.jinja (where
  transformers 5 reads it), special_tokens_map.json and generation_config.json.
The written tokenizer.json is checked against PaddleNLP's tokenizer of SOURCE on a few strings before the tool
reports success.

Supported: PaddleNLP's LlamaForCausalLM and Qwen2ForCausalLM in float32, bfloat16 or float16 (dtype kept unless
--dtype; bfloat16 rounded to nearest even). Refused, naming the field: other architectures, quantized weights
(`quantization_config`), and settings whose weights or maths transformers' classes would read differently (fused
q/k/v or gate/up, PaddleNLP's own rope_scaling_type, sliding windows, an activation other than SiLU, a head_dim
other than hidden_size / num_attention_heads). Needs numpy and safetensors-format writing only (no torch).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import time
from typing import Any

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SUPPORTED = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
DTYPE_TAGS = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}
# A few strings on which the written tokenizer.json must give PaddleNLP's ids (special tokens, digits, runs of
# whitespace, non-ASCII): a cheap guard against a tokenizer that was converted into something else.
PROBES = ["Hello world", "<|im_start|>user\nWhat is 12 + 35?<|im_end|>\n", "  42\n\n\tx = 3.14159",
          "café naïve 日本語 😀 don't I'M", "The answer is 47. #### 47"]


class ExportError(ValueError):
    """A source the exporter does not write; the message names the file and field."""


# ------------------------------------------------------------------------------------------------------- checks

def check_supported(config: Any, where: str) -> str:
    """The architecture name of `config` (a PaddleNLP config) when the exporter supports it; ExportError naming
    the field that stops it otherwise."""
    names = list(getattr(config, "architectures", None) or [])
    arch = next((n for n in names if n in SUPPORTED), None)
    if arch is None:
        raise ExportError(f"{where}: config.json field 'architectures' is {names or 'missing'}; only "
                          f"{' and '.join(SUPPORTED)} are exported")
    quant = getattr(config, "quantization_config", None)
    quant = quant.to_dict() if hasattr(quant, "to_dict") else (quant or {})
    for field in ("weight_quantize_algo", "quant_type", "quant_method"):
        if quant.get(field):
            raise ExportError(f"{where}: config.json field 'quantization_config.{field}' is {quant[field]!r}: "
                              "quantized weights are not exported (export the unquantized model)")
    refused = {
        "fuse_attention_qkv": (False, "fused q/k/v weights"),
        "fuse_attention_ffn": (False, "fused gate/up weights"),
        "rope_scaling_type": (None, "PaddleNLP's own rope scaling"),
        "use_sliding_window": (False, "a sliding attention window"),
        "alibi": (False, "ALiBi"),
        "use_long_sequence_strategies": (False, "long-sequence strategies"),
        "attention_bias": (arch == "Qwen2ForCausalLM", "attention biases other than the architecture's"),
        "mlp_bias": (False, "MLP biases"),
    }
    for field, (ok, what) in refused.items():
        value = getattr(config, field, ok)
        if value is not None and value != ok and value != {}:
            raise ExportError(f"{where}: config.json field {field!r} is {value!r} ({what}), which is not exported")
    factor = getattr(config, "rope_scaling_factor", 1.0)
    if factor not in (None, 1.0):
        raise ExportError(f"{where}: config.json field 'rope_scaling_factor' is {factor!r} (rope scaling), which "
                          "is not exported")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ExportError(f"{where}: config.json field 'hidden_act' is {config.hidden_act!r}; only 'silu' is "
                          "exported (PaddleNLP's Llama computes SiLU whatever the field says)")
    head_dim = getattr(config, "head_dim", None)
    if head_dim not in (None, config.hidden_size // config.num_attention_heads):
        raise ExportError(f"{where}: config.json field 'head_dim' is {head_dim}, not hidden_size / "
                          f"num_attention_heads = {config.hidden_size // config.num_attention_heads}")
    return arch


# ------------------------------------------------------------------------------------------------------ weights

def to_bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (round to nearest even), as its raw 16 bits (numpy has no bfloat16)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return (rounded >> np.uint32(16)).astype(np.uint16)


def cast(array: np.ndarray, dtype: str) -> np.ndarray:
    """A float32 array in the export dtype's bytes (float32 unchanged)."""
    if dtype == "float32":
        return array
    if dtype == "float16":
        return array.astype(np.float16)
    return to_bfloat16_bits(array)


def to_transformers(state: dict[str, np.ndarray], config: Any, where: str) -> list[tuple[str, np.ndarray]]:
    """(transformers name, array) of each tensor of PaddleNLP state dict `state`: PaddleNLP's own name mapping of
    the model class (hf_weights.name_mappings) run in reverse (rename back, transpose [in, out] -> [out, in]; a
    transpose is its own inverse). A tied LM head (PaddleNLP keeps the embedding under lm_head.weight too) and
    rotary tables are left out, as transformers saves them. ExportError naming the tensors that do not map."""
    from paddle_grpo.policy.hf_weights import name_mappings

    by_target = {m.target_name: m for m in name_mappings(config, where)}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    out, unknown = [], []
    for name, array in state.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue
        if name == "lm_head.weight" and tied:
            embedding = next(a for n, a in state.items() if n.endswith("embed_tokens.weight"))
            if not np.array_equal(array, embedding):  # a head trained apart from the embedding: not tied any more
                raise ExportError(f"{where}: tie_word_embeddings is true but lm_head.weight differs from the "
                                  "embedding; transformers would use the embedding as the head")
            continue
        m = by_target.get(name)
        if m is None:
            unknown.append(name)
            continue
        if m.action not in (None, "transpose"):
            raise ExportError(f"{where}: tensor {name}: PaddleNLP's mapping does {m.action!r}, which has no "
                              "inverse here")
        out.append((m.source_name, np.ascontiguousarray(array.T) if m.action == "transpose" else array))
    missing = sorted(set(by_target) - set(state) - {n for n in by_target if n.endswith("rotary_emb.inv_freq")})
    if unknown or missing:
        raise ExportError(f"{where}: the weights do not map to transformers' {config.architectures[0]}: "
                          f"{len(unknown)} without a transformers name ({', '.join(sorted(unknown)[:5])}), "
                          f"{len(missing)} missing ({', '.join(missing[:5])})")
    return sorted(out)


def load_source(source: str, base: str | None) -> tuple[Any, dict[str, np.ndarray], str, dict[str, Any]]:
    """(PaddleNLP config, float32 numpy state dict, tokenizer directory, what was read) of `source`: a PaddleNLP
    model directory (or hub ID in the cache), or a LoRA adapter directory merged into its base model."""
    import paddle
    from paddlenlp.transformers import AutoConfig, AutoModelForCausalLM

    from paddle_grpo.policy import lora, rope
    from paddle_grpo.policy.hub import resolve_model_dir

    info: dict[str, Any] = {"source": os.path.abspath(source) if os.path.isdir(source) else source}
    if lora.is_adapter_dir(source):
        adapter = lora.read_adapter_config(source)
        base_name = base or adapter.base_model_name_or_path
        try:
            model_dir = resolve_model_dir(base_name or "", key="base model")
        except FileNotFoundError as e:
            raise ExportError(f"{source}: LoRA adapters; their base model {base_name!r} is not found (pass --base; "
                              f"lora_config.json records base_model_name_or_path = "
                              f"{adapter.base_model_name_or_path!r}): {e}") from None
        config = rope.normalize(AutoConfig.from_pretrained(model_dir), os.path.join(model_dir, "config.json"))
        check_supported(config, model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype="float32")
        model = lora.merge_adapters(lora.load_adapters(model, source))
        tokenizer_dir = source if lora._has_tokenizer(source) else model_dir
        info.update(base=os.path.abspath(model_dir), lora_r=adapter.r, lora_alpha=adapter.lora_alpha)
    else:
        if base:
            raise ExportError(f"--base is for LoRA adapters; {source} has no lora_config.json")
        model_dir = resolve_model_dir(source)
        config = rope.normalize(AutoConfig.from_pretrained(model_dir), os.path.join(model_dir, "config.json"))
        check_supported(config, model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype="float32")
        tokenizer_dir = model_dir
    state = {}
    for name, tensor in model.state_dict().items():
        if not paddle.is_floating_point(tensor):
            raise ExportError(f"{model_dir}: tensor {name} is {tensor.dtype}: quantized weights are not exported")
        state[name] = tensor.numpy()
    return model.config, state, tokenizer_dir, info


# ------------------------------------------------------------------------------------------------------- config

def transformers_config(config: Any, arch: str, dtype: str) -> dict[str, Any]:
    """config.json as transformers 5 writes it for `arch` (the `.[peer]` version), from the PaddleNLP config's
    fields, with the keys transformers 4 reads instead beside them (rope_theta / rope_scaling, torch_dtype)."""
    from paddle_grpo.policy import rope

    heads = config.num_attention_heads
    out = {
        "architectures": [arch], "model_type": SUPPORTED[arch], "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size, "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers, "num_attention_heads": heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None) or heads,
        "head_dim": config.hidden_size // heads, "hidden_act": "silu",
        "max_position_embeddings": config.max_position_embeddings,
        "initializer_range": getattr(config, "initializer_range", 0.02), "rms_norm_eps": config.rms_norm_eps,
        # transformers 5 reads rope_parameters (and writes nothing else); transformers 4 the top-level keys
        "rope_parameters": rope.parameters(config), "rope_theta": float(getattr(config, "rope_theta", 10000.0)),
        "rope_scaling": rope.scaling_of(config),
        "attention_dropout": float(getattr(config, "attention_dropout", 0.0) or 0.0),
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "bos_token_id": getattr(config, "bos_token_id", None), "eos_token_id": getattr(config, "eos_token_id", None),
        "pad_token_id": getattr(config, "pad_token_id", None), "use_cache": True, "torch_dtype": dtype,
        "dtype": dtype,  # transformers 5's name for torch_dtype
    }
    if arch == "LlamaForCausalLM":  # PaddleNLP's Llama has no q/k/v/o or MLP biases
        out.update(attention_bias=False, mlp_bias=False, pretraining_tp=1)
    else:  # Qwen2's q/k/v biases are implied by the architecture
        out.update(use_sliding_window=False, sliding_window=getattr(config, "sliding_window", None),
                   max_window_layers=getattr(config, "max_window_layers", config.num_hidden_layers))
    return out


def generation_config(config: Any, source_dir: str) -> dict[str, Any]:
    """generation_config.json: the token ids, and the sampling settings transformers knows from SOURCE's own."""
    out = {k: getattr(config, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    path = os.path.join(source_dir, "generation_config.json")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            theirs = json.load(f)
        out.update({k: theirs[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id", "do_sample",
                                           "temperature", "top_p", "top_k", "repetition_penalty", "max_new_tokens")
                    if theirs.get(k) is not None})
    return {k: v for k, v in out.items() if v is not None}


# ---------------------------------------------------------------------------------------------------- tokenizer

def add_registered_tokens(backend: Any, source_config: dict[str, Any], tokenizer_dir: str,
                          run_tokens: dict[str, int]) -> None:
    """Every token of the source's tokenizer_config.json `added_tokens_decoder` (chat markers such as <tool_call>,
    special or not) added to `backend` as the source registers it, and every other token the run kept whole
    (`run_tokens`: data.special_token_ids, e.g. ChatML's turn markers found in the vocabulary) as a special token, so
    that each stays one token as in the run: PaddleNLP's conversion from vocab.json keeps such a marker in the
    vocabulary but splits it in text. ExportError when one would get another id than the source's."""
    from tokenizers import AddedToken

    decoder = {int(i): e for i, e in (source_config.get("added_tokens_decoder") or {}).items()}
    listed = {e["content"] for e in decoder.values()}
    decoder.update({i: {"content": t, "special": True} for t, i in run_tokens.items()
                    if t not in listed and backend.encode(t, add_special_tokens=False).ids != [i]})
    for index, entry in sorted(decoder.items()):
        token = AddedToken(entry["content"], single_word=bool(entry.get("single_word")),
                           lstrip=bool(entry.get("lstrip")), rstrip=bool(entry.get("rstrip")),
                           normalized=bool(entry.get("normalized")), special=bool(entry.get("special")))
        (backend.add_special_tokens if entry.get("special") else backend.add_tokens)([token])
        if backend.token_to_id(entry["content"]) != index:
            raise ExportError(f"{tokenizer_dir}: tokenizer_config.json added_tokens_decoder gives "
                              f"{entry['content']!r} id {index}; the exported tokenizer.json would give it "
                              f"{backend.token_to_id(entry['content'])}")


def export_tokenizer(tokenizer_dir: str, out_dir: str) -> dict[str, Any]:
    """tokenizer.json, tokenizer_config.json (with the chat template), special_tokens_map.json in `out_dir` from
    PaddleNLP's tokenizer of `tokenizer_dir`; checked on PROBES against that tokenizer. Returns a summary."""
    from paddlenlp.transformers import AutoTokenizer
    from tokenizers import Tokenizer

    from paddle_grpo.data import special_token_ids, tokenize_prompts
    from paddle_grpo.policy import load_tokenizer
    from paddle_grpo.policy.tokenizer import chat_template_text

    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        source_config = json.load(f)
    source_json = os.path.join(tokenizer_dir, "tokenizer.json")
    if os.path.isfile(source_json):  # the file the run read (policy/tokenizer.py), exactly
        fast, backend = load_tokenizer(tokenizer_dir), Tokenizer.from_file(source_json)
    else:
        fast = AutoTokenizer.from_pretrained(tokenizer_dir, use_fast=True)
        if getattr(fast, "_tokenizer", None) is None:
            raise ExportError(f"{tokenizer_dir}: tokenizer_config.json field 'tokenizer_class' is "
                              f"{source_config.get('tokenizer_class')!r}, which PaddleNLP cannot convert to a "
                              "tokenizer.json (a byte-level BPE such as Qwen2's or Llama 3's is exported)")
        backend = Tokenizer.from_str(fast._tokenizer.to_str())  # a copy: the flags below leave PaddleNLP's alone
    special = {k: str(getattr(fast, k)) for k in ("bos_token", "eos_token", "pad_token", "unk_token")
               if source_config.get(k) and getattr(fast, k, None)}
    extra = [str(t) for t in (getattr(fast, "additional_special_tokens", None) or [])]
    backend.add_special_tokens(list(special.values()) + extra)  # marked special (skipped by decode(skip_special))
    add_registered_tokens(backend, source_config, tokenizer_dir, special_token_ids(load_tokenizer(tokenizer_dir)))
    backend.save(os.path.join(out_dir, "tokenizer.json"))
    data = json.loads(backend.to_str())
    decoder = {str(t["id"]): {k: t[k] for k in ("content", "lstrip", "rstrip", "normalized", "single_word",
                                                 "special")} for t in data.get("added_tokens", [])}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **special, "additional_special_tokens": extra,
              "added_tokens_decoder": decoder, "clean_up_tokenization_spaces": False,
              "padding_side": source_config.get("padding_side", fast.padding_side)}
    if 0 < int(source_config.get("model_max_length") or 0) < 10 ** 12:  # PaddleNLP's "no limit" is ~1e30
        config["model_max_length"] = int(source_config["model_max_length"])
    if source_config.get("add_bos_token") is not None:
        config["add_bos_token"] = bool(source_config["add_bos_token"])
    template = source_config.get("chat_template") or chat_template_text(tokenizer_dir)
    if isinstance(template, str) and template:
        # transformers 5 reads chat_template.jinja (and writes only that); transformers 4 reads tokenizer_config.json
        config["chat_template"] = template
        with open(os.path.join(out_dir, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(template)
    elif os.path.isfile(os.path.join(tokenizer_dir, "chat_template.json")):
        raise ExportError(f"{tokenizer_dir}: chat_template.json holds PaddleNLP's own template format, which "
                          "transformers does not read; put a Jinja template under 'chat_template' in "
                          "tokenizer_config.json")
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w", encoding="utf-8") as f:
        json.dump({**special, "additional_special_tokens": extra}, f, indent=2, ensure_ascii=False)
    # The check: the run's tokenization (its tokenizer, PaddleNLP's slow or fast, with data.tokenize_prompts' exact
    # special and registered tokens) against the file just written, on PROBES and each registered token in text
    ours, written = load_tokenizer(tokenizer_dir), Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    markers = [e["content"] for e in (source_config.get("added_tokens_decoder") or {}).values()]
    for text in PROBES + [f"a {m}x 12{m}" for m in markers]:
        expected = tokenize_prompts(ours, [text])[0]  # as the run tokenized its prompts (markers whole)
        got = written.encode(text, add_special_tokens=False).ids
        if got != expected:
            raise ExportError(f"{tokenizer_dir}: the exported tokenizer.json tokenizes {text!r} as {got}, "
                              f"PaddleNLP's tokenizer as {expected}")
    return {"source_class": source_config.get("tokenizer_class"), "written_class": config["tokenizer_class"],
            "chat_template": "chat_template" in config, "vocab": written.get_vocab_size(with_added_tokens=True),
            "registered_tokens": len(markers)}


# --------------------------------------------------------------------------------------------------------- main

def export(source: str, out_dir: str, *, base: str | None = None, dtype: str | None = None) -> dict[str, Any]:
    """Write the transformers checkpoint of `source` into `out_dir` (module docstring); returns a summary."""
    from paddle_grpo.policy.hf_weights import write_safetensors

    start = time.perf_counter()
    if os.path.exists(out_dir) and os.listdir(out_dir):
        raise ExportError(f"--out {out_dir} exists and is not empty; give a new directory")
    config, state, tokenizer_dir, info = load_source(source, base)
    arch = check_supported(config, source)
    dtype = dtype or str(getattr(config, "dtype", None) or "float32")
    if dtype not in DTYPE_TAGS:
        raise ExportError(f"{source}: config.json field 'dtype' is {dtype!r}; pass --dtype float32, bfloat16 or "
                          "float16")
    tensors = to_transformers(state, config, source)
    tmp = f"{out_dir.rstrip(os.sep)}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    try:
        nbytes = write_safetensors(os.path.join(tmp, "model.safetensors"),
                                   [(n, DTYPE_TAGS[dtype], cast(a, dtype)) for n, a in tensors], {"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
            json.dump(transformers_config(config, arch, dtype), f, indent=2)
        with open(os.path.join(tmp, "generation_config.json"), "w", encoding="utf-8") as f:
            json.dump(generation_config(config, tokenizer_dir), f, indent=2)
        tok = export_tokenizer(tokenizer_dir, tmp)
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)
        os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": os.path.abspath(out_dir), **info, "architecture": arch, "dtype": dtype, "tensors": len(tensors),
            "megabytes": round(nbytes / 2**20, 1), "tokenizer": tok, "seconds": round(time.perf_counter() - start, 1)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Export a trained policy as a transformers checkpoint.")
    parser.add_argument("source", help="a checkpoint of run_rl.py (LoRA adapters are merged), or a PaddleNLP model "
                                       "directory")
    parser.add_argument("--out", required=True, help="new output directory")
    parser.add_argument("--base", default=None, help="base model of LoRA adapters (default: the path recorded in "
                                                     "lora_config.json)")
    parser.add_argument("--dtype", default=None, choices=tuple(DTYPE_TAGS),
                        help="dtype of the written weights (default: the model's configured dtype)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from paddle_grpo.policy import quiet_paddlenlp
    from paddle_grpo.policy.hf_weights import WeightFormatError
    from paddle_grpo.policy.rope import RopeError

    quiet_paddlenlp()  # PaddleNLP's INFO lines (its banner, the classes it picks) are not what was written
    from paddle_grpo.policy.lora import LoRAError

    try:
        summary = export(args.source, args.out, base=args.base, dtype=args.dtype)
    except (ExportError, LoRAError, WeightFormatError, RopeError, OSError) as e:
        print(f"export_hf: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
