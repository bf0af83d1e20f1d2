"""The critic (value model) of PPO and VAPO: a decoder backbone with a scalar value head, one value per completion token.

    critic = load_critic("path/or/hub-id", **par.model_load_kwargs(), **plan.load_kwargs())
    values = critic.values(prompt_ids, prompt_mask, completion_ids, completion_mask)   # [k, T] float32
    critic.save("out/critic")                                                          # load_critic loads it back

`load_critic` takes a local directory or a hub ID (hub.resolve_model_dir) holding one of these kinds, told apart by
its config.json, and logs one start-up line that says which it found:

- a critic checkpoint (what `Critic.save` writes): a PaddleNLP sequence-classification model with one label
  (`AutoModelForSequenceClassification`, e.g. Qwen2ForSequenceClassification), whose config says
  `score_type: critic` (PaddleNLP's field for its critics). Backbone and head are loaded as saved.
- a PaddleNLP score model (`AutoModelForScore`, PaddleNLP's own critic / reward checkpoints: `model.*` backbone and
  `score_head` keys). Loaded with PaddleNLP's class, as its trainer does (score_type "critic", no normalisation), when
  the installed PaddleNLP has it (`paddlenlp.rl.models.score_model`, PaddleNLP 3.0 after beta 4); otherwise refused
  with a message naming the file. PaddleNLP 3.0.0b4, the version verified here, has no such class, so `Critic.save`
  writes the sequence-classification layout above, which every PaddleNLP 3 loads (`AutoModelForSequenceClassification`).
- a reward model directory (sequence classification, one label; reward_model.py loads the same kind): its score
  head becomes the value head.
- a plain causal LM (`AutoModelForCausalLM`, e.g. the policy itself): its backbone (the LM head is not loaded) with
  a new value head initialised to zeros. Zeros, not PaddleNLP's random Linear init: every value starts at 0, so the
  first advantages are GAE of the rewards alone (no arbitrary per-token baseline from a random head, whose values
  would be of order 1 after the final norm), and the value loss of the first step is the returns' second moment.
  The head learns from the first update; the backbone's gradient is 0 until the head is nonzero (dV/dh = w).

`values` runs the backbone only (`model.<base_model_prefix>`, PaddleNLP's decoder with its final norm), never a
vocabulary-sized LM head: the critic has no [k, T, V] logits, which is why the chunked LM head (lm_head.py) does not
apply to it. Attention mask and position ids are the policy's (causal.completion_logprobs: left-padded prompts,
positions counted over real tokens). Under tensor parallelism the backbone is this rank's shard (PaddleNLP splits
the checkpoint) and its final hidden state is replicated on every rank; the value head is a plain replicated Linear,
so its gradient, computed from the same hidden states and loss on each rank, is identical on every rank.
Recompute, dtype and kernel flags are set as for the policy (causal.model_config).
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
# Critic.kind values, one per kind load_critic accepts.
CRITIC, SCORE_MODEL, REWARD_MODEL, CAUSAL_LM = "critic checkpoint", "PaddleNLP score model", "reward model", "causal LM"


def critic_kind(config: Any) -> str:
    """Which kind of checkpoint a model config (PaddleNLP PretrainedConfig of the directory) describes: CRITIC,
    SCORE_MODEL, REWARD_MODEL or CAUSAL_LM (see the module docstring)."""
    architectures = list(getattr(config, "architectures", None) or [])
    if any(a == "AutoModelForScore" or a.endswith("ForScore") for a in architectures):
        return SCORE_MODEL
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return CRITIC if getattr(config, "score_type", None) == CRITIC_SCORE_TYPE else REWARD_MODEL
    return CAUSAL_LM


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
        if fast_qwen2.enabled_for_backbone(self.model):
            # The policy's lean Qwen2 forward (shared prompts, fused projections): the same hidden states, at the
            # cost of one policy pass without its LM head (tests/policy/test_critic_fast.py).
            fast = fast_qwen2.Qwen2Fast(self.model)
            hidden = fast.final_hidden(fast.prompt_completion_hidden(prompt_ids, prompt_mask, completion_ids,
                                                                     completion_mask))
            return self.head(hidden).squeeze(-1).astype("float32")
        input_ids = paddle.concat([prompt_ids, completion_ids], axis=1)
        attention_mask = paddle.concat([prompt_mask, completion_mask], axis=1).astype("int64")
        L = prompt_ids.shape[1]
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               position_ids=position_ids_from_mask(attention_mask), use_cache=False,
                               return_dict=True).last_hidden_state
        return self.head(hidden[:, L - 1:-1]).squeeze(-1).astype("float32")

    def trainable_parameters(self) -> list:
        """What the critic's optimizer updates: every parameter of `.model` (backbone and head)."""
        return self.model.parameters()

    def state_dict(self) -> dict[str, Any]:
        """`.model`'s state dict (structured names: `qwen2.layers.0...`, `score.weight`)."""
        return self.model.state_dict()

    def set_state_dict(self, state_dict: dict[str, Any]) -> Any:
        """Load a state dict of `.model` (as `state_dict` returns it)."""
        return self.model.set_state_dict(state_dict)

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
    kind = critic_kind(config)
    arch = ", ".join(getattr(config, "architectures", None) or ["no architectures"])
    if kind == SCORE_MODEL:
        model, backbone, head = _load_score_model(path, config, dtype, key)
        line = f"its score_head is the value head (PaddleNLP's AutoModelForScore, score_type {CRITIC_SCORE_TYPE})"
    else:
        model, backbone, head = _load_sequence_classifier(path, config, dtype, key, kind)
        line = {CRITIC: "backbone and value head as saved",
                REWARD_MODEL: "its one-label score head is the value head",
                CAUSAL_LM: "its backbone with a new value head initialised to zeros (every value starts at 0; the "
                           "LM head's weights are dropped)"}[kind]
    model.config.score_type = CRITIC_SCORE_TYPE
    prepare_loaded(model, trainable)
    logger.info(f"critic: {name_or_path} is a {kind} ({arch}): {line}")
    return Critic(model, backbone, head, kind, source=path)


