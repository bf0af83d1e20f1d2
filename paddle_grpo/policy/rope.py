"""Rotary position parameters as transformers reads them, and the scaled rotary tables PaddleNLP's layers lack.

transformers 4 writes `rope_theta` and `rope_scaling` at the top of config.json; transformers 5 writes both inside
`rope_parameters` (`{"rope_type": ..., "rope_theta": ..., "factor": ...}`) and neither at the top. PaddleNLP 3.0.0b4
reads only the top-level `rope_theta` (default 10000) and ignores `rope_scaling` (Qwen2 every type, Llama all but
"llama3"), so such a checkpoint would load with other logits and no message. Here:

- `parameters(config)`: the one dict (rope_type, rope_theta and the type's keys) from either layout;
- `normalize(config, where)`: sets the PaddleNLP config's `rope_theta` (and `rope_scaling`, transformers-4 style)
  from it before the model is built, so PaddleNLP's plain RoPE uses the right theta and a saved checkpoint says so;
  RopeError naming the key for a type not implemented here;
- `install(model)`: replaces each attention's `rotary_emb` by `ScaledRotary`, the tables of transformers'
  `ROPE_INIT_FUNCTIONS` (linear, dynamic, llama3, yarn), which PaddleNLP's forward and fast_decoder.py both read;
- `check(model)`: RopeError when a model's config asks for scaling its rotary layers do not compute.

"dynamic" (NTK) equals plain RoPE until a sequence passes `max_position_embeddings`, where transformers rescales
every position by the sequence's length; that part is refused at run time (the forward raises naming the key) rather
than computed. longrope, proportional and any other type are refused at load.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import paddle

__all__ = ["IMPLEMENTED", "RopeError", "ScaledRotary", "check", "install", "inv_freq", "normalize", "parameters",
           "scaling_of"]

IMPLEMENTED = ("default", "linear", "dynamic", "llama3", "yarn")


class RopeError(ValueError):
    """A rotary setting this project does not compute; the message names the file and key."""


def _get(config: Any, key: str, default: Any = None) -> Any:
    return config.get(key, default) if isinstance(config, dict) else getattr(config, key, default)


def parameters(config: Any) -> dict[str, Any]:
    """{"rope_type", "rope_theta", ...the type's keys} of a config (PaddleNLP/transformers object or config.json
    dict): transformers 5's `rope_parameters` when present, else transformers 4's top-level `rope_theta` and
    `rope_scaling` (its old spelling `type` read as `rope_type`); theta 10000 when neither says."""
    nested = _get(config, "rope_parameters")
    if isinstance(nested, dict) and nested:
        params = dict(nested)
        params.setdefault("rope_theta", _get(config, "rope_theta", 10000.0))
    else:
        params = dict(_get(config, "rope_scaling") or {})
        params["rope_theta"] = _get(config, "rope_theta", None) or 10000.0
    params["rope_type"] = params.get("rope_type") or params.pop("type", None) or "default"
    params.pop("type", None)
    params["rope_theta"] = float(params["rope_theta"])
    if params["rope_type"] in ("llama3", "yarn"):  # transformers' standardize_rope_params does the same
        params.setdefault("original_max_position_embeddings",
                          _get(config, "original_max_position_embeddings", None) or
                          _get(config, "max_position_embeddings"))
    return params


def _key(config: Any) -> str:
    """The config.json key a refusal names: where `parameters` read the type."""
    return "rope_parameters" if isinstance(_get(config, "rope_parameters"), dict) and \
        _get(config, "rope_parameters") else "rope_scaling"


def scaling_of(config: Any) -> dict[str, Any] | None:
    """The scaling part of `parameters(config)` (transformers 4's `rope_scaling`), None for plain RoPE."""
    params = parameters(config)
    if params["rope_type"] == "default":
        return None
    return {k: v for k, v in params.items() if k != "rope_theta"}


def normalize(config: Any, where: str) -> Any:
    """Set PaddleNLP config `config`'s `rope_theta` and `rope_scaling` from `parameters` (the file `where`'s either
    layout), before a model is built from it; returns `config`. RopeError naming the key for a type not in
    IMPLEMENTED, a partial rotary factor, or missing keys of an implemented type."""
    params = parameters(config)
    key, kind = _key(config), params["rope_type"]
    if kind not in IMPLEMENTED:
        raise RopeError(f"{where}: config.json {key}.rope_type is {kind!r}, which is not computed here "
                        f"(implemented: {', '.join(IMPLEMENTED)}); loading it with plain RoPE would give other "
                        "logits")
    factor = params.get("partial_rotary_factor", _get(config, "partial_rotary_factor", 1.0))
    if factor not in (None, 1, 1.0):
        raise RopeError(f"{where}: config.json partial_rotary_factor is {factor!r} (rotary on part of each head), "
                        "which PaddleNLP's Qwen2 and Llama do not compute")
    needed = {"linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor")}.get(kind, ())
    missing = [k for k in needed if params.get(k) is None]
    if missing:
        raise RopeError(f"{where}: config.json {key} has rope_type {kind!r} without {', '.join(missing)}")
    if kind != "default" and getattr(config, "rope_scaling_type", None):
        raise RopeError(f"{where}: config.json sets both {key} ({kind}) and PaddleNLP's rope_scaling_type "
                        f"({config.rope_scaling_type!r}); keep one")
    config.rope_theta = params["rope_theta"]
    config.rope_scaling = scaling_of(config)
    return config


