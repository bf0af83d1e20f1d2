"""Safetensors written by PyTorch (transformers' `save_pretrained`) made loadable by PaddleNLP, once, into a cache.

PaddleNLP 3.0.0b4's `from_pretrained` refuses a safetensors file whose metadata says `"format": "pt"` (every file
transformers writes) with `OSError: ... does not contain the valid metadata`; its `convert_from_torch=True` converts
but writes `model_state.pdparams` into the model's own directory. Here the conversion is PaddleNLP's own (the model
class's `_get_name_mappings`: each tensor renamed, linear weights transposed from torch's [out, in] to paddle's
[in, out]), run with numpy on the file's bytes, dtype kept (bfloat16 too), into a directory of the cache

    $PPNLP_HOME/converted/<name>-<12 hex digits of the source's path, sizes and modification times>/

with every other file of the source (config, tokenizer, chat template) copied beside it. `loadable_dir(path)`
returns that directory (converting the first time, and saying so in one log line), or `path` itself when its weights
are already PaddleNLP's. `hub.resolve_model_dir` calls it, so the tokenizer, the policy, the reference, the critic
and LoRA's base all read the same converted directory; `--dry_run` reports the same decision (`plan`) from the files'
headers only.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import time
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

__all__ = ["ConversionPlan", "WeightFormatError", "conversion_cache_dir", "loadable_dir", "name_mappings", "plan",
           "read_header", "read_safetensors", "to_paddlenlp", "weight_format", "write_safetensors"]

logger = logging.getLogger("paddle_grpo.policy")

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
# safetensors dtype tag -> numpy dtype of its bytes; BF16 is kept as its raw 16 bits (numpy has no bfloat16), which
# renaming and transposing leave untouched, and written back under the same tag.
DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": np.uint16, "I64": np.int64,
          "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
TAGS = {np.dtype(v): k for k, v in DTYPES.items() if k != "BF16"}
# Tensors a transformers checkpoint may hold that PaddleNLP's models do not load: rotary tables (recomputed from
# the config) and, with tied embeddings, the LM head (a copy of the embedding, which is what PaddleNLP ties it to).
_REDUNDANT_SUFFIXES = ("rotary_emb.inv_freq",)
_announced: set[str] = set()


class WeightFormatError(ValueError):
    """Weights PaddleNLP cannot load and this module cannot convert; the message names the file and why."""


def read_header(path: str) -> tuple[dict[str, dict[str, Any]], dict[str, str], int]:
    """(tensors: name -> {dtype, shape, data_offsets}, metadata, offset of the data) of safetensors file `path`,
    from its header alone (the format: 8 bytes little-endian header size, then the JSON header, then the data)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightFormatError(f"{path}: not a safetensors file (shorter than its 8-byte header size)")
        (size,) = struct.unpack("<Q", head)
        if size > os.path.getsize(path) - 8:
            raise WeightFormatError(f"{path}: not a safetensors file (header size {size} exceeds the file)")
        header = json.loads(f.read(size))
    metadata = header.pop("__metadata__", None) or {}
    return header, metadata, 8 + size


def read_safetensors(path: str) -> tuple[dict[str, tuple[str, np.ndarray]], dict[str, str]]:
    """({name: (dtype tag, array)}, metadata) of safetensors file `path`, the arrays memory-mapped (read-only)."""
    header, metadata, start = read_header(path)
    data = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if info["dtype"] not in DTYPES:
            raise WeightFormatError(f"{path}: tensor {name} has dtype {info['dtype']}, which is not converted here")
        begin, end = info["data_offsets"]
        out[name] = (info["dtype"], data[start + begin:start + end].view(DTYPES[info["dtype"]]).reshape(info["shape"]))
    return out, metadata


