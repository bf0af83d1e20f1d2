"""The critic (value model) of PPO and VAPO: a decoder backbone with a scalar value head, a value per completion token.

    critic = load_critic("path/or/hub-id", **par.model_load_kwargs(), **plan.load_kwargs())
    values = critic.values(prompt_ids, prompt_mask, completion_ids, completion_mask)   # [k, T] float32
    critic.save("out/critic")                                                          # load_critic loads it back

`load_critic` takes a local directory or a hub ID (hub.resolve_model_dir) holding one of these kinds, told apart by
its config.json, and logs one start-up line that says which it found:

- a critic checkpoint (what `Critic.save` writes): a PaddleNLP sequence-classification model with one label
  (`AutoModelForSequenceClassification`, e.g. Qwen2ForSequenceClassification), whose config says
  `score_type: critic` (PaddleNLP's field for its critics). Backbone and head are loaded as saved. A model family
  for which PaddleNLP has no sequence classifier (Llama in 3.0.0b4) is a `ValueModel` instead: the backbone saved
  as PaddleNLP saves a base model (`AutoModel`, e.g. LlamaModel, config `score_type: critic`) and the head in
  `value_head.pdparams`.
- a PaddleNLP score model (`AutoModelForScore`, PaddleNLP's own critic / reward checkpoints: `model.*` backbone and
  `score_head` keys). Loaded with PaddleNLP's class, as its trainer does (score_type "critic", no normalisation), when
  the installed PaddleNLP has it (`paddlenlp.rl.models.score_model`, PaddleNLP 3.0 after beta 4); otherwise refused
  with a message naming the file. PaddleNLP 3.0.0b4, the version verified here, has no such class, so `Critic.save`
  writes the layouts above, which every PaddleNLP 3 loads (AutoModelForSequenceClassification / AutoModel).
- a reward model directory (sequence classification, one label; reward_model.py loads the same kind): its score
  head becomes the value head.
- a plain causal LM (`AutoModelForCausalLM`, e.g. the policy itself): its backbone (the LM head's weights are
  dropped) in the family's sequence classifier, else a ValueModel, with a new value head initialised to zeros.
  Zeros, not PaddleNLP's random Linear init: every value starts at 0, so the first advantages are GAE of the rewards
  alone (no arbitrary per-token baseline from a random head, whose values would be of order 1 after the final
  norm), and the value loss of the first step is the returns' second moment. The head learns from the first
  update; the backbone's gradient is 0 until the head is nonzero (dV/dh = w).

`values` runs the backbone only (`model.<base_model_prefix>`, PaddleNLP's decoder with its final norm), never a
vocabulary-sized LM head: the critic has no [k, T, V] logits, which is why the chunked LM head (lm_head.py) does not
apply to it. Attention mask and position ids are the policy's (causal.completion_logprobs: left-padded prompts,
positions counted over real tokens). Under tensor parallelism the backbone is this rank's shard (PaddleNLP splits
the checkpoint) and its final hidden state is replicated on every rank; the value head is a plain replicated Linear,
so its gradient, computed from the same hidden states and loss on each rank, is identical on every rank.
Recompute, dtype and kernel flags are set as for the policy (causal.model_config). A plain float32 Qwen2 critic
runs the policy's lean forward (fast_qwen2.py: each group's shared prompt computed once, the same numbers); other
models, tensor parallelism, AMP and `PADDLE_GRPO_FAST=0` run PaddleNLP's.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import paddle

from . import fast_qwen2
from .base import is_encoder_decoder, position_ids_from_mask
from .causal import model_config, prepare_loaded
from .hub import resolve_model_dir

logger = logging.getLogger("paddle_grpo.policy")

# What config.json's score_type says in a critic checkpoint (PaddleNLP's AutoModelForScore field and value).
CRITIC_SCORE_TYPE = "critic"
# The value head's weights beside a ValueModel's backbone (families without a PaddleNLP sequence classifier).
VALUE_HEAD_FILE = "value_head.pdparams"
# Critic.kind values, one per kind load_critic accepts.
CRITIC, SCORE_MODEL, REWARD_MODEL, CAUSAL_LM = "critic checkpoint", "PaddleNLP score model", "reward model", "causal LM"


def critic_kind(config: Any) -> str:
    """Which kind of checkpoint a model config (PaddleNLP PretrainedConfig of the directory) describes: CRITIC,
    SCORE_MODEL, REWARD_MODEL or CAUSAL_LM (see the module docstring)."""
    architectures = list(getattr(config, "architectures", None) or [])
    if any(a == "AutoModelForScore" or a.endswith("ForScore") for a in architectures):
        return SCORE_MODEL
    critic = getattr(config, "score_type", None) == CRITIC_SCORE_TYPE
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return CRITIC if critic else REWARD_MODEL
    if critic and any(a.endswith("Model") for a in architectures):  # ValueModel's layout
        return CRITIC
    return CAUSAL_LM


def sequence_classifier_class(config: Any) -> type | None:
    """PaddleNLP's `<Family>ForSequenceClassification` class of the model family of `config` (from its
    architectures, e.g. Qwen2ForCausalLM -> Qwen2ForSequenceClassification), or None when PaddleNLP has none (Llama
    in PaddleNLP 3.0.0b4: the critic is then a ValueModel)."""
    import paddlenlp.transformers as transformers

    for arch in getattr(config, "architectures", None) or []:
        for suffix in ("ForCausalLM", "ForSequenceClassification", "Model"):
            if arch.endswith(suffix) and arch != suffix:
                found = getattr(transformers, arch[:-len(suffix)] + "ForSequenceClassification", None)
                if found is not None:
                    return found
    return None


class ValueModel(paddle.nn.Layer):
    """Backbone + value head for a model family without a PaddleNLP sequence classifier: the same state-dict names
    as one (`<base_model_prefix>.*`, `score.weight`), and `save_pretrained` writes the backbone as PaddleNLP saves a
    base model (config.json with `score_type: critic`, its weights; `merge_tensor_parallel` etc. passed on) plus the
    head in VALUE_HEAD_FILE."""

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


class Critic:
    """A value model: `.model` (a PaddleNLP model, backbone + value head, what the critic's optimizer trains), its
    backbone `.backbone` and head `.head` (a Linear from the hidden size to 1), and `.kind` (what it was loaded
    from: CRITIC, SCORE_MODEL, REWARD_MODEL or CAUSAL_LM). `source`: the directory it was loaded from (its tokenizer
    is copied by `save`)."""

    def __init__(self, model: paddle.nn.Layer, backbone: paddle.nn.Layer, head: paddle.nn.Layer, kind: str,
                 source: str | None = None):
        self.model, self.backbone, self.head, self.kind, self.source = model, backbone, head, kind, source

    def values(self, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, completion_ids: paddle.Tensor,
               completion_mask: paddle.Tensor) -> paddle.Tensor:
        """V of the state before each completion token: [k, T] float32, differentiable (wrap in paddle.no_grad for
        the experience pass). prompt_ids/prompt_mask [k, L] left-padded, completion_ids/completion_mask [k, T].

        Column t is the head applied to the backbone's final hidden state (after the final norm) at position
        L + t - 1 of prompt + completion, the position whose output predicts completion token t (as in
        causal.completion_logprobs). Positions where completion_mask is 0 hold meaningless values."""
        if fast_qwen2.enabled_for(self.model):
            # The policy's lean Qwen2 forward, each group's shared prompt computed once; same numbers.
            fast = fast_qwen2.Qwen2Fast(self.model)
            hidden = fast.final_hidden(fast.prompt_completion_hidden(prompt_ids, prompt_mask, completion_ids,
                                                                     completion_mask))
        else:
            input_ids = paddle.concat([prompt_ids, completion_ids], axis=1)
            attention_mask = paddle.concat([prompt_mask, completion_mask], axis=1).astype("int64")
            L = prompt_ids.shape[1]
            hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                                   position_ids=position_ids_from_mask(attention_mask), use_cache=False,
                                   return_dict=True).last_hidden_state[:, L - 1:-1]
        return self.head(hidden).squeeze(-1).astype("float32")

    def trainable_parameters(self) -> list:
        """What the critic's optimizer updates: every parameter of `.model` (backbone and head)."""
        return self.model.parameters()

    def state_dict(self) -> dict[str, Any]:
        """`.model`'s state dict (structured names: `qwen2.layers.0...`, `score.weight`)."""
        return self.model.state_dict()

    def set_state_dict(self, state_dict: dict[str, Any]) -> Any:
        """Load a state dict of `.model` (as `state_dict` returns it)."""
        return self.model.set_state_dict(state_dict)

    def load_weights(self, directory: str, *, tensor_parallel_degree: int = 1, tensor_parallel_rank: int = 0) -> None:
        """Load the weights of a critic directory (`save`'s, or any kind `load_critic` takes) into `.model` in place,
        keeping its parameters (the optimizer's) and their dtype; tensor_parallel_*: this rank's shard, as loaded."""
        loaded = load_critic(directory, trainable=False, tensor_parallel_degree=tensor_parallel_degree,
                             tensor_parallel_rank=tensor_parallel_rank)
        own = self.model.state_dict()
        state = loaded.model.state_dict()
        # paddle's set_state_dict skips a mismatched tensor with a warning only: another model's weights are an error
        misfit = sorted(set(own) ^ set(state)) or [k for k in own if own[k].shape != state[k].shape]
        if misfit:
            raise ValueError(f"critic weights in {directory} do not fit this critic (names or shapes differ: "
                             f"{misfit[:5]})")
        self.model.set_state_dict({k: v if v.dtype == own[k].dtype else v.astype(own[k].dtype)
                                   for k, v in state.items()})

    def save(self, out_dir: str, **save_pretrained_kwargs: Any) -> str:
        """Write a critic checkpoint `load_critic` loads back exactly: `.model.save_pretrained(out_dir, ...)` (a
        sequence-classification model, one label, config `score_type: critic`; `merge_tensor_parallel=True` under
        tensor parallelism, as checkpoint.py passes) and the source's tokenizer, when it has one. Returns out_dir."""
        self.model.config.score_type = CRITIC_SCORE_TYPE
        self.model.save_pretrained(out_dir, **save_pretrained_kwargs)
        if save_pretrained_kwargs.get("is_main_process", True) and self.source is not None and \
                os.path.isfile(os.path.join(self.source, "tokenizer_config.json")):
            from paddlenlp.transformers import AutoTokenizer

            AutoTokenizer.from_pretrained(self.source).save_pretrained(out_dir)
        return out_dir


VALUE_MODEL_NOTE = "as a ValueModel"


def critic_plan(config: Any, path: str, *, key: str = "critic_model_name_or_path") -> tuple[str, str]:
    """(kind, what load_critic makes of it) for the PaddleNLP config of the local model directory `path`, without
    reading weights: the kind (CRITIC, SCORE_MODEL, REWARD_MODEL, CAUSAL_LM) and the text of load_critic's start-up
    line after the name ("a reward model (Qwen2ForSequenceClassification): its one-label score head is the value
    head"). Raises ValueError / FileNotFoundError, naming `key` and the file, for what load_critic refuses: a
    classifier with other than one label, an AutoModelForScore checkpoint without PaddleNLP's class, a ValueModel
    critic without its head file. --dry_run reports the same (dry_run.py)."""
    kind = critic_kind(config)
    arch = ", ".join(getattr(config, "architectures", None) or ["no architectures"])
    classifier = any(a.endswith("ForSequenceClassification") for a in getattr(config, "architectures", None) or [])
    if classifier and int(getattr(config, "num_labels", 1)) != 1:
        raise ValueError(f"{key}: {path}/config.json describes a sequence classifier with {config.num_labels} "
                         "labels; a critic or reward model has one output (num_labels 1)")
    if kind == SCORE_MODEL:
        try:
            import paddlenlp.rl.models.score_model  # noqa: F401  (what _load_score_model loads it with)
        except ImportError as exc:
            import paddlenlp

            raise ValueError(
                f"{key}: {path} is a PaddleNLP AutoModelForScore checkpoint (config.json architectures {arch}), and "
                f"the installed PaddleNLP {paddlenlp.__version__} has no AutoModelForScore "
                "(paddlenlp.rl.models.score_model) to load it. Use a PaddleNLP that has it, or point the key at the "
                "causal LM it was trained from (a new value head), a one-label reward model, or a critic saved by "
                "paddle_grpo") from exc
        return kind, (f"a {kind} ({arch}): its score_head is the value head (PaddleNLP's AutoModelForScore, "
                      f"score_type {CRITIC_SCORE_TYPE}, no normalisation)")
    what = {CRITIC: "backbone and value head as saved",
            REWARD_MODEL: "its one-label score head is the value head",
            CAUSAL_LM: "its backbone with a new value head initialised to zeros (every value starts at 0; the LM "
                       "head's weights are dropped)"}[kind]
    if kind in (CRITIC, CAUSAL_LM) and sequence_classifier_class(config) is None:
        head_file = os.path.join(path, VALUE_HEAD_FILE)
        if kind == CRITIC and not os.path.isfile(head_file):
            raise FileNotFoundError(f"{key}: {path} is a critic checkpoint ({path}/config.json: score_type "
                                    f"{CRITIC_SCORE_TYPE}, architectures {arch}) without its value head {head_file}")
        what += f", {VALUE_MODEL_NOTE} (PaddleNLP has no sequence classifier for this family)"
    return kind, f"a {kind} ({arch}): {what}"


def load_critic(name_or_path: str, *, trainable: bool = True, recompute: bool = False,
                recompute_granularity: str = "full", recompute_use_reentrant: bool = False, dtype: str = "float32",
                config_overrides: dict[str, Any] | None = None, tensor_parallel_degree: int = 1,
                tensor_parallel_rank: int = 0, key: str = "critic_model_name_or_path") -> Critic:
    """The critic in `name_or_path` (a local directory or hub ID: hub.resolve_model_dir, `key` naming the config
    key in its errors), any of the kinds of the module docstring, with one start-up log line saying which.

    Keyword arguments as `load_policy`'s: frozen (eval, no gradients) unless `trainable`; `recompute` with
    PaddleNLP's `recompute_granularity` / `recompute_use_reentrant`; `dtype` and `config_overrides` from the precision
    plan (PrecisionPlan.load_kwargs); tensor_parallel_* this rank's shard (ParallelContext.model_load_kwargs)."""
    path = resolve_model_dir(name_or_path, key=key)
    if is_encoder_decoder(path):
        raise ValueError(f"{key}: '{name_or_path}' is an encoder-decoder model ({path}/config.json says "
                         "is_encoder_decoder); the critic is a decoder-only backbone with a value head")
    config = model_config(path, trainable=trainable, recompute=recompute,
                          tensor_parallel_degree=tensor_parallel_degree, tensor_parallel_rank=tensor_parallel_rank,
                          config_overrides=config_overrides, recompute_granularity=recompute_granularity,
                          recompute_use_reentrant=recompute_use_reentrant)
    kind, line = critic_plan(config, path, key=key)
    if kind == SCORE_MODEL:
        model, backbone, head = _load_score_model(path, config, dtype)
    elif isinstance(line, str) and VALUE_MODEL_NOTE in line:
        model, backbone, head = _load_value_model(path, config, dtype, key, kind)
    else:
        model, backbone, head = _load_sequence_classifier(path, config, dtype, key, kind)
    model.config.score_type = CRITIC_SCORE_TYPE
    prepare_loaded(model, trainable)
    logger.info(f"critic: {name_or_path} is {line}")
    return Critic(model, backbone, head, kind, source=path)


def _load_sequence_classifier(path: str, config: Any, dtype: str, key: str, kind: str):
    """(model, backbone, head) of a one-label `AutoModelForSequenceClassification` from `path`: a critic
    checkpoint or a reward model as saved, or a causal LM's backbone with a zero head."""
    from paddlenlp.transformers import AutoModelForSequenceClassification

    config.num_labels = 1
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, config=config, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 PaddleNLP raises many kinds; name the model and the cause
        raise OSError(f"{key}: {path} ({kind}) could not be loaded as a one-label AutoModelForSequenceClassification "
                      f"(the critic's backbone + value head): {type(exc).__name__}: {str(exc)[:500]}") from exc
    backbone, head = getattr(model, model.base_model_prefix, None), getattr(model, "score", None)
    if backbone is None or head is None or tuple(head.weight.shape) != (config.hidden_size, 1):
        raise ValueError(f"{key}: {type(model).__name__} has no `{model.base_model_prefix}` backbone and one-output "
                         "`score` head, which the critic reads (Qwen2's, DeepSeek's)")
    if kind == CAUSAL_LM:
        with paddle.no_grad():
            for p in head.parameters():
                p.set_value(paddle.zeros_like(p))
    return model, backbone, head


def _load_value_model(path: str, config: Any, dtype: str, key: str, kind: str):
    """(model, backbone, head) of a ValueModel: PaddleNLP's `AutoModel` backbone of `path` (a causal LM's decoder,
    or a saved ValueModel's) and its saved head, or a new zero head for a causal LM."""
    from paddlenlp.transformers import AutoModel

    head_file = os.path.join(path, VALUE_HEAD_FILE)  # there for a CRITIC (critic_plan checked)
    try:
        backbone = AutoModel.from_pretrained(path, config=config, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 PaddleNLP raises many kinds; name the model and the cause
        raise OSError(f"{key}: {path} ({kind}) could not be loaded with AutoModel (the critic's backbone): "
                      f"{type(exc).__name__}: {str(exc)[:500]}") from exc
    head = paddle.nn.Linear(config.hidden_size, 1, bias_attr=False)
    with paddle.no_grad():
        if kind == CRITIC:
            saved = paddle.load(head_file)
            if set(saved) != {"weight"} or tuple(saved["weight"].shape) != (config.hidden_size, 1):
                raise ValueError(f"{key}: {head_file} holds {({k: v.shape for k, v in saved.items()})}, not the "
                                 f"value head's weight [{config.hidden_size}, 1]")
            head.weight.set_value(saved["weight"].astype(head.weight.dtype))
        else:
            head.weight.set_value(paddle.zeros_like(head.weight))
    head.to(dtype=backbone.parameters()[0].dtype)
    return ValueModel(backbone, head), backbone, head


def _load_score_model(path: str, config: Any, dtype: str):
    """(model, backbone, head) of PaddleNLP's AutoModelForScore from `path`, loaded as PaddleNLP's trainer loads a
    critic (critic_plan checked that the installed PaddleNLP has the class)."""
    from paddlenlp.rl.models.score_model import AutoModelForScore

    model = AutoModelForScore.from_pretrained(path, config=config, dtype=dtype, score_type=CRITIC_SCORE_TYPE,
                                              do_normalize=False)
    return model, model.model, model.score_head