def _load_sequence_classifier(path: str, config: Any, dtype: str, key: str, kind: str):
    """(model, backbone, head) of a one-label `AutoModelForSequenceClassification` from `path`: a critic
    checkpoint or a reward model as saved, or a causal LM's backbone with a zero head."""
    from paddlenlp.transformers import AutoModelForSequenceClassification

    if kind != CAUSAL_LM and int(getattr(config, "num_labels", 1)) != 1:
        raise ValueError(f"{key}: {path}/config.json describes a sequence classifier with {config.num_labels} "
                         "labels; a critic or reward model has one output (num_labels 1)")
    config.num_labels = 1
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, config=config, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 PaddleNLP raises many kinds; name the model and the cause
        raise OSError(f"{key}: {path} ({kind}) could not be loaded as a one-label AutoModelForSequenceClassification "
                      f"(the critic's backbone + value head): {type(exc).__name__}: {str(exc)[:500]}") from exc
    backbone, head = getattr(model, model.base_model_prefix, None), getattr(model, "score", None)
    if backbone is None or head is None or tuple(head.weight.shape) != (config.hidden_size, 1):
        raise ValueError(f"{key}: {type(model).__name__} has no `{model.base_model_prefix}` backbone and one-output "
                         "`score` head; the critic supports PaddleNLP models whose sequence classifier has them "
                         "(Qwen2, Llama, ...)")
    if kind == CAUSAL_LM:
        with paddle.no_grad():
            for p in head.parameters():
                p.set_value(paddle.zeros_like(p))
    return model, backbone, head


def _load_score_model(path: str, config: Any, dtype: str, key: str):
    """(model, backbone, head) of PaddleNLP's AutoModelForScore from `path`, loaded as PaddleNLP's trainer loads a
    critic; refused when the installed PaddleNLP lacks the class."""
    try:
        from paddlenlp.rl.models.score_model import AutoModelForScore
    except ImportError as exc:
        import paddlenlp

        raise ValueError(
            f"{key}: {path} is a PaddleNLP AutoModelForScore checkpoint (config.json architectures "
            f"{config.architectures}), and the installed PaddleNLP {paddlenlp.__version__} has no AutoModelForScore "
            "(paddlenlp.rl.models.score_model) to load it. Use a PaddleNLP that has it, or point the key at the "
            "causal LM it was trained from (a new value head), a one-label reward model, or a critic saved by "
            "paddle_grpo") from exc
    model = AutoModelForScore.from_pretrained(path, config=config, dtype=dtype, score_type=CRITIC_SCORE_TYPE,
                                              do_normalize=False)
    return model, model.model, model.score_head