def write_safetensors(path: str, tensors: Iterable[tuple[str, str, np.ndarray]], metadata: dict[str, str]) -> int:
    """Write `tensors` ((name, dtype tag, array) in order) to safetensors file `path` with `metadata`; returns the
    bytes of tensor data. Arrays are written one at a time (a memory-mapped source is never read whole)."""
    items = list(tensors)
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for name, tag, array in items:
        size = int(np.prod(array.shape, dtype=np.int64)) * array.dtype.itemsize
        header[name] = {"dtype": tag, "shape": list(array.shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the data starts 8-byte aligned, as the safetensors library writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, _, array in items:
            f.write(np.ascontiguousarray(array).tobytes())
    return offset


def weight_files(directory: str) -> list[str]:
    """The safetensors files of `directory` (the index's shards, or model.safetensors); [] when it has none."""
    index = os.path.join(directory, INDEX)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            return sorted(set(json.load(f).get("weight_map", {}).values()))
    return [SINGLE] if os.path.isfile(os.path.join(directory, SINGLE)) else []


def weight_format(directory: str) -> str | None:
    """The `format` of the safetensors weights of `directory` as their metadata says it ("pt": written by PyTorch;
    "np" or "" (none): PaddleNLP's; others as written), None when it has no safetensors weights. Every file of a
    sharded checkpoint must agree (WeightFormatError otherwise)."""
    formats = {name: read_header(os.path.join(directory, name))[1].get("format", "")
               for name in weight_files(directory) if os.path.isfile(os.path.join(directory, name))}
    if not formats:
        return None
    if len(set(formats.values())) > 1:
        raise WeightFormatError(f"{directory}: its safetensors files disagree on their format: {formats}")
    return next(iter(formats.values()))


def conversion_cache_dir(directory: str) -> str:
    """Where the PaddleNLP copy of the PyTorch-written model in `directory` goes: under $PPNLP_HOME/converted
    (PaddleNLP's home, as this process's PaddleNLP reads it), named after the directory and a digest of its real
    path and the size and modification time of each file (a changed checkpoint gets a new copy)."""
    from paddlenlp.utils.env import MODEL_HOME  # $PPNLP_HOME/models

    real = os.path.realpath(directory)
    digest = hashlib.sha1(real.encode("utf-8"))
    for name in sorted(os.listdir(real)):
        full = os.path.join(real, name)
        if os.path.isfile(full):
            st = os.stat(full)
            digest.update(f"{name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode("utf-8"))
    base = os.path.basename(real.rstrip(os.sep)) or "model"
    return os.path.join(os.path.dirname(MODEL_HOME), "converted", f"{base}-{digest.hexdigest()[:12]}")


@dataclass
class ConversionPlan:
    """What loading the model in `source` takes: `convert` False (PaddleNLP reads it as is) or True (the
    PyTorch-written safetensors are converted into `target`, already there when `cached`). `tensors`, `nbytes`:
    the weights converted. `line`: the one sentence a run logs and the dry run prints about it."""

    source: str
    convert: bool
    target: str
    cached: bool = False
    tensors: int = 0
    nbytes: int = 0

    def line(self, key: str = "actor_model_name_or_path") -> str:
        """The sentence about this plan that the run logs and the dry run prints."""
        if not self.convert:
            return f"{key}: {self.source}: PaddleNLP safetensors, loaded as they are"
        what = (f"{key}: {self.source} holds safetensors written by PyTorch (transformers' save_pretrained, "
                f"{self.tensors} tensors, {self.nbytes / 2**20:.1f} MB), which PaddleNLP's from_pretrained refuses")
        if self.cached:
            return f"{what}; loading the PaddleNLP copy converted before: {self.target}"
        return f"{what}; converted once to PaddleNLP's layout into {self.target} (PPNLP_HOME) at start-up"


def _model_class(config: Any, directory: str) -> type:
    """The PaddleNLP class named by the config's `architectures`, which holds the name mapping from transformers'
    tensor names."""
    import paddlenlp.transformers as transformers

    names = list(getattr(config, "architectures", None) or [])
    for name in names:
        cls = getattr(transformers, name, None)
        if cls is not None and hasattr(cls, "_get_name_mappings"):
            return cls
    raise WeightFormatError(f"{directory}: its safetensors were written by PyTorch, and its config.json names "
                            f"architectures {names or 'none'}, none of which is a PaddleNLP model class with a "
                            "conversion from transformers' tensor names; save it with PaddleNLP's save_pretrained "
                            "(docs/models.md)")


def name_mappings(config: Any, directory: str) -> list[Any]:
    """PaddleNLP's own StateDictNameMapping list (transformers name -> PaddleNLP name, action) of the model class
    that `config.architectures` names; both directions use it (this module forward, tools/models/export_hf.py in
    reverse). WeightFormatError naming `directory` when there is no such class or it has no mapping."""
    cls = _model_class(config, directory)
    try:
        return cls._get_name_mappings(config)
    except NotImplementedError:
        raise WeightFormatError(f"{directory}: PaddleNLP's {cls.__name__} has no conversion from transformers' "
                                "tensor names") from None


def _mapping(directory: str) -> tuple[dict[str, Any], set[str], Any]:
    """({transformers name: PaddleNLP's StateDictNameMapping}, the PaddleNLP names every checkpoint must hold,
    config) for the model in `directory`, from its PaddleNLP config class and model class."""
    from paddlenlp.transformers import AutoConfig

    config = AutoConfig.from_pretrained(directory)
    mappings = name_mappings(config, directory)
    by_source = {m.source_name: m for m in mappings}
    required = {m.target_name for m in mappings if not m.source_name.endswith(_REDUNDANT_SUFFIXES)}
    return by_source, required, config


def _redundant(name: str, config: Any) -> bool:
    return name.endswith(_REDUNDANT_SUFFIXES) or (name == "lm_head.weight" and
                                                  bool(getattr(config, "tie_word_embeddings", False)))


def _check_names(directory: str, names: Iterable[str], by_source: dict, required: set, config: Any) -> None:
    """Every tensor of the checkpoint maps to a PaddleNLP name (or is redundant), and every PaddleNLP tensor the
    model needs is there; WeightFormatError naming the first few otherwise (nothing would load them, or PaddleNLP
    would leave them randomly initialised)."""
    names = set(names)
    unknown = sorted(n for n in names if n not in by_source and not _redundant(n, config))
    missing = sorted(required - {by_source[n].target_name for n in names if n in by_source})
    if unknown or missing:
        parts = ([f"{len(unknown)} tensors PaddleNLP's {config.architectures[0]} has no place for "
                  f"({', '.join(unknown[:5])}{', ...' if len(unknown) > 5 else ''})"] if unknown else []) + \
                ([f"no tensor for {len(missing)} of its weights ({', '.join(missing[:5])}"
                  f"{', ...' if len(missing) > 5 else ''})"] if missing else [])
        raise WeightFormatError(f"{directory}: its PyTorch safetensors do not convert to PaddleNLP's "
                                f"{config.architectures[0]}: {'; '.join(parts)}")


def to_paddlenlp(directory: str, tensors: Iterable[tuple[str, str, np.ndarray]],
                 names: Iterable[str]) -> list[tuple[str, str, np.ndarray]]:
    """(PaddleNLP name, dtype tag, array) of each (transformers name, tag, array) of `tensors`, for the model whose
    config.json is in `directory`: PaddleNLP's own name mapping of its class (renames, [out, in] -> [in, out]).
    `names`: every tensor name of the checkpoint, checked first (`_check_names`: all map, none is missing);
    redundant tensors (a tied LM head, rotary tables) are dropped."""
    by_source, required, config = _mapping(directory)
    _check_names(directory, names, by_source, required, config)
    # A tied causal LM's head is its embedding; PaddleNLP's save_pretrained writes it under lm_head.weight too, and
    # its loader warns that lm_head.weight is "newly initialized" when it is absent (it is not: it is tied).
    tied_head = bool(getattr(config, "tie_word_embeddings", False)) and \
        any(a.endswith("ForCausalLM") for a in config.architectures or [])
    out = []
    for name, tag, array in tensors:
        if name in by_source:
            m = by_source[name]
            out.append((m.target_name, tag, m.run({name: array}, name)))  # PaddleNLP's action, on numpy arrays
            if tied_head and name.endswith("embed_tokens.weight"):
                out.append(("lm_head.weight", tag, out[-1][2]))
    return out


def plan(directory: str) -> ConversionPlan:
    """How the weights of model directory `directory` will load (headers and config only: nothing converted).
    WeightFormatError when PaddleNLP cannot read them and they cannot be converted (an unknown `format`, a model
    class without a conversion, tensors that do not map)."""
    fmt = weight_format(directory)
    if fmt in (None, "np", ""):
        return ConversionPlan(directory, False, directory)
    files = weight_files(directory)
    if fmt == "pd":  # PaddleNLP 3.0.0b4: "Currently unsupport paddle weights file, use numpy instead"
        raise WeightFormatError(f"{directory}: {files[0]} says format 'pd' (paddle tensors), which PaddleNLP's "
                                "from_pretrained refuses; save it with PaddleNLP's save_pretrained (format 'np')")
    if fmt != "pt":
        raise WeightFormatError(f"{directory}: {files[0]} says format {fmt!r}: neither PaddleNLP's ('np') nor "
                                "PyTorch's ('pt', converted at start-up)")
    by_source, required, config = _mapping(directory)
    headers = [read_header(os.path.join(directory, name))[0] for name in files]
    names = [n for h in headers for n in h]
    _check_names(directory, names, by_source, required, config)
    nbytes = sum(info["data_offsets"][1] - info["data_offsets"][0] for h in headers for info in h.values())
    target = conversion_cache_dir(directory)
    return ConversionPlan(directory, True, target, cached=os.path.isfile(os.path.join(target, ".converted")),
                          tensors=len(names), nbytes=nbytes)


def _convert(p: ConversionPlan) -> None:
    """Write the PaddleNLP copy of `p.source` into `p.target`: each shard converted on its own (tensor by tensor,
    memory-mapped), the index's names mapped, every other file copied. Built in a temporary sibling and renamed
    into place, so concurrent ranks and an interrupted conversion never leave a half-written copy."""
    tmp = f"{p.target}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    shards = weight_files(p.source)
    names = [n for shard in shards for n in read_header(os.path.join(p.source, shard))[0]]
    weight_map = {}
    for shard in shards:
        tensors, _ = read_safetensors(os.path.join(p.source, shard))
        out = to_paddlenlp(p.source, ((n, tag, a) for n, (tag, a) in tensors.items()), names)
        write_safetensors(os.path.join(tmp, shard), out, {"format": "np"})
        weight_map.update({name: shard for name, _, _ in out})
    index = os.path.join(p.source, INDEX)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as f:
            data = json.load(f)
        data["weight_map"] = weight_map
        with open(os.path.join(tmp, INDEX), "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
    skip = set(weight_files(p.source)) | {INDEX}
    for name in os.listdir(p.source):
        full = os.path.join(p.source, name)
        if name not in skip and os.path.isfile(full) and not name.endswith((".bin", ".pdparams", ".pt", ".pth")):
            shutil.copy2(full, os.path.join(tmp, name))
    with open(os.path.join(tmp, ".converted"), "w", encoding="utf-8") as f:
        json.dump({"source": os.path.realpath(p.source), "tensors": p.tensors}, f)
    try:
        os.rename(tmp, p.target)
    except OSError:  # another rank (or process) renamed its copy first: the same bytes; keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
        if not os.path.isfile(os.path.join(p.target, ".converted")):
            raise


def loadable_dir(directory: str, key: str = "actor_model_name_or_path") -> str:
    """`directory` itself when PaddleNLP loads its weights as they are; for safetensors written by PyTorch, the
    PaddleNLP copy in the cache (`conversion_cache_dir`), converted the first time. Logs the decision once per
    process for a converted model (`ConversionPlan.line`)."""
    p = plan(directory)
    if not p.convert:
        return directory
    if not p.cached:
        os.makedirs(os.path.dirname(p.target), exist_ok=True)
        start = time.perf_counter()
        _convert(p)
        logger.info(f"{p.line(key)} ({time.perf_counter() - start:.1f} s)")
        _announced.add(p.target)
    elif p.target not in _announced:
        logger.info(p.line(key))
        _announced.add(p.target)
    return p.target