def inv_freq(params: dict[str, Any], head_dim: int, max_position_embeddings: int) -> tuple[np.ndarray, float]:
    """(inverse frequencies float32 [head_dim / 2], attention factor applied to cos and sin) of rope parameters
    `params`, as transformers' ROPE_INIT_FUNCTIONS compute them (float32 like its torch code). "dynamic" gives its
    tables below `max_position_embeddings` (plain RoPE)."""
    base, dim, kind = params["rope_theta"], head_dim, params["rope_type"]
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    freq = (np.float32(1.0) / (np.float32(base) ** exponents)).astype(np.float32)
    if kind in ("default", "dynamic"):
        return freq, 1.0
    factor = float(params["factor"])
    if kind == "linear":
        return (freq / np.float32(factor)).astype(np.float32), 1.0
    if kind == "llama3":
        old = float(params["original_max_position_embeddings"])
        low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
        wavelen = np.float32(2 * math.pi) / freq
        scaled = np.where(wavelen > old / low, freq / np.float32(factor), freq).astype(np.float32)
        smooth = ((old / wavelen - low) / (high - low)).astype(np.float32)
        smoothed = (1 - smooth) * scaled / np.float32(factor) + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, smoothed, scaled).astype(np.float32), 1.0
    if kind == "yarn":
        return _yarn(params, dim, base, factor)
    raise RopeError(f"rope_type {kind!r} is not computed here (implemented: {', '.join(IMPLEMENTED)})")


def _yarn(params: dict[str, Any], dim: int, base: float, factor: float) -> tuple[np.ndarray, float]:
    """YaRN (arXiv 2309.00071) as transformers' `_compute_yarn_parameters`: frequencies blended between
    interpolated and extrapolated by a linear ramp over the dimensions, and cos/sin scaled by the attention factor."""
    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = params.get("attention_factor")
    if attention is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = params.get("beta_fast") or 32, params.get("beta_slow") or 1
    original = float(params["original_max_position_embeddings"])

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(fast), correction_dim(slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    pos = (np.float32(base) ** (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim))).astype(np.float32)
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - np.float32(low)) / np.float32(high - low), 0, 1)
    extrapolation = (1 - ramp).astype(np.float32)
    inv = (np.float32(1) / (np.float32(factor) * pos)) * (1 - extrapolation) + (np.float32(1) / pos) * extrapolation
    return inv.astype(np.float32), float(attention)


