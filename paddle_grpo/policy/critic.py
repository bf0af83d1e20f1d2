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
- a PaddleNLP score model (`AutoModelForScore`, PaddleNLP's own critic / reward checkpoints: `model.*` backbone,
  `score_head`, `normalizer.*` keys). Loaded with PaddleNLP's class, as its trainer does (score_type "critic", no
  normalisation), when the installed PaddleNLP has it (`paddlenlp.rl.models.score_model`, PaddleNLP 3.0 after beta
  4). Otherwise (PaddleNLP 3.0.0b4, the version verified here) its files are read into a ValueModel
  (value_model.load_score_layout: the same weights, `normalizer.*` dropped as PaddleNLP drops it for critics), and
  `Critic.save` writes the layouts above, which every PaddleNLP 3 loads (AutoModelForSequenceClassification /
  AutoModel).
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
Recompute, dtype and kernel flags are set as for the policy (causal.model_config). A plain float32 Qwen2 or Llama
critic (Qwen2ForSequenceClassification, or the ValueModel over a LlamaModel) runs the policy's lean forward
(fast_decoder.py: each group's shared prompt computed once, the same numbers); other models, tensor parallelism,
AMP and `PADDLE_GRPO_FAST=0` run PaddleNLP's. The start-up line ends with which (`; decoder: fast path (llama)` or
`; decoder: PaddleNLP's forward (<why>)`).
"""
from __future__ import annotations

import logging
import os
from typing import Any

import paddle

from . import fast_decoder
from .base import is_encoder_decoder, position_ids_from_mask
from .causal import model_config, prepare_loaded
from .hub import resolve_model_dir
from .value_model import VALUE_HEAD_FILE, ValueModel, load_score_layout, load_value_model

logger = logging.getLogger("paddle_grpo.policy")

__all__ = ["CAUSAL_LM", "CRITIC", "REWARD_MODEL", "SCORE_MODEL", "VALUE_HEAD_FILE", "Critic", "ValueModel",
           "critic_kind", "critic_plan", "load_critic", "paddlenlp_score_model", "sequence_classifier_class"]

# What config.json's score_type says in a critic checkpoint (PaddleNLP's AutoModelForScore field and value).
CRITIC_SCORE_TYPE = "critic"
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
        for suffix in ("ForCausalLM", "ForSequenceClassification"):
            if arch.endswith(suffix) and arch != suffix:
                found = getattr(transformers, arch[:-len(suffix)] + "ForSequenceClassification", None)
                if found is not None:
                    return found
    return None


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
        if fast_decoder.enabled_for(self.model):
            # The policy's lean decoder forward, each group's shared prompt computed once; same numbers.
            fast = fast_decoder.FastDecoder(self.model)
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
        one-label sequence classifier, or a ValueModel's backbone + value_head.pdparams, config `score_type:
        critic`; pass `merge_tensor_parallel=True` on every rank under tensor parallelism, as run/checkpoint.py does for
        the policy) and the source's tokenizer, when it has one. Returns out_dir."""
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
    classifier with other than one label, a ValueModel critic without its head file. --dry_run reports the same
    (dry_run/critic.py)."""
    kind = critic_kind(config)
    arch = ", ".join(getattr(config, "architectures", None) or ["no architectures"])
    classifier = any(a.endswith("ForSequenceClassification") for a in getattr(config, "architectures", None) or [])
    if classifier and int(getattr(config, "num_labels", 1)) != 1:
        raise ValueError(f"{key}: {path}/config.json describes a sequence classifier with {config.num_labels} "
                         "labels; a critic or reward model has one output (num_labels 1)")
    if kind == SCORE_MODEL:
        if paddlenlp_score_model() is not None:
            return kind, (f"a {kind} ({arch}): its score_head is the value head (PaddleNLP's AutoModelForScore, "
                          f"score_type {CRITIC_SCORE_TYPE}, no normalisation)")
        return kind, (f"a {kind} ({arch}): its score_head is the value head, {VALUE_MODEL_NOTE} (AutoModelForScore's "
                      "files read without PaddleNLP's class, which this PaddleNLP lacks: model.* the backbone, "
                      "normalizer.* dropped as for PaddleNLP's critics)")
    what = {CRITIC: "backbone and value head as saved",
            REWARD_MODEL: "its one-label score head is the value head",
            CAUSAL_LM: "its backbone with a new value head initialised to zeros (every value starts at 0; the LM "
                       "head's weights are dropped)"}[kind]
    # A saved ValueModel stays one even where a later PaddleNLP gains a sequence classifier for its family.
    if (kind == CRITIC and not classifier) or (kind == CAUSAL_LM and sequence_classifier_class(config) is None):
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
    what = f"{key}: {path} ({kind})"
    if kind == SCORE_MODEL and VALUE_MODEL_NOTE not in line:
        model = paddlenlp_score_model().from_pretrained(path, config=config, dtype=dtype,
                                                        score_type=CRITIC_SCORE_TYPE, do_normalize=False)
        backbone, head = model.model, model.score_head
    elif kind == SCORE_MODEL:
        model = load_score_layout(path, config, dtype, what)
        backbone, head = getattr(model, model.base_model_prefix), model.score
    elif VALUE_MODEL_NOTE in line:
        model = load_value_model(path, config, dtype, saved_head=kind == CRITIC, what=what)
        backbone, head = getattr(model, model.base_model_prefix), model.score
    else:
        model, backbone, head = _load_sequence_classifier(path, config, dtype, key, kind)
    model.config.score_type = CRITIC_SCORE_TYPE
    prepare_loaded(model, trainable)
    logger.info(f"critic: {name_or_path} is {line}; {fast_decoder.describe(model)}")
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


def paddlenlp_score_model() -> type | None:
    """PaddleNLP's AutoModelForScore class (paddlenlp.rl.models.score_model), or None when the installed PaddleNLP
    has none (3.0.0b4)."""
    try:
        from paddlenlp.rl.models.score_model import AutoModelForScore
    except ImportError:
        return None
    return AutoModelForScore
