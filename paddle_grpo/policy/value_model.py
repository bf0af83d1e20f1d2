"""`ValueModel`: a critic built from PaddleNLP's base model (`AutoModel`) and a value head, for the critics that are
not a PaddleNLP sequence classifier (critic.py): a family without one (Llama in PaddleNLP 3.0.0b4), and PaddleNLP's
own `AutoModelForScore` checkpoints read without PaddleNLP's class (`load_score_layout`).

Its state-dict names are a sequence classifier's (`<base_model_prefix>.*`, `score.weight`), so optimizer files and
parameter-name maps look the same for both. `save_pretrained` writes the backbone as PaddleNLP saves a base model
(config.json, weights; `merge_tensor_parallel` and `is_main_process` passed on) and the head in VALUE_HEAD_FILE.
"""
from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import paddle

from .hub import WEIGHT_FILES

# The value head's weights beside a ValueModel's backbone: {"weight": [hidden, 1]} and, if it has one, "bias" [1].
VALUE_HEAD_FILE = "value_head.pdparams"
# PaddleNLP's AutoModelForScore keys: the backbone under `model.`, the head `score_head`, running statistics of the
# score under `normalizer.` (unused by a critic: PaddleNLP loads critics with score_type critic, identity
# normalisation).
SCORE_BACKBONE, SCORE_HEAD, SCORE_NORMALIZER = "model.", "score_head.", "normalizer."


class ValueModel(paddle.nn.Layer):
    """Backbone (a PaddleNLP base model, e.g. LlamaModel) + value head (a Linear from the hidden size to 1).
    `.config` is the backbone's."""

    def __init__(self, backbone: paddle.nn.Layer, head: paddle.nn.Layer):
        super().__init__()
        self.base_model_prefix = backbone.base_model_prefix
        self.add_sublayer(self.base_model_prefix, backbone)
        self.score = head
        self.config = backbone.config

    def recompute_enable(self) -> None:
        """The backbone's recompute switch (PaddleNLP's `recompute_enable`)."""
        getattr(self, self.base_model_prefix).recompute_enable()

    def save_pretrained(self, out_dir: str, **kwargs: Any) -> None:
        """The backbone's `save_pretrained(out_dir, **kwargs)` and the head's weights in VALUE_HEAD_FILE."""
        getattr(self, self.base_model_prefix).save_pretrained(out_dir, **kwargs)
        if kwargs.get("is_main_process", True):
            paddle.save(self.score.state_dict(), os.path.join(out_dir, VALUE_HEAD_FILE))


def new_head(hidden_size: int, weight: np.ndarray | None = None, bias: np.ndarray | None = None,
             dtype: Any = "float32") -> paddle.nn.Linear:
    """The value head: `weight` [hidden_size, 1] (None: zeros) and optionally `bias` [1], in `dtype`."""
    head = paddle.nn.Linear(hidden_size, 1, bias_attr=None if bias is not None else False)
    with paddle.no_grad():
        head.weight.set_value(np.zeros([hidden_size, 1], "float32") if weight is None
                              else np.asarray(weight, "float32").reshape(hidden_size, 1))
        if bias is not None:
            head.bias.set_value(np.asarray(bias, "float32").reshape(1))
    head.to(dtype=dtype)
    return head