class ScaledRotary(paddle.nn.Layer):
    """A drop-in for PaddleNLP's Qwen2/Llama `rotary_emb` with transformers' tables for `params` (`inv_freq`):
    `cos_cached` / `sin_cached` [1, S, 1, head_dim], already multiplied by the attention factor (YaRN), as
    transformers multiplies cos and sin. `limit`: the longest sequence the tables are right for ("dynamic" only)."""

    def __init__(self, params: dict[str, Any], head_dim: int, max_position_embeddings: int):
        super().__init__()
        self.params = params
        freq, self.attention_factor = inv_freq(params, head_dim, max_position_embeddings)
        self.inv_freq = paddle.to_tensor(freq)
        self.limit = max_position_embeddings if params["rope_type"] == "dynamic" else None
        self._set_cos_sin_cache(max_position_embeddings)

    def check_length(self, seq_len: int) -> None:
        """RopeError when positions up to `seq_len` need dynamic NTK's rescaling, which is not computed here."""
        if self.limit is not None and seq_len > self.limit:
            raise RopeError(f"rope_type 'dynamic' (rope_scaling / rope_parameters) rescales every position once a "
                            f"sequence passes max_position_embeddings = {self.limit}; this one has {seq_len} "
                            "positions, which is not computed here (shorten max_prompt_len + max_new_tokens)")

    def _set_cos_sin_cache(self, seq_len: int) -> None:
        """Tables for positions [0, seq_len) (PaddleNLP's method name: fast_decoder.py calls it to grow them)."""
        self.check_length(seq_len)
        self.max_seq_len_cached = seq_len
        freqs = paddle.einsum("i,j->ij", paddle.arange(seq_len, dtype="float32"), self.inv_freq)
        emb = paddle.concat([freqs, freqs], axis=-1)
        self.cos_cached = (emb.cos() * self.attention_factor)[None, :, None, :]
        self.sin_cached = (emb.sin() * self.attention_factor)[None, :, None, :]

    def forward(self, x: paddle.Tensor, seq_len: int | None = None) -> tuple[paddle.Tensor, paddle.Tensor]:
        """(cos, sin) [1, seq_len, 1, head_dim] in x's dtype, as PaddleNLP's rotary layers return them."""
        self.check_length(seq_len)
        if seq_len > self.max_seq_len_cached:
            self._set_cos_sin_cache(seq_len)
        cos, sin = self.cos_cached[:, :seq_len], self.sin_cached[:, :seq_len]
        return cos.astype(x.dtype), sin.astype(x.dtype)


def _attentions(model: paddle.nn.Layer) -> list[paddle.nn.Layer]:
    return [m for m in model.sublayers() if hasattr(m, "rotary_emb") and hasattr(m, "q_proj")]


def install(model: paddle.nn.Layer) -> paddle.nn.Layer:
    """Give every attention layer of `model` a ScaledRotary when its config asks for rope scaling (after
    `normalize`); plain RoPE stays PaddleNLP's own. Returns `model`. RopeError for PaddleNLP's fused rope kernel
    with scaling (it computes plain RoPE)."""
    config = model.config
    scaling = scaling_of(config)
    if scaling is None:
        return model
    if getattr(config, "use_fused_rope", False):
        raise RopeError(f"config.json use_fused_rope with rope scaling ({scaling['rope_type']}): PaddleNLP's fused "
                        "rope kernel computes plain RoPE; turn use_fused_rope off")
    params = parameters(config)
    head_dim = config.hidden_size // config.num_attention_heads
    rotary = ScaledRotary(params, head_dim, int(config.max_position_embeddings))
    for attention in _attentions(model):
        attention.rotary_emb = rotary  # one table for all layers: the same for each
    return model


def check(model: paddle.nn.Layer) -> None:
    """RopeError when `model`'s config asks for rope scaling that its attention layers do not compute (a model
    built without `install`): it would run with other logits."""
    scaling = scaling_of(model.config)
    layers = _attentions(model)
    if scaling is None or not layers:
        return
    if not all(isinstance(a.rotary_emb, ScaledRotary) for a in layers):
        raise RopeError(f"the model's config asks for rope scaling {scaling} but its rotary layers are "
                        f"{type(layers[0].rotary_emb).__name__} (plain RoPE): load it with "
                        "paddle_grpo.policy.load_policy, which installs the scaled tables")
