"""Checkpoints: `<output_dir>/checkpoint-<step>/`, written to a temporary directory and renamed into place.

Contents: the policy in `save_pretrained` format (loadable by `AutoModelForCausalLM`; under `lora: true` the
adapters only, in paddlenlp.peft's format with the base model's path in lora_config.json: tools/models/merge_lora.py
makes a full model of them) and its tokenizer, and unless
`ignore_save_lr_and_optim`, `optimizer.pdopt`, `trainer_state.json` (step, data position, running reward statistics,
counters, scheduler state, the fp16 loss scale: run/state.trainer_state) and `rng_state.pkl` (paddle, numpy and python
generators). PPO / VAPO add `critic/`: the critic (`Critic.save`, loadable by `load_critic`) and, unless
`ignore_save_lr_and_optim`, its optimizer state (`critic/optimizer*.pdopt`). A crash while saving leaves
only a `.tmp-*` directory behind; a save that fails (no space left) removes its own; the previous checkpoint stays
intact and `latest_checkpoint` never picks a partial one. Checkpoints beyond `save_total_limit` are renamed aside
before they are deleted, so a kill during the deletion never leaves a checkpoint with some of its files.
"""
from __future__ import annotations

import glob
import json
import os
import pickle
import random
import re
import shutil
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Union

import numpy as np
import paddle

if TYPE_CHECKING:
    from paddlenlp.transformers import PretrainedTokenizer

STATE_FILE = "trainer_state.json"
OPTIMIZER_FILE = "optimizer.pdopt"
RNG_FILE = "rng_state.pkl"
REFERENCE_DIR = "reference"
CRITIC_DIR = "critic"   # PPO / VAPO: the critic (Critic.save) and its optimizer state (run/state.py)
_NAME = re.compile(r"^checkpoint-(\d+)$")