def load_value_model(path: str, config: Any, dtype: str, *, saved_head: bool, what: str) -> ValueModel:
    """A ValueModel of the local directory `path`: `AutoModel.from_pretrained` (a causal LM's decoder, its LM head
    dropped; or a saved ValueModel's backbone; this rank's shard under the config's tensor parallelism) and the
    head of VALUE_HEAD_FILE (`saved_head`) or a zero head. `what` names the model in errors."""
    from paddlenlp.transformers import AutoModel

    try:
        backbone = AutoModel.from_pretrained(path, config=config, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 PaddleNLP raises many kinds; name the model and the cause
        raise OSError(f"{what} could not be loaded with AutoModel (the critic's backbone): {type(exc).__name__}: "
                      f"{str(exc)[:500]}") from exc
    weight = bias = None
    if saved_head:
        head_file = os.path.join(path, VALUE_HEAD_FILE)
        saved = {k: v.numpy() for k, v in paddle.load(head_file).items()}
        if set(saved) - {"bias"} != {"weight"} or saved["weight"].shape != (config.hidden_size, 1):
            raise ValueError(f"{what}: {head_file} holds {({k: v.shape for k, v in saved.items()})}, not the value "
                             f"head's weight [{config.hidden_size}, 1] (and bias [1])")
        weight, bias = saved["weight"], saved.get("bias")
    return ValueModel(backbone, new_head(config.hidden_size, weight, bias, backbone.parameters()[0].dtype))


def backbone_class(config: Any) -> type:
    """PaddleNLP's base model class of `config`'s family, from its config class (Qwen2Config -> Qwen2Model), as
    AutoModelForScore builds its `model` (`AutoModel.from_config`)."""
    import paddlenlp.transformers as transformers

    name = type(config).__name__
    found = getattr(transformers, name[:-len("Config")] + "Model", None) if name.endswith("Config") else None
    if found is None:
        raise ValueError(f"no PaddleNLP base model class for {name} (model_type {getattr(config, 'model_type', None)})")
    return found


def read_weights(path: str) -> dict[str, np.ndarray]:
    """Every tensor of the model directory `path` as numpy, from the first weight file PaddleNLP would load
    (hub.WEIGHT_FILES: a safetensors or pdparams file, or an index of shards)."""
    from safetensors.numpy import load_file

    for name in WEIGHT_FILES:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            continue
        if name.endswith(".index.json"):
            with open(file, encoding="utf-8") as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        else:
            files = [name]
        out: dict[str, np.ndarray] = {}
        for shard in files:
            shard_path = os.path.join(path, shard)
            if shard.endswith(".safetensors"):
                out.update(load_file(shard_path))
            else:
                out.update({k: np.asarray(v) for k, v in paddle.load(shard_path, return_numpy=True).items()})
        return out
    raise FileNotFoundError(f"{path} holds none of the weight files {', '.join(WEIGHT_FILES)}")


def load_score_layout(path: str, config: Any, dtype: str, what: str) -> ValueModel:
    """A ValueModel of PaddleNLP's AutoModelForScore checkpoint in `path`, read without PaddleNLP's class:
    `model.*` (`<base_model_prefix>.*` in PaddleNLP's older LlamaModelForScore) is the backbone (split for this rank
    by the family's own tensor-parallel mappings when the config asks for it), `score_head` the value head (one
    output: score_dim 1); `normalizer.*` is dropped, as PaddleNLP itself loads a critic (score_type critic: identity
    normalisation). Anything else is an error naming it."""
    state = read_weights(path)
    cls = backbone_class(config)
    # AutoModelForScore keeps its backbone in `model`; PaddleNLP's older per-family classes (LlamaModelForScore) in
    # the family's own attribute (`llama`)
    prefix = SCORE_BACKBONE if any(k.startswith(SCORE_BACKBONE) for k in state) else cls.base_model_prefix + "."
    unknown = sorted(k for k in state if not k.startswith((prefix, SCORE_HEAD, SCORE_NORMALIZER)))
    weight, bias = state.get(SCORE_HEAD + "weight"), state.get(SCORE_HEAD + "bias")
    if unknown or weight is None or weight.shape != (config.hidden_size, 1):
        raise ValueError(f"{what}: not an AutoModelForScore checkpoint with one score ({prefix}*, score_head.weight "
                         f"[{config.hidden_size}, 1]): score_head.weight is "
                         f"{None if weight is None else list(weight.shape)}; unexpected keys {unknown[:5]}")
    config.architectures = [cls.__name__]  # the mappings' names then carry no prefix, as the backbone's own
    backbone_state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    if int(getattr(config, "tensor_parallel_degree", 1) or 1) > 1:
        for name, split in cls._get_tensor_parallel_mappings(config, is_split=True).items():
            if name in backbone_state:
                backbone_state[name] = split(backbone_state[name])
    backbone = cls.from_config(config, dtype=dtype)
    own = backbone.state_dict()
    misfit = sorted(set(own) ^ set(backbone_state)) or \
        [k for k in own if list(own[k].shape) != list(backbone_state[k].shape)]
    if misfit:
        raise ValueError(f"{what}: its model.* weights do not fit {cls.__name__} of its config.json (names or "
                         f"shapes differ: {misfit[:5]})")
    backbone.set_state_dict({k: paddle.to_tensor(v).astype(own[k].dtype) for k, v in backbone_state.items()})
    return ValueModel(backbone, new_head(config.hidden_size, weight, bias, backbone.parameters()[0].dtype))
