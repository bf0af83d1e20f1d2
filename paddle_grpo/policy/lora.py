"""LoRA for the policy, through `paddlenlp.peft` (LoRAConfig / LoRAModel of PaddleNLP 3.0.0b4).

- `apply_lora(model, rank, alpha, dropout, target_modules)` wraps a causal LM in a `LoRAModel`: every linear layer
  whose dotted name fully matches one of the `target_modules` regexes gets a rank-`rank` adapter
  `W x + (alpha / rank) * B A x` (A random, B = 0, so the wrapped model starts out equal to the base model), and
  only the adapter weights are trainable (`stop_gradient` is True on every base weight). The wrapper forwards
  `get_decoder`, `get_output_embeddings`, `config` and the forward pass, so `causal.completion_logprobs` and
  `rollout.generate` use it like the plain model.
- `adapters_disabled(model)`: the reference model. Inside the context the adapters are switched off (and the
  model is in eval mode, as a frozen reference is), so the same weights compute exactly the base model's outputs:
  no second copy of the weights is ever made.
- `merged_weight(layer)` / `merge_refusal(model)`: a LoRALinear's inference weight W + scaling * A @ B as a fresh
  tensor (its parameters untouched), for sampling on the lean decoder path (fast_decoder.sampling_decoder: merged
  once per rollout); the update keeps running PaddleNLP's LoRA forward.
- `save_adapters` / `load_adapters`: PaddleNLP's own adapter format, `lora_model_state.pdparams` (the adapter
  weights only) + `lora_config.json` (rank, alpha, dropout, target modules and `base_model_name_or_path`, the base
  model the adapters belong to) + the base model's `config.json`. `LoRAModel.from_pretrained` reads it, and so
  does PaddleNLP's own `lora_path`. Loading checks names, shapes and the LoRA settings against the model instead
  of silently skipping mismatches (which is what paddle's set_state_dict does).
- `merge_into_base(base_dir, adapter_dir, out_dir)`: W <- W + scaling * A @ B for each adapted layer, written as a
  full model with `save_pretrained` (loadable by `AutoModelForCausalLM`, no paddlenlp.peft needed to use it).

Left out on purpose: the LoRA variants of paddlenlp.peft (rsLoRA, LoRA+, PiSSA, MoRA, LoRA-GA, QAT, quick LoRA):
the trainer exposes plain LoRA only, and `load_adapters` / `merge_into_base` refuse adapters saved with a variant
rather than computing something else. Tensor-parallel LoRA layers are PaddleNLP's and cannot be run on CPU here.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import paddle

from .hub import resolve_model_dir

if TYPE_CHECKING:
    from paddlenlp.peft import LoRAConfig, LoRAModel

logger = logging.getLogger("paddle_grpo.policy.lora")

# Every linear projection of a Qwen2 (and Llama-style) decoder layer: attention q/k/v/o and the MLP. PaddleNLP's
# `get_lora_target_modules` uses the same layers for qwen2 (written `.*q_proj.*`); these are anchored at the end
# so that a pattern never reaches into a sublayer of an adapted layer. `qkv_proj` / `gate_up_fused_proj` are the
# fused variants (`fuse_attention_qkv` / `fuse_attention_ffn`). Patterns are matched with `re.fullmatch` against
# the names of `model.named_sublayers()`, e.g. `qwen2.layers.0.self_attn.q_proj`.
DEFAULT_TARGET_MODULES = (
    r".*\.q_proj", r".*\.k_proj", r".*\.v_proj", r".*\.o_proj", r".*\.qkv_proj",
    r".*\.gate_proj", r".*\.up_proj", r".*\.down_proj", r".*\.gate_up_fused_proj",
)

ADAPTER_WEIGHTS = "lora_model_state.pdparams"   # paddlenlp.utils.env.LORA_WEIGHTS_NAME
ADAPTER_CONFIG = "lora_config.json"             # paddlenlp.utils.env.LORA_CONFIG_NAME
# paddlenlp.peft variants this module does not train, load or merge (their saved A/B alone do not give W + BA).
_VARIANTS = ("rslora", "pissa", "use_mora", "lora_use_mixer", "loraga", "do_qat")


class LoRAError(ValueError):
    """A LoRA setting or adapter directory that cannot be used; the message says which and why."""


# ----------------------------------------------------------------------------------------------------- apply

def _linear_types():
    """Layer types paddlenlp.peft can put an adapter on (dense and tensor/sequence-parallel linear layers)."""
    from paddlenlp.transformers import linear_utils

    from ..parallel import tensor_parallel_linear_types

    return (paddle.nn.Linear, *tensor_parallel_linear_types(), linear_utils.ColumnSequenceParallelLinear,
            linear_utils.RowSequenceParallelLinear)


def _lora_types():
    from paddlenlp.peft.lora.lora_model import AVAILABLE_LAYERS

    return tuple(AVAILABLE_LAYERS)


def is_lora_model(model: paddle.nn.Layer) -> bool:
    from paddlenlp.peft import LoRAModel

    return isinstance(model, LoRAModel)


def resolve_target_modules(model: paddle.nn.Layer, target_modules: str | Sequence[str] | None = None
                           ) -> tuple[list[str], dict[str, str]]:
    """The regexes to adapt and the layers they select: `(patterns, {layer name: pattern})`.

    `target_modules` None/empty: DEFAULT_TARGET_MODULES, keeping those that match this model (at least one must).
    Given explicitly: every pattern must be a valid regex that matches at least one layer, and everything it
    matches must be a linear layer; otherwise LoRAError says which pattern and lists the model's linear layers.
    """
    if isinstance(target_modules, str):
        target_modules = [target_modules]
    explicit = bool(target_modules)
    patterns = list(target_modules) if explicit else list(DEFAULT_TARGET_MODULES)
    linear = _linear_types()
    layers = [(name, layer) for name, layer in model.named_sublayers() if name]
    linear_names = [name for name, layer in layers if isinstance(layer, linear)]
    kinds = sorted({re.sub(r"\.\d+\.", ".N.", n) for n in linear_names})
    available = "; linear layers of this model: " + ", ".join(kinds) if kinds else "; this model has no linear layer"
    selected, kept = {}, []
    for pattern in patterns:
        if not isinstance(pattern, str) or not pattern:
            raise LoRAError(f"target_modules: {pattern!r} is not a regular expression string")
        try:
            regex = re.compile(pattern)
        except re.error as e:
            raise LoRAError(f"target_modules: '{pattern}' is not a valid regular expression ({e})") from None
        hits = [(name, layer) for name, layer in layers if regex.fullmatch(name)]
        if not hits:
            if explicit:
                raise LoRAError(f"target_modules: '{pattern}' matches no module of {type(model).__name__} (patterns "
                                f"must match the whole dotted name, e.g. '.*\\.q_proj'){available}")
            continue
        bad = [(name, layer) for name, layer in hits if not isinstance(layer, linear)]
        if bad:
            name, layer = bad[0]
            hint = "; anchor the pattern, e.g. '.*\\.q_proj'" if len(bad) < len(hits) else ""
            raise LoRAError(f"target_modules: '{pattern}' matches {name} ({type(layer).__name__}), which is not a "
                            f"linear layer (LoRA adapts linear layers only{hint}){available}")
        kept.append(pattern)
        for name, _ in hits:
            selected.setdefault(name, pattern)
    if not selected:
        raise LoRAError(f"target_modules: none of the default patterns {list(DEFAULT_TARGET_MODULES)} matches a "
                        f"module of {type(model).__name__}; set target_modules{available}")
    return kept, selected


def apply_lora(model: paddle.nn.Layer, rank: int = 8, alpha: float = 16, dropout: float = 0.0,
               target_modules: str | Sequence[str] | None = None, *, base_model_name_or_path: str | None = None
               ) -> LoRAModel:
    """Wrap `model` (a PaddleNLP causal LM, float32 or not) in a paddlenlp.peft `LoRAModel`; returns the wrapper.

    rank: adapter rank r (>= 1); alpha: scaling numerator, the update is (alpha / r) * B A; dropout: dropout on the
    adapter input during training (0 disables it); target_modules: regexes for `re.fullmatch` on layer names
    (None: DEFAULT_TARGET_MODULES, those present). base_model_name_or_path: recorded in the saved lora_config.json
    so that tools/models/merge_lora.py finds the base model; default the model config's `_name_or_path` when set.
    Only adapter weights are trainable afterwards; the count is logged (`parameter_counts`).
    The layers of `model` are replaced in place: keep using the returned wrapper, not `model`.
    """
    from paddlenlp.peft import LoRAConfig, LoRAModel

    if is_lora_model(model):
        raise LoRAError("apply_lora: the model already has LoRA adapters")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 1:
        raise LoRAError(f"lora_rank must be a positive integer, got {rank!r}")
    if not alpha > 0:
        raise LoRAError(f"lora_alpha must be positive, got {alpha!r}")
    if not 0.0 <= dropout < 1.0:
        raise LoRAError(f"lora_dropout must be in [0, 1), got {dropout!r}")
    patterns, selected = resolve_target_modules(model, target_modules)
    weight = next(iter(model.parameters()))
    config = LoRAConfig(
        r=int(rank), lora_alpha=alpha, lora_dropout=float(dropout), target_modules=patterns,
        tensor_parallel_degree=getattr(model.config, "tensor_parallel_degree", 1),
        dtype=str(weight.dtype).replace("paddle.", ""),
        base_model_name_or_path=_abs(base_model_name_or_path or getattr(model.config, "_name_or_path", None)))
    originals = {name: model.get_sublayer(name) for name in selected}  # share W and b with the LoRA layers
    wrapped = LoRAModel(model, config)
    wrapped._base_layers = originals  # a plain dict attribute: not registered as sublayers, no extra weights
    adapted = [name for name, layer in wrapped.model.named_sublayers() if isinstance(layer, _lora_types())]
    if sorted(adapted) != sorted(selected):  # paddlenlp.peft selected something else than we resolved
        raise LoRAError(f"paddlenlp.peft adapted {len(adapted)} layers, expected {len(selected)}: "
                        f"{sorted(set(adapted) ^ set(selected))[:5]}")
    if getattr(model.config, "recompute", False):
        _make_embedding_output_require_grad(wrapped)
    trainable, total = parameter_counts(wrapped)
    logger.info("LoRA r=%d alpha=%s dropout=%s on %d layers (%s): %d trainable parameters of %d (%.2f%%)",
                rank, alpha, dropout, len(adapted), ", ".join(patterns), trainable, total, 100.0 * trainable / total)
    return wrapped


def _abs(path):
    return os.path.abspath(path) if path and os.path.isdir(path) else (path or None)


def _make_embedding_output_require_grad(model):
    """With activation recompute, PaddleNLP's Qwen2/Llama decoder recomputes a layer only when its input hidden
    states require a gradient. Once the embedding is frozen the first layer's input does not (later layers' inputs
    do, through the adapters), so that layer would silently keep its activations. Marking the embedding output as
    requiring a gradient (the embedding weight stays frozen) recomputes it too; this is what Hugging Face's
    `enable_input_require_grads` does for PEFT + gradient checkpointing."""
    embeddings = model.get_input_embeddings()

    def hook(layer, inputs, output):
        output.stop_gradient = False
        return output

    embeddings.register_forward_post_hook(hook)


def trainable_parameters(model: paddle.nn.Layer) -> list[paddle.Tensor]:
    """The parameters an optimizer should update (under LoRA: the adapters only)."""
    return [p for p in model.parameters() if not p.stop_gradient]


def parameter_counts(model: paddle.nn.Layer) -> tuple[int, int]:
    """(trainable, total) numbers of parameter elements."""
    trainable = total = 0
    for p in model.parameters():
        n = int(np.prod(p.shape))
        total += n
        trainable += 0 if p.stop_gradient else n
    return trainable, total


def lora_layers(model: paddle.nn.Layer) -> dict[str, paddle.nn.Layer]:
    """{dotted name: layer} of the adapted layers."""
    inner = model.model if is_lora_model(model) else model
    return {name: layer for name, layer in inner.named_sublayers() if isinstance(layer, _lora_types())}


# ----------------------------------------------------------------------------------- merged weights (sampling)

# LoRALinear options whose adapter is not the plain `x A B * scaling` (mixer: x A AB B; MoRA: a rotated square
# matrix; PiSSA: W itself rewritten at the first forward): a merged weight would compute something else.
_NOT_PLAIN = ("use_mora", "lora_use_mixer", "pissa")


def merge_refusal(model: LoRAModel) -> str | None:
    """None when every adapter of `model` (a LoRAModel) folds into a weight copy by `merged_weight`: each LoRA layer
    is a plain `LoRALinear` (not a tensor-parallel, quantised or other LoRA type), without MoRA, the mixer or PiSSA.
    Otherwise the reason, naming the layer. rsLoRA changes `scaling` only (alpha / sqrt(r)): accepted."""
    from paddlenlp.peft.lora import LoRALinear

    for name, layer in lora_layers(model).items():
        if type(layer) is not LoRALinear:
            return f"{name} is {type(layer).__name__} (adapters are merged from a plain LoRALinear only)"
        used = [flag for flag in _NOT_PLAIN if getattr(layer, flag, False)]
        if used:
            return f"{name} uses {', '.join(used)} (not W + scaling * A @ B)"
    return None


def merged_weight(layer: paddle.nn.Linear) -> paddle.Tensor:
    """The weight [in, out] a LoRALinear `layer` computes with at inference, as a new tensor without gradient:
    W + (A [in, r] @ B [r, out]) * scaling (PaddleNLP's `get_delta_weight` and `merge`; dropout acts in training
    only), or W itself (no copy) for a plain nn.Linear, an adapter switched off (`disable_lora`, the reference) or
    one already merged into W. Its parameters are read, never written. Call it for layers `merge_refusal` accepts."""
    if not isinstance(layer, _lora_types()) or layer.disable_lora or layer.merged:
        return layer.weight
    with paddle.no_grad():
        return layer.weight + layer.get_delta_weight()


# -------------------------------------------------------------------------------------------------- reference

@contextlib.contextmanager
def adapters_disabled(model: LoRAModel) -> Iterator[LoRAModel]:
    """Inside the context `model` computes the base model: every adapter is bypassed and every layer is in eval
    mode (as the frozen reference model is; matters when lora_dropout or a base dropout is non-zero). The previous
    adapter switches and train/eval flags are restored on exit, also after an exception.

    The outputs equal the base model's bit for bit: a bypassed LoRALinear runs exactly `F.linear(x, W, b)`.
    Refuses a model whose adapters are merged into W (bypassing them would then not give the base model)."""
    layers = lora_layers(model)
    if not layers:
        raise LoRAError("adapters_disabled: the model has no LoRA layers (apply_lora first)")
    merged = [name for name, layer in layers.items() if getattr(layer, "merged", False)]
    if merged:
        raise LoRAError(f"adapters_disabled: adapters are merged into the base weights ({merged[0]}, ...); "
                        "unmerge them first")
    switches = {name: layer.disable_lora for name, layer in layers.items()}
    modes = [(layer, layer.training) for layer in [model, *model.sublayers()]]
    try:
        for layer in layers.values():
            layer.disable_lora = True
        for layer, _ in modes:
            layer.training = False
        yield model
    finally:
        for name, layer in layers.items():
            layer.disable_lora = switches[name]
        for layer, training in modes:
            layer.training = training


# ------------------------------------------------------------------------------------------------ save / load

def save_adapters(model: LoRAModel, out_dir: str, *, is_main_process: bool = True,
                  merge_tensor_parallel: bool = False) -> str:
    """Write the adapters of `model` (a LoRAModel) to `out_dir` in paddlenlp.peft's format; returns `out_dir`.

    Files: lora_model_state.pdparams (trainable = adapter weights only), lora_config.json (incl.
    base_model_name_or_path), config.json (the base model's configuration, as PaddleNLP writes it)."""
    if not is_lora_model(model):
        raise LoRAError("save_adapters: the model has no LoRA adapters (apply_lora first)")
    model.save_pretrained(out_dir, is_main_process=is_main_process, merge_tensor_parallel=merge_tensor_parallel)
    return out_dir


def is_adapter_dir(path: str | None) -> bool:
    return bool(path) and os.path.isfile(os.path.join(path, ADAPTER_CONFIG))


def read_adapter_config(adapter_dir: str) -> LoRAConfig:
    """The saved LoRAConfig of `adapter_dir`; LoRAError when it is not an adapter directory or uses a variant."""
    from paddlenlp.peft import LoRAConfig

    if not is_adapter_dir(adapter_dir):
        what = "does not exist" if not os.path.isdir(adapter_dir or "") else f"has no {ADAPTER_CONFIG}"
        raise LoRAError(f"'{adapter_dir}' is not a LoRA adapter directory: it {what} (written by save_adapters, "
                        "a LoRA checkpoint of run_rl.py, or PaddleNLP's LoRA fine-tuning)")
    config = LoRAConfig.from_pretrained(adapter_dir)
    used = [v for v in _VARIANTS if getattr(config, v, False)]
    if used:
        raise LoRAError(f"{os.path.join(adapter_dir, ADAPTER_CONFIG)}: adapters saved with {', '.join(used)}, "
                        "which paddle_grpo does not support (plain LoRA only)")
    if not config.target_modules:
        raise LoRAError(f"{os.path.join(adapter_dir, ADAPTER_CONFIG)}: target_modules is empty")
    return config


def _read_adapter_weights(adapter_dir):
    path = os.path.join(adapter_dir, ADAPTER_WEIGHTS)
    if not os.path.isfile(path):
        present = sorted(f for f in os.listdir(adapter_dir) if f.startswith("lora_model_state") or
                         f.startswith("peft_model"))
        hint = (f" (found {', '.join(present)}: tensor-parallel shards or safetensors; save with "
                "merge_tensor_parallel or load with paddlenlp.peft.LoRAModel.from_pretrained)") if present else ""
        raise LoRAError(f"{adapter_dir}: no {ADAPTER_WEIGHTS}{hint}")
    return paddle.load(path, return_numpy=True)


def apply_saved_lora(model: paddle.nn.Layer, config: LoRAConfig) -> LoRAModel:
    """`apply_lora` with the settings of a saved adapter config (`read_adapter_config`): rank, alpha, dropout, target
    modules and base model; the adapters fresh (load_adapters then loads their weights)."""
    return apply_lora(model, rank=config.r, alpha=config.lora_alpha, dropout=config.lora_dropout,
                      target_modules=config.target_modules, base_model_name_or_path=config.base_model_name_or_path)


def load_adapters(model: paddle.nn.Layer, adapter_dir: str) -> LoRAModel:
    """Load adapters saved in `adapter_dir` into `model`; returns the LoRAModel.

    `model` a plain causal LM: the adapters are created with the saved settings (rank, alpha, dropout, target
    modules; PaddleNLP's `lora_path` semantics), then loaded. `model` already a LoRAModel (resuming): its rank and
    alpha must equal the saved ones. Either way every adapter weight must be present with its shape and nothing
    else may be in the file (so the adapted layers agree): a mismatch raises LoRAError instead of being skipped."""
    config = read_adapter_config(adapter_dir)
    state = _read_adapter_weights(adapter_dir)
    if not is_lora_model(model):
        model = apply_saved_lora(model, config)
    else:  # the adapted layers are compared through the weight names below; dropout does not matter
        for key in ("r", "lora_alpha"):
            ours, theirs = getattr(model.lora_config, key), getattr(config, key)
            if ours != theirs:
                raise LoRAError(f"{adapter_dir}: saved adapters have {key} = {theirs!r}, the model's are "
                                f"{ours!r}")
    expected = {k: tuple(v.shape) for k, v in model.get_trainable_state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise LoRAError(f"{adapter_dir}: adapter weights do not fit the model: missing {missing[:3]}"
                        f"{' ...' if len(missing) > 3 else ''}, unexpected {unexpected[:3]}"
                        f"{' ...' if len(unexpected) > 3 else ''} ({len(missing)} missing, {len(unexpected)} "
                        "unexpected)")
    tp = getattr(model.model.config, "tensor_parallel_degree", 1)
    if tp > 1 and (config.tensor_parallel_degree or -1) <= 1:  # a merged (full) file: split it for this rank
        state = model._convert_tensor_parallel(lora_state_dict=state)
    wrong = [(k, tuple(state[k].shape), expected[k]) for k in expected if tuple(state[k].shape) != expected[k]]
    if wrong:
        k, got, want = wrong[0]
        raise LoRAError(f"{adapter_dir}: {k} has shape {list(got)}, the model expects {list(want)} "
                        f"({len(wrong)} mismatched)")
    params = model.model.state_dict()
    with paddle.no_grad():
        for k in expected:
            params[k].set_value(paddle.to_tensor(state[k], dtype=params[k].dtype))
    return model


# ------------------------------------------------------------------------------------------------------ merge

def merge_adapters(model: LoRAModel) -> paddle.nn.Layer:
    """Fold the adapters of a LoRAModel into its base weights (W <- W + scaling * A @ B, paddlenlp.peft's
    `merge`) and return the plain base model with its original linear layers back in place (the LoRAModel is
    unusable afterwards)."""
    if not is_lora_model(model):
        raise LoRAError("merge_adapters: the model has no LoRA adapters")
    layers = lora_layers(model)
    originals = getattr(model, "_base_layers", {})
    model.merge()  # in place: set_value on the weight parameters, which the original layers share
    base = model.model
    for name, layer in layers.items():
        parent_name, _, attr = name.rpartition(".")
        parent = base.get_sublayer(parent_name) if parent_name else base
        original = originals.get(name)
        if original is None:  # wrapped elsewhere (LoRAModel.from_pretrained): rebuild a dense layer around W
            if not isinstance(layer, paddle.nn.Linear):
                raise LoRAError(f"merge_adapters: cannot restore {name} ({type(layer).__name__})")
            original = paddle.nn.Linear(layer.weight.shape[0], layer.weight.shape[1],
                                        bias_attr=False if layer.bias is None else None)
            original.weight = layer.weight
            if layer.bias is not None:
                original.bias = layer.bias
        assert original.weight is layer.weight
        setattr(parent, attr, original)
    return base


def merge_into_base(base_dir: str | None, adapter_dir: str, out_dir: str, *, dtype: str | None = None,
                    tokenizer_dir: str | None = None, check: bool = True) -> float | None:
    """Write base + adapters as one full model to `out_dir` (`save_pretrained`; loads with AutoModelForCausalLM).

    base_dir: the base model (None: the base_model_name_or_path recorded with the adapters). The merge is done in
    float32 and the result saved in `dtype` (default: the base model's configured dtype). The tokenizer of
    `tokenizer_dir` (default: the adapter directory if it has one, e.g. a checkpoint, else the base model) is
    saved alongside. With `check`, the logits of a few random tokens are compared before and after merging (same
    weights in memory, no second copy); returns that max abs difference (None without check). In float32 it is
    rounding only: (x W + s (x A) B) vs x (W + s A B), ~1e-6 relative to the logits."""
    from paddlenlp.transformers import AutoConfig, AutoModelForCausalLM

    config = read_adapter_config(adapter_dir)
    base_dir = base_dir or config.base_model_name_or_path
    try:  # a directory, or the hub ID the adapters were trained on (PaddleNLP's cache)
        base_dir = resolve_model_dir(base_dir or "", key="base model")
    except FileNotFoundError as e:
        raise LoRAError(f"base model directory '{base_dir}' not found (pass it explicitly; the adapters record "
                        f"base_model_name_or_path = {config.base_model_name_or_path!r}): {e}") from None
    base_config = AutoConfig.from_pretrained(base_dir)
    dtype = dtype or getattr(base_config, "dtype", None) or "float32"
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype="float32")
    model.eval()
    lora = load_adapters(model, adapter_dir)
    lora.eval()
    probe = None
    if check:
        rng = np.random.default_rng(0)
        probe = paddle.to_tensor(rng.integers(0, base_config.vocab_size, size=(2, 16)), dtype="int64")
        with paddle.no_grad():
            before = lora(input_ids=probe, return_dict=True).logits.numpy()
    merged = merge_adapters(lora)
    del lora
    assert isinstance(merged, type(model)) and not lora_layers(merged)
    diff = None
    if check:
        with paddle.no_grad():
            after = merged(input_ids=probe, return_dict=True).logits.numpy()
        diff = float(np.abs(after - before).max())
        scale = max(1.0, float(np.abs(before).max()))
        if not np.isfinite(diff) or diff > 1e-4 * scale:
            raise LoRAError(f"merged model differs from base + adapters by {diff:g} (logits up to {scale:g})")
    if str(dtype) != "float32":
        merged.to(dtype=dtype)
    os.makedirs(out_dir, exist_ok=True)
    merged.save_pretrained(out_dir)
    _save_tokenizer(tokenizer_dir or (adapter_dir if _has_tokenizer(adapter_dir) else base_dir), out_dir)
    with open(os.path.join(out_dir, "merge_info.json"), "w", encoding="utf-8") as f:
        json.dump({"base_model": os.path.abspath(base_dir), "adapters": os.path.abspath(adapter_dir),
                   "r": config.r, "lora_alpha": config.lora_alpha, "scaling": config.scaling,
                   "target_modules": list(config.target_modules), "dtype": str(dtype),
                   "check_max_abs_logit_diff": diff}, f, indent=2)
    return diff


def _has_tokenizer(path):
    return any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer_config.json", "vocab.json",
                                                              "tokenizer.json"))


def _save_tokenizer(src, out_dir):
    if not _has_tokenizer(src):
        logger.warning("no tokenizer in %s: %s has the model only", src, out_dir)
        return
    from paddlenlp.transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(src).save_pretrained(out_dir)