def rng_state() -> Dict[str, Any]:
    return {"paddle": paddle.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: Dict[str, Any]) -> None:
    paddle.set_rng_state(state["paddle"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def save_checkpoint(output_dir: str, step: int, model: paddle.nn.Layer, tokenizer: PretrainedTokenizer, *,
                    trainer_state: Dict[str, Any], optimizer: Any = None, reference: Optional[paddle.nn.Layer] = None,
                    full: bool = True, total_limit: Optional[int] = -1, writer: bool = True, participant: bool = True,
                    tp_world: int = 1, pp_world: int = 1, optimizer_shard: Optional[Dict[str, int]] = None,
                    saves_optimizer: bool = True, optimizer_model: Optional[paddle.nn.Layer] = None,
                    sync: Callable[[], None] = lambda: None,
                    extra: Optional[Callable[[str], None]] = None) -> str:
    """Write checkpoint-<step> atomically; returns its path. `full=False` saves only model and tokenizer.

    Called by every rank: `writer` (global rank 0) writes the files; `participant`s (the tensor-parallel ranks of
    data-parallel rank 0) take part in merging the model shards; a rank with `saves_optimizer` writes the part of
    the optimizer state it holds, `optimizer_shard` ({axis: rank}, see `optimizer_file`), keyed by the parameter
    names of `optimizer_model` (default `model`); `sync` is a barrier over all ranks. Under pipeline parallelism
    (`pp_world > 1`) `model` is the full copy, which the writer alone saves, and `optimizer_model` the stage's
    pipeline layers. `extra(directory)`: called on every rank with the checkpoint's directory while it is written
    (more parts of the trainer's state: run/state.py's critic)."""
    final = os.path.join(output_dir, f"checkpoint-{step}")
    tmp = os.path.join(output_dir, f".tmp-checkpoint-{step}")
    if writer:
        for leftover in glob.glob(os.path.join(output_dir, ".tmp-checkpoint-*.deleting")) + [tmp]:
            shutil.rmtree(leftover, ignore_errors=True)
        os.makedirs(tmp)
    sync()
    try:
        if participant and (writer or tp_world > 1):  # merging TP shards is a collective; otherwise one writer
            merge = {"merge_tensor_parallel": True} if tp_world > 1 else {}
            _unwrap(model).save_pretrained(tmp, is_main_process=writer, **merge)
            if reference is not None:
                _unwrap(reference).save_pretrained(os.path.join(tmp, REFERENCE_DIR), is_main_process=writer, **merge)
        if full and saves_optimizer:
            save_optimizer(tmp, optimizer, optimizer_model or model, optimizer_shard)
        if extra is not None:
            extra(tmp)
        if writer:
            tokenizer.save_pretrained(tmp)
            if full:
                with open(os.path.join(tmp, RNG_FILE), "wb") as f:
                    pickle.dump(rng_state(), f)
        sync()
        if writer:
            with open(os.path.join(tmp, STATE_FILE), "w", encoding="utf-8") as f:
                json.dump({"step": step, "full": full, "tensor_parallel_degree": tp_world,
                           "pipeline_parallel_degree": pp_world, **trainer_state}, f, indent=2)
            if os.path.exists(final):  # re-saving the same step (e.g. after an interrupt): replace it whole
                aside = f"{tmp}.deleting"
                os.replace(final, aside)
                shutil.rmtree(aside)
            os.replace(tmp, final)
    except BaseException:
        if writer:  # e.g. no space left: free what this save took; the previous checkpoint is untouched
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if writer and total_limit and total_limit > 0:
        for old in list_checkpoints(output_dir)[:-total_limit]:
            aside = os.path.join(output_dir, f".tmp-{os.path.basename(old)}.deleting")
            os.replace(old, aside)  # atomic: the checkpoint is gone whole before any of its files is
            shutil.rmtree(aside, ignore_errors=True)
    sync()
    return final


def save_optimizer(directory: str, optimizer: Any, model: paddle.nn.Layer,
                   shard: Optional[Dict[str, int]] = None) -> None:
    """Write this rank's part of the optimizer state (`shard`, see `optimizer_file`) into `directory`, keyed by the
    structured parameter names of `model` (`load_optimizer` reads it back in another process)."""
    paddle.save(_rename_optimizer_state(optimizer.state_dict(), _param_names(model)),
                os.path.join(directory, optimizer_file(shard)))


def optimizer_file(shard: Optional[Dict[str, int]] = None) -> str:
    """The file of one part of the optimizer state: `optimizer.pdopt` for the whole state, else named by the
    axes that split it, e.g. {"tp": 1} -> optimizer.tp1.pdopt, {"pp": 1} -> optimizer.pp1.pdopt,
    {"tp": 0, "sharding": 1} -> optimizer.tp0.sharding1.pdopt."""
    if not shard:
        return OPTIMIZER_FILE
    return "optimizer." + ".".join(f"{axis}{r}" for axis, r in shard.items()) + ".pdopt"


def list_checkpoints(output_dir: str) -> List[str]:
    """Complete checkpoints in `output_dir`, oldest first."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        m = _NAME.match(name)
        path = os.path.join(output_dir, name)
        if m and os.path.isfile(os.path.join(path, STATE_FILE)):
            found.append((int(m.group(1)), path))
    return [p for _, p in sorted(found)]


def step_of(path: str) -> int:
    """The step a complete checkpoint holds (its trainer_state.json)."""
    with open(os.path.join(path, STATE_FILE), encoding="utf-8") as f:
        return int(json.load(f)["step"])


def latest_checkpoint(output_dir: str) -> Optional[str]:
    found = list_checkpoints(output_dir)
    return found[-1] if found else None


def resolve_resume_path(resume_from_checkpoint: Union[bool, str, os.PathLike, None],
                        output_dir: str) -> Optional[str]:
    """`true` -> the latest checkpoint in output_dir; a path -> that path; None/false -> None."""
    if resume_from_checkpoint in (None, False, ""):
        return None
    if resume_from_checkpoint is True:
        path = latest_checkpoint(output_dir)
        if path is None:
            raise FileNotFoundError(f"resume_from_checkpoint: true, but {output_dir} holds no complete checkpoint")
        return path
    path = str(resume_from_checkpoint)
    if not os.path.isfile(os.path.join(path, STATE_FILE)):
        raise FileNotFoundError(f"resume_from_checkpoint: {path} is not a complete checkpoint (no {STATE_FILE})")
    return path


def load_trainer_state(path: str) -> Dict[str, Any]:
    with open(os.path.join(path, STATE_FILE), encoding="utf-8") as f:
        state = json.load(f)
    if not state.get("full"):
        raise ValueError(f"{path} was saved with ignore_save_lr_and_optim: true (model only); it can be used as "
                         "actor_model_name_or_path (a LoRA checkpoint: as lora_path, or merged by "
                         "tools/models/merge_lora.py) but not resumed from")
    return state


def load_optimizer_and_rng(path: str, optimizer: Any, model: paddle.nn.Layer, shard: Optional[Dict[str, int]] = None
                           ) -> None:
    """Restore this rank's part of the optimizer state (`shard`, as saved; keyed by `model`'s parameter names) and
    the random generators."""
    load_optimizer(path, optimizer, model, shard)
    with open(os.path.join(path, RNG_FILE), "rb") as f:
        set_rng_state(pickle.load(f))


def load_optimizer(directory: str, optimizer: Any, model: paddle.nn.Layer,
                   shard: Optional[Dict[str, int]] = None) -> None:
    """Restore this rank's part of the optimizer state from `directory` (what `save_optimizer` wrote)."""
    file = os.path.join(directory, optimizer_file(shard))
    if not os.path.isfile(file):
        raise FileNotFoundError(f"{file} not found: the checkpoint was saved with another tensor_parallel_degree, "
                                "pipeline_parallel_degree or sharding degree than this run's; resume with the same "
                                "degrees, or start a new run from its weights")
    inverse = {v: k for k, v in _param_names(model).items()}
    optimizer.set_state_dict(_rename_optimizer_state(paddle.load(file), inverse))


def load_weights(model: paddle.nn.Layer, path: str, **shard: int) -> None:
    """Load the weights of a save_pretrained directory into an existing model (same architecture; `shard`: the
    tensor-parallel degree/rank to split the full checkpoint for). A LoRA model gets the saved adapters."""
    from paddlenlp.transformers import AutoModelForCausalLM, AutoModelForConditionalGeneration

    from ..policy.lora import is_lora_model, load_adapters

    if is_lora_model(_unwrap(model)):
        load_adapters(_unwrap(model), path)
        return
    encoder_decoder = getattr(_unwrap(model).config, "is_encoder_decoder", False)
    auto = AutoModelForConditionalGeneration if encoder_decoder else AutoModelForCausalLM
    loaded = auto.from_pretrained(path, dtype="float32", **shard)
    # A model loaded in low precision (the precision plan's O2) takes its own dtype: set_value refuses a mismatch.
    own = {k: v.dtype for k, v in _unwrap(model).state_dict().items()}
    _unwrap(model).set_state_dict({k: v if own.get(k, v.dtype) == v.dtype else v.astype(own[k])
                                   for k, v in loaded.state_dict().items()})


def _param_names(model):
    """paddle's generated parameter names (`linear_12.w_0`, different in every process that builds a model) ->
    the model's structured names (`qwen2.layers.0.self_attn.q_proj.weight`, stable)."""
    return {p.name: n for n, p in _unwrap(model).named_parameters()}


def _rename_optimizer_state(state, mapping):
    """Optimizer accumulators are keyed `<param name>_<accumulator>`; rename the parameter part by `mapping`."""
    by_length = sorted(mapping, key=len, reverse=True)
    out = {}
    for key, value in state.items():
        if key == "master_weights" and isinstance(value, dict):
            out[key] = {mapping.get(k, k): v for k, v in value.items()}
            continue
        name = next((n for n in by_length if key == n or key.startswith(n + "_")), None)
        out[key if name is None else mapping[name] + key[len(name):]] = value
    return out


def _unwrap(model):
    return getattr(model, "_layers", model)  # paddle.DataParallel keeps the model in ._layers
