"""The model and tokenizer directories: files there, config.json and tokenizer loading as the run loads them (no
weights read, nothing downloaded), and the decoder path the run will take."""
from __future__ import annotations

import os
from typing import Any, List, Optional, Tuple

from ..config import Config, ConfigError, relative_path_note
from .keys import keyed


def resolve_model(name: str, key: str) -> Tuple[Optional[str], Optional[str]]:
    """(local directory, note) for model `name`: a local directory as is; a hub ID from PaddleNLP's cache
    (policy.resolve_model_dir without downloading: a dry run must not fetch gigabytes). A hub ID that is not cached
    gives (None, a note that the run will download it) when PaddleNLP's server answers; otherwise, and for a name
    that is neither, FileNotFoundError names the ID and the cache searched."""
    from ..policy import hub, resolve_model_dir

    try:
        return resolve_model_dir(name, key=key, download=False), None
    except FileNotFoundError:
        if not hub.looks_like_hub_id(name):
            raise
        blocker = hub.download_blocker()  # one probe of PaddleNLP's server (up to its timeout)
        if blocker is not None:
            raise FileNotFoundError(f"'{name}' is neither a local directory nor in PaddleNLP's cache "
                                    f"({hub.hub_cache_dir(name)}, under PPNLP_HOME), and PaddleNLP cannot download "
                                    f"it now: {blocker}") from None
        return None, (f"{key}: '{name}' is not in PaddleNLP's cache ({hub.hub_cache_dir(name)}); the run downloads "
                      "it through PaddleNLP's from_pretrained at start-up")


def holdings(path: str) -> str:
    """'(it holds FILE, ...)' of an incomplete model directory (the first 8 names), and how to convert PyTorch's
    pickled weights when those are what it holds (hub.torch_pickle_note)."""
    from ..policy import hub

    held = sorted(os.listdir(path))
    return (f"(it holds {', '.join(held[:8]) + (', ...' if len(held) > 8 else '') or 'nothing'})"
            f"{hub.torch_pickle_note(path)}")


def model_dir_problems(path: str, key: str) -> List[str]:
    """What local model directory `path` lacks (config.json, tokenizer_config.json, weight files), and whether its
    safetensors load as the run will load them (policy.hf_weights.plan: PaddleNLP's format as is, PyTorch's
    converted at start-up, anything else refused): file names and the weight files' headers only."""
    from ..policy import hf_weights, hub

    missing = hub.missing_files(path)
    if not missing:
        try:
            hf_weights.plan(path)
        except (hf_weights.WeightFormatError, OSError, ValueError) as e:
            return [keyed(key, str(e))]
        return []
    return [f"{key}: '{path}' is not a whole model directory (as save_pretrained writes it): it lacks "
            f"{', '.join(missing)} {holdings(path)}"]


def inspect_model(name: str, key: str, labels: Optional[int] = None, cfg: Optional[Config] = None
                  ) -> Tuple[List[str], Any, Any]:
    """(problems, config, tokenizer) of model `name`: its files are there, and its config.json and tokenizer load
    with PaddleNLP's Auto classes. No weights are read and nothing is downloaded. `labels`: the num_labels the
    config must have (1 for a reward model). config and tokenizer are None when they were not loaded. `cfg`: the
    configuration `name` comes from, for where a relative path was looked for (relative_path_note)."""
    if not name:
        return [f"{key}: is empty; name the model directory (or a PaddleNLP model ID)"], None, None
    try:
        path, note = resolve_model(name, key)
    except (OSError, ValueError, ConfigError) as e:
        return [keyed(key, str(e)) + (relative_path_note(cfg, name) if cfg is not None else "")], None, None
    if path is None:
        print(f"  note: {note}")
        return [], None, None
    problems = model_dir_problems(path, key)
    if problems:
        return problems, None, None
    from paddlenlp.transformers import AutoConfig

    from ..policy import quiet_paddlenlp, rope
    from ..policy.tokenizer import read_tokenizer, tokenizer_kind

    quiet_paddlenlp()
    try:  # as the run reads them: rope as transformers 4 or 5 wrote it, tokenizer.json whatever its class
        config = rope.normalize(AutoConfig.from_pretrained(path), os.path.join(path, "config.json"))
        tokenizer = read_tokenizer(path)
    except rope.RopeError as e:
        return [f"{key}: {e}"], None, None
    except Exception as e:  # noqa: BLE001  PaddleNLP raises many types; the message is what the user needs
        return ([f"{key}: '{path}' does not load with PaddleNLP's AutoConfig or its tokenizer "
                 f"({tokenizer_kind(path)}): {type(e).__name__}: {e}"], None, None)
    if labels is not None and getattr(config, "num_labels", None) != labels:
        return ([f"{key}: '{path}' has num_labels {getattr(config, 'num_labels', None)} in its config.json; a reward "
                 f"model has {labels} (one score per sequence)"], config, tokenizer)
    print(f"  {key}: {path} ({type(config).__name__}, {tokenizer_kind(path)}, vocabulary {len(tokenizer)})")
    if getattr(config, "rope_theta", None) is not None and not getattr(config, "is_encoder_decoder", False):
        scaling = rope.scaling_of(config)
        print(f"  {key}: rope theta {config.rope_theta:g}, " +
              (f"scaling {scaling} (transformers' tables: policy/rope.py)" if scaling else "no scaling"))
    from ..policy import hf_weights

    weights = hf_weights.plan(path)  # checked by model_dir_problems above
    if weights.convert:  # what the run will load: the PaddleNLP copy of PyTorch-written safetensors
        print(f"  {weights.line(key)}")
    return [], config, tokenizer


# How decoder_line begins a line saying the run would stop (a rollout_precision the model or CPU cannot run): the
# dry run counts it as a problem.
STOPS = "the run stops at start-up: "


def decoder_line(cfg: Config, config: Any) -> Optional[str]:
    """The run's start-up line "decoder: fast path (llama)" (on CPU with a second line, the decode engine's) or
    "decoder: PaddleNLP's forward (<why>)", found as the run finds it (causal.decoder_path on the policy model built
    from `config` with the run's precision flags, rope tables and LoRA adapters, and its rollout_precision) on a model
    of ONE decoder layer and a 16-token vocabulary: the layers' classes, biases and
    rotary tables are what the run's are (the path depends on them, not on their number or the vocabulary), no
    weight is read, and a large model costs one layer's memory. None for an encoder-decoder (the run prints no such
    line); the reason when the model cannot be built here."""
    if getattr(config, "is_encoder_decoder", False):
        return None
    from ..policy import fast_decoder

    if cfg.tensor_parallel_degree > 1:  # its layers need the ranks' process group; the reason needs no layers
        return f"decoder: PaddleNLP's forward (tensor_parallel_degree is {cfg.tensor_parallel_degree})"
    import copy

    from paddlenlp.transformers import AutoModelForCausalLM

    from ..policy import rope
    from ..precision import plan_for_run

    plan = plan_for_run(cfg, announce=False)
    config = copy.deepcopy(config)
    for key, value in dict(plan.model_flags).items():
        setattr(config, key, value)
    config.recompute = bool(cfg.recompute)
    config.num_hidden_layers, config.vocab_size, config.intermediate_size = 1, 16, 16
    try:
        model = AutoModelForCausalLM.from_config(config, dtype=plan.load_dtype)
        rope.install(model)
    except Exception as e:  # noqa: BLE001 - a config PaddleNLP cannot build: the run would say so at load
        return f"decoder: not determined here ({type(e).__name__}: {e})"
    if cfg.lora:  # the adapters change the sampling path (merged into the lean one) and the log-probs' (PaddleNLP's)
        from ..policy import lora

        try:
            saved = lora.read_adapter_config(cfg.lora_path) if cfg.lora_path else None
        except Exception as e:  # noqa: BLE001 - the run stops on the same file; the dry run's other checks name it
            return f"decoder: not determined here (lora_path {cfg.lora_path}: {type(e).__name__}: {e})"
        model = (lora.apply_saved_lora(model, saved) if saved else
                 lora.apply_lora(model, rank=cfg.lora_rank, alpha=cfg.lora_alpha_value,
                                 target_modules=cfg.target_modules or None))
    from ..policy.causal import decoder_path

    try:
        return decoder_path(model, cfg.rollout_precision)  # with the CPU decode engine's products
    except ValueError as e:  # a rollout_precision this model or CPU cannot run: the run stops at start-up
        return f"{fast_decoder.describe(model)}\n{STOPS}{e}"


def check_model(name: str, key: str) -> List[str]:
    """Problems with model `name` (inspect_model's, without the loaded config and tokenizer)."""
    return inspect_model(name, key)[0]
