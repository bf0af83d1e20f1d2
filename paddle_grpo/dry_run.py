"""`python run_rl.py CONFIG --dry_run`: check everything a run needs that does not need the run itself.

Checks, each reporting every problem it finds (not only the first): the data files (read as the trainer reads them:
line-numbered errors), the model and tokenizer directories (config.json and the tokenizer files load with PaddleNLP's
Auto classes; the weight files must be there but are never read), the reward functions (a `reward_model:<dir or ID>`
entry like a model: never loaded, never downloaded) or the reward server's `/health`, the critic of a critic run
(rl_algorithm ppo, vapo: critic_model_name_or_path like a model, its config.json only), the tools (`tools`: each
loads, or the tool server's GET /tools answers and serves every named tool; `tool_format` for the tokenizer), the
prompts' token counts
against max_prompt_len (a warning with the numbers: see `check_prompt_lengths`), and the parallel layout against the
processes it implies. Prints the keys that differ from the defaults (the whole resolved configuration goes to a file
it names), a table of the keys the file or command line sets that have no effect on this device (with where and
why), and the exact launch command. Exit status 0 when that launch could start, 2 otherwise.

The key checks (names, types, ranges, combinations) happen before, in `config.load_config`, as for a real run.
`preflight` is the part of these checks that a real run makes at its start (run_rl.py), so that an empty model
directory or a missing data file is reported by its key there too, not by PaddleNLP's loader.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import os
import shlex
import tempfile
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .config import (DEVICES, FIELDS, GROUPS, SECRET_KEYS, Config, ConfigError, dump_config, encoder_decoder_refusal,
                     given_keys, group_size_notes, key_effect, relative_path_note, run_key_effect, shown_value,
                     yaml_value)

MAX_PROCESSES = 1024  # the launch sizes tried, as multiples of the model-parallel ranks
MAX_LENGTH_CHECKS = 20000  # prompts tokenized per data key (about a minute); beyond, an even sample of this many
_BOOLS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False}


def split_dry_run(argv: Sequence[str]) -> Tuple[bool, List[str]]:
    """(`--dry_run` given, the other arguments). `--dry_run`, `--dry_run true|false` and `--dry_run=...` are
    accepted; a value that is not a boolean is a ConfigError naming it."""
    rest, dry = [], False
    args = list(argv)
    i = 0
    while i < len(args):
        tok = args[i]
        if tok == "--dry_run" or tok.startswith("--dry_run="):
            value = tok.partition("=")[2] if "=" in tok else None
            if value is None and i + 1 < len(args) and args[i + 1].strip().lower() in _BOOLS:
                value = args[i + 1]  # `--dry_run true`; a bare `--dry_run` leaves the next argument alone
                i += 1
            if value is not None and value.strip().lower() not in _BOOLS:
                raise ConfigError(f"command line: --dry_run expects true or false, got {value!r}")
            dry = _BOOLS.get(value.strip().lower(), True) if value is not None else True
        else:
            rest.append(tok)
        i += 1
    return dry, rest


def model_ranks(cfg: Config) -> int:
    """Processes one copy of the data-parallel axis needs: tensor x pipeline x (sharding degree, when set)."""
    sharding = cfg.sharding_parallel_degree if cfg.sharding and cfg.sharding_parallel_degree > 0 else 1
    return cfg.tensor_parallel_degree * cfg.pipeline_parallel_degree * sharding


def required_processes(cfg: Config) -> int:
    """The smallest number of processes the configured layout and batch sizes split over (batch_geometry accepts
    it). Raises ConfigError with batch_geometry's message for the smallest candidate when none up to
    MAX_PROCESSES fits."""
    base = model_ranks(cfg)
    first_error: Optional[ConfigError] = None
    for n in range(base, MAX_PROCESSES + 1, base):
        try:
            cfg.batch_geometry(n)
            return n
        except ConfigError as e:
            first_error = first_error or e
    raise ConfigError(f"no number of processes fits this layout: with {base}: {first_error}")


def redact_secrets(argv: Sequence[str]) -> List[str]:
    """argv with the values of SECRET_KEYS (`--key value` and `--key=value`) replaced by *** (printed commands end up
    in logs and terminals' scrollback)."""
    out: List[str] = []
    hide_next = False
    for arg in argv:
        key, eq, _ = arg[2:].partition("=") if arg.startswith("--") else ("", "", "")
        if hide_next:
            out.append("***")
        elif key in SECRET_KEYS and eq:
            out.append(f"--{key}=***")
        else:
            out.append(arg)
        hide_next = not hide_next and key in SECRET_KEYS and not eq
    return out


# Thread counts the run reads from its environment (cpu_tuning, the rollout worker): a launch line that dropped
# them would start another run than the one checked.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def started_environment() -> Mapping[str, str]:
    """The environment this process was started with (/proc/self/environ): importing paddle sets OMP_NUM_THREADS=1
    in os.environ, which is not the user's setting. os.environ where /proc is not there."""
    try:
        with open("/proc/self/environ", "rb") as f:
            pairs = [item.partition(b"=") for item in f.read().split(b"\0") if item]
    except OSError:
        return os.environ
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs}


def launch_command(cfg: Config, argv: Sequence[str], device: str, script: str = "run_rl.py",
                   environ: Optional[Mapping[str, str]] = None) -> str:
    """The command that starts this run (`argv`: the config file and overrides, without --dry_run) with the number
    of processes the config needs: plain `python run_rl.py ...` for one process, else paddle.distributed.launch
    (CPU: `--devices "" --nproc_per_node N`; GPU: `--devices "0,1,..."`), after the THREAD_VARIABLES set in
    `environ` (default: the one this process started with). Tokens given on the command line are printed as ***
    (redact_secrets)."""
    try:
        n = required_processes(cfg)
    except ConfigError:
        n = model_ranks(cfg)
    tail = " ".join([shlex.quote(script)] + [shlex.quote(a) for a in redact_secrets(argv)])
    environ = started_environment() if environ is None else environ
    threads = "".join(f"{k}={shlex.quote(environ[k])} " for k in THREAD_VARIABLES if environ.get(k))
    if n == 1:
        return f"{threads}python {tail}"
    devices = '--devices "" --nproc_per_node ' + str(n) if device == "cpu" else \
        '--devices "' + ",".join(str(i) for i in range(n)) + '"'
    return f"{threads}python -m paddle.distributed.launch {devices} {tail}"


def launched_processes(environ: Mapping[str, str] = os.environ) -> Optional[int]:
    """The number of processes of the paddle.distributed.launch this process runs under (PADDLE_TRAINERS_NUM, which
    the launch sets for every rank), or None when it was started on its own."""
    value = environ.get("PADDLE_TRAINERS_NUM")
    return int(value) if value and value.isdigit() else None


def keys_without_effect(cfg: Config, device: str, given: Optional[Mapping[str, str]] = None
                        ) -> List[Tuple[str, str, str, str]]:
    """(key, value, where it was set, reason) of every key set in the file or on the command line (`given`: key ->
    'file:line' or 'command line'; default: what `cfg` was loaded from) that has no effect on `device`, in the
    documentation's order. The effect is the key's in this run (config.run_key_effect: the device's statement, or
    why the configured algorithm or schedule does not use it, e.g. the critic's keys with rl_algorithm grpo); the
    reason of a key without effect on any device starts with 'on every device: '. A token's value is '***'."""
    given = given_keys(cfg) if given is None else given
    effects = {name: run_key_effect(cfg, name, device) for name in given if name in FIELDS}
    return [(f.name, yaml_value(shown_value(f.name, getattr(cfg, f.name))), given[f.name],
             _on_every_device(f.name, effects[f.name].note))
            for group in GROUPS for f in group.__dataclass_fields__.values()
            if f.name in effects and not effects[f.name].active]


def _on_every_device(key: str, reason: str) -> str:
    """`reason`, prefixed with 'on every device: ' for a key that has no effect on any device (a PaddleNLP key
    accepted and not implemented here, e.g. sequence_parallel): not something a GPU would change."""
    return reason if any(key_effect(key, d).active for d in DEVICES) else f"on every device: {reason}"


def _keyed(key: str, message: str) -> str:
    """`key: message`, without naming the key twice when the message already starts with it."""
    return message if message.startswith(f"{key}:") else f"{key}: {message}"


def data_files(cfg: Config) -> List[Tuple[str, str]]:
    """(key, path) of every data file a run reads: train_datasets, and eval_datasets when do_eval."""
    keys = ["train_datasets"] + (["eval_datasets"] if cfg.do_eval and cfg.eval_datasets.strip() else [])
    return [(key, path.strip()) for key in keys for path in getattr(cfg, key).split(",") if path.strip()]


def check_data(cfg: Config, records: Optional[Dict[Tuple[str, str], list]] = None) -> List[str]:
    """Problems with the training (and, with do_eval, evaluation) files, each naming key, file and line. The records
    read are put in `records` ((key, path) -> records), for the prompt-length check."""
    from .data import DataError, read_jsonl

    problems = []
    for key in ["train_datasets"] + (["eval_datasets"] if cfg.do_eval and cfg.eval_datasets else []):
        if not getattr(cfg, key).replace(",", "").strip():
            problems.append(f"{key}: is empty; name the JSONL/parquet file(s) to read")
    for key, path in data_files(cfg):
        if not os.path.isfile(path):
            problems.append(f"{key}: {path}: file not found{relative_path_note(cfg, path)}")
            continue
        try:
            rows = read_jsonl(path, prompt_key=cfg.prompt_key, response_key=cfg.response_key)
        except (DataError, OSError) as e:
            problems.append(_keyed(key, str(e)))
            continue
        print(f"  {key}: {len(rows)} records ({path})")
        if records is not None:
            records[(key, path)] = rows
    return problems


def resolve_model(name: str, key: str) -> Tuple[Optional[str], Optional[str]]:
    """(local directory, note) for model `name`: a local directory as is; a hub ID from PaddleNLP's cache
    (policy.resolve_model_dir without downloading: a dry run must not fetch gigabytes). A hub ID that is not cached
    gives (None, a note that the run will download it) when PaddleNLP's server answers; otherwise, and for a name
    that is neither, FileNotFoundError names the ID and the cache searched."""
    from .policy import hub, resolve_model_dir

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


def _holdings(path: str) -> str:
    """'(it holds FILE, ...)' of an incomplete model directory (the first 8 names), and how to convert PyTorch's
    pickled weights when those are what it holds (hub.torch_pickle_note)."""
    from .policy import hub

    held = sorted(os.listdir(path))
    return (f"(it holds {', '.join(held[:8]) + (', ...' if len(held) > 8 else '') or 'nothing'})"
            f"{hub.torch_pickle_note(path)}")


def model_dir_problems(path: str, key: str) -> List[str]:
    """What local model directory `path` lacks (config.json, tokenizer_config.json, weight files), and whether its
    safetensors load as the run will load them (policy.hf_weights.plan: PaddleNLP's format as is, PyTorch's
    converted at start-up, anything else refused): file names and the weight files' headers only."""
    from .policy import hf_weights, hub

    missing = hub.missing_files(path)
    if not missing:
        try:
            hf_weights.plan(path)
        except (hf_weights.WeightFormatError, OSError, ValueError) as e:
            return [_keyed(key, str(e))]
        return []
    return [f"{key}: '{path}' is not a whole model directory (as save_pretrained writes it): it lacks "
            f"{', '.join(missing)} {_holdings(path)}"]


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
        return [_keyed(key, str(e)) + (relative_path_note(cfg, name) if cfg is not None else "")], None, None
    if path is None:
        print(f"  note: {note}")
        return [], None, None
    problems = model_dir_problems(path, key)
    if problems:
        return problems, None, None
    from paddlenlp.transformers import AutoConfig

    from .policy import quiet_paddlenlp, rope
    from .policy.tokenizer import read_tokenizer, tokenizer_kind

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
    from .policy import hf_weights

    weights = hf_weights.plan(path)  # checked by model_dir_problems above
    if weights.convert:  # what the run will load: the PaddleNLP copy of PyTorch-written safetensors
        print(f"  {weights.line(key)}")
    return [], config, tokenizer


def decoder_line(cfg: Config, config: Any) -> Optional[str]:
    """The run's start-up line "decoder: fast path (llama)" or "decoder: PaddleNLP's forward (<why>)", found as the
    run finds it (fast_decoder.describe on the policy model built from `config` with the run's precision flags, rope
    tables and LoRA) on a model of ONE decoder layer and a 16-token vocabulary: the layers' classes, biases and
    rotary tables are what the run's are (the path depends on them, not on their number or the vocabulary), no
    weight is read, and a large model costs one layer's memory. None for an encoder-decoder (the run prints no such
    line); the reason when the model cannot be built here."""
    if getattr(config, "is_encoder_decoder", False):
        return None
    from .policy import fast_decoder

    if cfg.tensor_parallel_degree > 1:  # its layers need the ranks' process group; the reason needs no layers
        return f"decoder: PaddleNLP's forward (tensor_parallel_degree is {cfg.tensor_parallel_degree})"
    if cfg.lora:
        return f"decoder: PaddleNLP's forward ({fast_decoder.LORA_REFUSAL})"
    import copy

    from paddlenlp.transformers import AutoModelForCausalLM

    from .policy import rope
    from .precision import plan_for_run

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
    return fast_decoder.describe(model)


def check_model(name: str, key: str) -> List[str]:
    """Problems with model `name` (inspect_model's, without the loaded config and tokenizer)."""
    return inspect_model(name, key)[0]


def reward_model_specs(cfg: Config) -> List[Tuple[str, str]]:
    """(label, model name) of the in-process reward models: each `reward_model:<dir or ID>` of reward_funcs and
    reward_model_name_or_path."""
    from .rewards.reward_model import REWARD_MODEL_PREFIX

    if cfg.use_rm_server:
        return []
    out = [(f"reward_funcs: {r}", r[len(REWARD_MODEL_PREFIX):].strip())
           for r in (x.strip() for x in cfg.reward_funcs.split(",")) if r.startswith(REWARD_MODEL_PREFIX)]
    if cfg.reward_model_name_or_path.strip():
        out.append(("reward_model_name_or_path", cfg.reward_model_name_or_path.strip()))
    return out


def check_rewards(cfg: Config, get: Optional[Callable] = None) -> List[str]:
    """Problems with the reward: each reward server's GET /health (short timeout), or the in-process reward
    functions (resolved by name) and reward models (checked as models: never loaded, never downloaded)."""
    problems = []
    if cfg.use_rm_server:
        import requests

        get = get or requests.get
        headers = {"Authorization": f"Bearer {cfg.reward_server_token}"} if cfg.reward_server_token else {}
        for url in [u.strip().rstrip("/") for u in cfg.reward_server.split(",") if u.strip()]:
            try:
                reply = get(url + "/health", timeout=5, headers=headers)
            except requests.RequestException as e:
                problems.append(f"reward_server: {url}/health cannot be reached: {type(e).__name__}: {e}")
                continue
            if reply.status_code == 404:  # PaddleNLP's own reward server has no /health
                print(f"  reward_server: {url} answers (no /health: a PaddleNLP server?)")
            elif reply.status_code != 200:
                problems.append(f"reward_server: {url}/health answered HTTP {reply.status_code}")
            else:
                print(f"  reward_server: {url}/health: ok")
        return problems
    from .rewards import get_reward_fn
    from .rewards.reward_model import REWARD_MODEL_PREFIX

    for name in [r.strip() for r in cfg.reward_funcs.split(",") if r.strip()]:
        if name.startswith(REWARD_MODEL_PREFIX):
            continue  # get_reward_fn would load (or download) the weights: checked below as a model
        try:
            get_reward_fn(name)
        except Exception as e:  # noqa: BLE001  a user's module may raise anything on import
            problems.append(f"reward_funcs: {name!r}: {e}")
    for label, name in reward_model_specs(cfg):
        problems += inspect_model(name, label, labels=1)[0]
    return problems


def check_tools(cfg: Config, tokenizer: Any = None, get: Optional[Callable] = None) -> List[str]:
    """Problems with the tools of a multi-turn run (`tools` set; none otherwise): in-process, each tool loads
    (`environment.load_tools`: registered names, `module:function`, `file.py:function`); with `tool_server`, its
    GET /tools answers (short timeout, the token sent) and serves every named tool. Never calls a tool. With the
    tokenizer, `tool_format` resolves for it (`environment.get_format`)."""
    if not cfg.tools:
        return []
    problems = []
    server = cfg.tool_server.strip().rstrip("/")
    if server:
        import requests

        get = get or requests.get
        headers = {"Authorization": f"Bearer {cfg.tool_server_token}"} if cfg.tool_server_token else {}
        try:
            reply = get(server + "/tools", timeout=5, headers=headers)
        except requests.RequestException as e:
            return [f"tool_server: {server}/tools cannot be reached: {type(e).__name__}: {e}"]
        try:
            body = reply.json()
        except ValueError:
            body = {}
        if reply.status_code != 200:
            why = body.get("error_msg", "") if isinstance(body, dict) else ""
            return [f"tool_server: {server}/tools answered HTTP {reply.status_code}{': ' + why if why else ''}"
                    + (" (check tool_server_token)" if reply.status_code == 401 else "")]
        try:
            served = [t["function"]["name"] for t in body["tools"]]
        except (KeyError, TypeError):
            return [f"tool_server: {server}/tools answered without a list of tool schemas (not a tool server?)"]
        missing = [name for name in cfg.tools if name not in served]
        if missing:
            problems.append(f"tools: {', '.join(missing)}: not served by tool_server {server} (it serves "
                            f"{', '.join(served) or 'no tools'}; start it with --tool {','.join(cfg.tools)})")
        else:
            print(f"  tool_server: {server}/tools: ok (serves {', '.join(served)})")
    else:
        from .environment import load_tools

        problems += tool_problems(cfg) + sandbox_problems(cfg)
        if not problems:
            toolset = load_tools(cfg.tools)
            print(f"  tools: {', '.join(toolset.names)} ({len(toolset.schemas())} schemas)")
    if tokenizer is not None:
        from .environment import get_format

        try:
            get_format(cfg.tool_format, tokenizer)
        except Exception as e:  # noqa: BLE001
            problems.append(f"tool_format: {cfg.tool_format!r}: {e}")
    return problems


def sandbox_problems(cfg: Config) -> List[str]:
    """The python tool's isolation `tool_sandbox` where it is demanded ("namespaces") and cannot be had here (a
    snippet is run to find out): one line saying why and how to get it."""
    from .environment import sandbox

    try:
        sandbox.set_isolation(cfg.tool_sandbox)
    except sandbox.SandboxUnavailable as e:
        return [f"tool_sandbox: {cfg.tool_sandbox!r}: {e}"]
    return []


def tool_problems(cfg: Config) -> List[str]:
    """One line per tool of `cfg.tools` that does not load in this process (none with tool_server: the server's
    GET /tools answers for its tools), with the closest registered name for a misspelt one. Loads each tool
    (environment.get_tool: a registered name, or imports `module:function`), never calls one."""
    if not cfg.tools or cfg.tool_server.strip():
        return []
    from .environment import available_tools, get_tool

    problems = []
    for spec in cfg.tools:
        try:
            get_tool(spec)
        except Exception as e:  # noqa: BLE001  a user's module may raise anything on import
            message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            close = difflib.get_close_matches(str(spec), available_tools(), n=1, cutoff=0.6) \
                if ":" not in str(spec) else []
            problems.append(f"tools: {message}" + (f" (did you mean '{close[0]}'?)" if close else ""))
    return problems


def preflight(cfg: Config) -> List[str]:
    """What a real run checks at its start, before loading anything (run_rl.py; exit 2 with these lines): every
    data file exists (named with its key), and every local model directory holds config.json, tokenizer_config.json
    and its weight files, so that a missing file is reported by its key, not by PaddleNLP's loader; and every
    in-process tool loads (tool_problems). File names only (and, for a critic or tools run, a local policy's
    config.json: an encoder-decoder policy is refused): no weights are read, no hub ID is looked up (the run
    resolves and downloads those itself, with its own message)."""
    from .policy import hub

    problems = [] if cfg.train_datasets.replace(",", "").strip() else \
        ["train_datasets: is empty; name the JSONL/parquet file(s) to read"]
    problems += [f"{key}: {path}: file not found{relative_path_note(cfg, path)}" for key, path in data_files(cfg)
                 if not os.path.isfile(path)]
    models = [] if cfg.build_actor_if_missing and not os.path.isdir(cfg.actor_model_name_or_path) else \
        [("actor_model_name_or_path", cfg.actor_model_name_or_path)]
    for key, name in models + reward_model_specs(cfg) + critic_spec(cfg):
        if os.path.isdir(name):
            problems += (critic_dir_problems if key == CRITIC_KEY else model_dir_problems)(name, key)
        elif not hub.looks_like_hub_id(name):
            problems.append(f"{key}: '{name}' is not a local model directory{relative_path_note(cfg, name)} (nor "
                            "a hub ID such as 'Qwen/Qwen2.5-1.5B-Instruct'); point it at a directory written by "
                            f"save_pretrained{hub.made_by_note(name)}")
    problems += tool_problems(cfg)  # a misspelt tool is named now, not after the model has loaded
    actor = cfg.actor_model_name_or_path
    if (cfg.needs_critic or cfg.tools) and os.path.isfile(os.path.join(actor, "config.json")):  # hub ID: trainer
        with open(os.path.join(actor, "config.json"), encoding="utf-8") as f:
            refusal = encoder_decoder_refusal(cfg, bool(json.load(f).get("is_encoder_decoder", False)))
        problems += [refusal] if refusal else []
    return problems


CRITIC_KEY = "critic_model_name_or_path"


def critic_spec(cfg: Config) -> List[Tuple[str, str]]:
    """[(critic_model_name_or_path, name)] when the run trains a critic and it is not the policy that
    build_actor_if_missing builds first (checked with it); else []."""
    name = cfg.critic_model_name_or_path.strip()
    if not cfg.needs_critic or critic_is_built_actor(cfg):
        return []
    return [(CRITIC_KEY, name)]


def critic_is_built_actor(cfg: Config) -> bool:
    """The critic starts from the policy that build_actor_if_missing builds at start-up (quickstart_ppo.yaml)."""
    return bool(cfg.build_actor_if_missing) and not os.path.isdir(cfg.actor_model_name_or_path) and \
        os.path.normpath(cfg.critic_model_name_or_path.strip()) == os.path.normpath(cfg.actor_model_name_or_path)


def critic_dir_problems(path: str, key: str = CRITIC_KEY) -> List[str]:
    """What a local critic directory lacks: config.json and its weight files. No tokenizer: the critic reads the
    policy's token ids (a critic checkpoint need not hold one)."""
    from .policy import hub

    missing = [m for m in hub.missing_files(path) if m != hub.TOKENIZER_CONFIG_FILE]
    if not missing:
        from .policy import hf_weights

        try:  # PyTorch-written safetensors convert as the policy's do; anything else PaddleNLP refuses is named
            hf_weights.plan(path)
        except (hf_weights.WeightFormatError, OSError, ValueError) as e:
            return [_keyed(key, str(e))]
        return []
    return [f"{key}: '{path}' is not a whole model directory: it lacks {', '.join(missing)} {_holdings(path)}"]


def check_critic(cfg: Config, policy_vocab: Optional[int]) -> List[str]:
    """Problems with the critic of a critic run (nothing for other runs): critic_model_name_or_path resolves as the
    policy's does (a local directory with config.json and weights, or a hub ID in PaddleNLP's cache; never
    downloaded), its config.json loads, and its vocabulary covers the policy's token ids (`policy_vocab`: the
    policy tokenizer's size, None when unknown). Prints one line about the critic."""
    if not cfg.needs_critic:
        return []
    name = cfg.critic_model_name_or_path.strip()
    if critic_is_built_actor(cfg):
        print(f"  {CRITIC_KEY}: the policy '{name}', built first by the '{cfg.build_actor_if_missing}' recipe: "
              "a causal LM: its backbone with a new value head initialised to zeros")
        return []
    try:
        path, note = resolve_model(name, CRITIC_KEY)
    except (OSError, ValueError, ConfigError) as e:
        return [_keyed(CRITIC_KEY, str(e))]
    if path is None:
        print(f"  note: {note}")
        return []
    problems = critic_dir_problems(path)
    if problems:
        return problems
    from paddlenlp.transformers import AutoConfig

    from .policy import quiet_paddlenlp

    quiet_paddlenlp()
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:  # noqa: BLE001  PaddleNLP raises many types; the message is what the user needs
        return [f"{CRITIC_KEY}: '{path}' does not load with PaddleNLP's AutoConfig: {type(e).__name__}: {e}"]
    vocab = getattr(config, "vocab_size", None)
    if policy_vocab is not None and vocab is not None and vocab < policy_vocab:
        return [f"{CRITIC_KEY}: '{path}' has a vocabulary of {vocab} tokens, the policy's tokenizer {policy_vocab}: "
                "the critic reads the policy's token ids, so it needs the policy's vocabulary"]
    if getattr(config, "is_encoder_decoder", False):
        return [f"{CRITIC_KEY}: '{path}' is an encoder-decoder model; the critic is a decoder backbone"]
    from .policy.critic import critic_plan  # load_critic's own kind, start-up text and refusals

    try:
        _, start = critic_plan(config, path, key=CRITIC_KEY)
    except (ValueError, FileNotFoundError) as e:
        return [_keyed(CRITIC_KEY, str(e))]
    print(f"  {CRITIC_KEY}: {path} ({type(config).__name__}, vocabulary {vocab}): {start}")
    return []


def critic_run_lines(cfg: Config) -> Tuple[List[str], List[str], List[str]]:
    """(lines, warnings, problems) of what a critic run (ppo, vapo) does with its keys as resolved, each saying
    where an unset key's value comes from: value pretraining, the policy's clip range, the critic's optimizer (its
    unset keys take the policy's), the positive-example LM loss and what counts as correct for it, and VAPO's
    lam_policy on short completions."""
    lines: List[str] = []
    warnings: List[str] = []
    problems: List[str] = []

    def origin(key: str) -> str:  # where the value of an Optional key comes from
        note = cfg.unset_note(key)
        return key if getattr(cfg, key) is not None else f"{key} unset: {note.removeprefix('null = ')}"

    if cfg.needs_critic:
        steps = cfg.critic_pretrain_steps
        lines.append(f"value pretraining: {steps} step{'s' if steps != 1 else ''} update only the critic "
                     f"({origin('pretrain_critic_steps')}); the policy's schedule spans the "
                     f"{max(0, cfg.max_steps - steps) if cfg.max_steps > 0 else 'remaining'} steps after them")
        from .config.critic import CRITIC_INHERITS

        settings = ", ".join(f"{key} {yaml_value(cfg.critic_setting(key))}" +
                             ("" if getattr(cfg, key) is not None else f" (unset: the policy's {CRITIC_INHERITS[key]})")
                             for key in ("critic_learning_rate", "critic_min_learning_rate",
                                         "critic_lr_scheduler_type", "critic_weight_decay"))
        warmup = (f"critic_warmup_ratio {cfg.critic_warmup_ratio}" if cfg.critic_warmup_ratio is not None else
                  f"{cfg.unset_note('critic_warmup_ratio').removeprefix('null = ')} (critic_warmup_ratio unset)")
        lines.append(f"critic optimizer: {settings}; warm-up: {warmup}")
    if cfg.needs_critic or cfg.clip_range_ratio_high is not None:
        lines.append(f"policy clip range: [1 - {cfg.eps_low}, 1 + {cfg.eps_high}] "
                     f"({origin('clip_range_ratio_high')})")
    if cfg.positive_lm_coeff > 0:
        declared, where = None, "asked from the reward server's /health at start-up"
        from .rewards.reward_model import REWARD_MODEL_PREFIX

        names = [r.strip() for r in cfg.reward_funcs.split(",") if r.strip()]
        if not cfg.use_rm_server and not any(n.startswith(REWARD_MODEL_PREFIX) for n in names):
            from .rewards.combine import RewardSet  # functions only: no model weights are read
            try:
                declared = RewardSet(cfg.reward_funcs, cfg.reward_weights).max_score
                where = "the reward functions declare none" if declared is None else \
                    f"the maximum the reward functions declare, {declared}, minus 1e-6"
            except Exception:  # noqa: BLE001  check_rewards reports a function that does not load
                where = "the reward functions do not load"
        threshold = cfg.positive_min_reward(declared)
        if cfg.positive_example_min_reward is not None:
            where = "positive_example_min_reward"
        elif cfg.eval_max_reward is not None:
            where = f"eval_max_reward {cfg.eval_max_reward} minus 1e-6"
        coeff = (f"{cfg.positive_lm_coeff} ({origin('positive_example_lm_coeff')})")
        if threshold is None and not cfg.use_rm_server:
            problems.append("positive_example_lm_coeff: the positive-example LM loss is on "
                            f"({coeff}) but no reward counts as correct ({where}): set positive_example_min_reward "
                            "or eval_max_reward, or positive_example_lm_coeff: 0")
        shown = "unknown" if threshold is None else f">= {threshold!r}"
        lines.append(f"positive-example LM loss: coefficient {coeff}, on every completion of the batch with a reward "
                     f"{shown} ({where}), whatever its group scored")
    if cfg.rl_algorithm == "vapo":
        shortest = 1.0 / cfg.vapo_alpha
        lines.append(f"lam_policy = max(0, 1 - 1 / (vapo_alpha {cfg.vapo_alpha} x l)) is 0 for completions of "
                     f"l <= {shortest:g} tokens: their advantages are one-step TD errors, and the policy learns "
                     "only as fast as the critic's values become informative")
        if cfg.max_dec_len <= shortest:
            warnings.append(f"vapo: max_dec_len {cfg.max_dec_len} <= 1 / vapo_alpha = {shortest:g}: lam_policy is 0 "
                            "for every completion (one-step TD advantages only); choose vapo_alpha of the order of "
                            "1 / (typical answer length) for short answers")
    return lines, warnings, problems


def _record_places(path: str) -> List[str]:
    """'file:line' (JSONL; blank lines are skipped, as read_jsonl skips them) or 'file: row N' (parquet) of each
    record of a data file, in read_jsonl's order."""
    if path.endswith(".parquet"):
        import pandas as pd

        return [f"{path}: row {i}" for i in range(1, len(pd.read_parquet(path)) + 1)]
    with open(path, "rb") as f:
        return [f"{path}:{n}" for n, raw in enumerate(f, start=1) if raw.decode("utf-8", "replace").strip()]


def prompt_renderer(cfg: Config, tokenizer: Any) -> Optional[Callable[[str], str]]:
    """With `tools` (and a chat template), the prompt text the trainer builds for a record's `src`: the tools' schemas
    listed (step.PromptEncoder.text: the format's `prompt_with_tools`), which can make a prompt hundreds of tokens
    longer; None without tools, or when the tools or the format do not load (check_tools reports why)."""
    if not cfg.tools or cfg.chat_template == "none":
        return None
    from .environment import RemoteToolSet, get_format, load_tools

    server = cfg.tool_server.strip()
    try:
        toolset = RemoteToolSet(server, cfg.tool_server_token, timeout_s=5, retries=0, names=cfg.tools) if server \
            else load_tools(cfg.tools)
        fmt = get_format(cfg.tool_format, tokenizer)
    except Exception:  # noqa: BLE001 - check_tools names the problem
        return None
    schemas = toolset.schemas()
    return lambda src: fmt.prompt_with_tools(src, tokenizer, schemas, None, mode=cfg.chat_template)


def check_prompt_lengths(cfg: Config, tokenizer: Any, config: Any, records: Dict[Tuple[str, str], list]
                         ) -> List[str]:
    """Warnings for prompts longer than max_prompt_len: the trainer keeps only their last max_prompt_len tokens
    (data.collate_prompts; the start, usually the instructions, is lost). Each prompt is encoded as the trainer
    encodes it (chat template, tokenizer, an encoder-decoder's special tokens); one line per key with how many of
    how many, the longest and the file and line of the longest. With tools, the prompts list them (`prompt_renderer`).

    A warning, not a problem: the launch can start and trains (PaddleNLP truncates the same way), a few long
    outliers may be truncated on purpose, and the exit status says only whether the launch can start."""
    from .data import apply_chat_template, tokenize_prompts

    wrap = None
    if getattr(config, "is_encoder_decoder", False):
        from .policy.seq2seq import encoder_input_ids

        wrap = encoder_input_ids
    render = prompt_renderer(cfg, tokenizer) or (lambda src: apply_chat_template(src, tokenizer,
                                                                                 mode=cfg.chat_template))
    per_key: Dict[str, list] = {}
    total = {key: sum(len(rows) for (k, _), rows in records.items() if k == key) for key, _ in records}
    # PaddleNLP's python tokenizers take 1-4 ms per prompt here: beyond MAX_LENGTH_CHECKS, an even sample
    stride = {key: -(-n // MAX_LENGTH_CHECKS) for key, n in total.items()}
    for (key, path), rows in records.items():
        picked = range(0, len(rows), stride[key])
        texts = [render(rows[i]["src"]) for i in picked]
        lengths = [len(wrap(tokenizer, ids) if wrap else ids) for ids in tokenize_prompts(tokenizer, texts)]
        per_key.setdefault(key, []).extend((n, path, i) for i, n in zip(picked, lengths))
    warnings = []
    for key, rows in per_key.items():
        longest, path, index = max(rows)
        over = sum(n > cfg.max_prompt_len for n, _, _ in rows)
        sample = "" if stride[key] == 1 else f" (a sample: 1 in {stride[key]} of {total[key]})"
        if not over:
            print(f"  {key}: prompts of {min(n for n, _, _ in rows)}-{longest} tokens, none longer than "
                  f"max_prompt_len ({cfg.max_prompt_len}){sample}")
            continue
        place = _record_places(path)[index]
        warnings.append(f"{key}: {over} of {len(rows)} prompts{sample} are longer than max_prompt_len "
                        f"({cfg.max_prompt_len}) "
                        f"and would be left-truncated (their first tokens dropped); the longest has {longest} tokens "
                        f"({place}). To keep them whole: max_prompt_len {longest} (and max_length at least "
                        f"{longest} + max_dec_len = {longest + cfg.max_dec_len})")
    return warnings


def check_layout(cfg: Config, launched: Optional[int] = None) -> Tuple[List[str], int]:
    """(problems, processes): whether the configured parallel layout can start, and on how many processes.
    `launched`: the processes of the launch the dry run itself runs under (launched_processes): the layout is checked
    on that many, as the run started by that launch would check it."""
    from .parallel.layout import check_pipeline_config, unsupported_layout

    if launched is not None:
        n = launched
        try:
            cfg.batch_geometry(n)
        except ConfigError as e:
            return [f"this dry run runs under paddle.distributed.launch with {n} processes, where the run would stop: "
                    f"{e}"], n
    else:
        try:
            n = required_processes(cfg)
        except ConfigError as e:
            return [str(e)], model_ranks(cfg)
    problems = unsupported_layout(cfg) if n > 1 else []
    try:
        check_pipeline_config(cfg, n)
    except (ConfigError, NotImplementedError) as e:
        problems.append(str(e))
    return problems, n


def async_plan(cfg: Config, processes: int) -> Tuple[List[str], List[str]]:
    """(lines, problems) of `async_rollout` (docs/async.md): what overlaps and with which weights; more than one
    process is a problem (the rollout worker is not part of the ranks' process group)."""
    if not cfg.async_rollout:
        return [], []
    if processes > 1:
        return [], [f"key 'async_rollout' = True: this layout takes {processes} processes, and a rollout worker runs "
                    "beside one trainer process only (the collect phase's cross-rank steps need the ranks' process "
                    "group): set async_rollout false, or use one process"]
    lag = cfg.rollout_lag
    when = ("it waits for each update: the synchronous results, nothing overlaps" if lag == 0 else
            f"it runs up to {lag} step(s) ahead, so step t's rollout and rewards overlap the trainer's update on "
            f"step t-1's samples (staleness {lag} from step {lag + 1} on)")
    limit = (f"stops the run after {cfg.rollout_worker_timeout_s:g} s without samples"
             if cfg.rollout_worker_timeout_s else "waits for samples without a limit")
    reference_line = []
    if cfg.needs_reference_model:
        where = ("the worker, with the samples (rollout_worker_reference; the trainer loads no reference copy)"
                 if cfg.reference_in_rollout_worker else
                 "the trainer (" + ("sync_ref_model mixes its reference" if cfg.sync_ref_model else
                                    "rollout_worker_reference false") + ")")
        reference_line = [f"async rollout: the reference log-probs (the KL terms) are computed by {where}"]
    return [f"async rollout: {correction_line(cfg)}",
            f"async rollout: a rollout worker process samples step t with the weights after step t-{lag + 1} "
            f"(rollout_lag {lag}; before step 1: the initial weights) and scores the samples; {when}",
            f"async rollout: the trainer writes its {'LoRA adapters' if cfg.lora else 'trainable weights'} once per "
            f"step to a private directory (/dev/shm when present) that the worker reads, and {limit}; the worker "
            f"logs to {os.path.join(cfg.output_dir, 'rollout_worker.log')}", threads_line(cfg)] + reference_line, []


def correction_line(cfg: Any) -> str:
    """The rollout correction the run applies and why (Config.correction_mode: unset, clip with a lagged sampler)."""
    line = f"rollout_correction {cfg.correction_mode} ({cfg.correction_reason})"
    if cfg.correction_mode == "none" and cfg.rollout_lag > 0:
        line += (f": the samples are {cfg.rollout_lag} update(s) stale and uncorrected, which collapsed the "
                 "quickstart (docs/async.md)")
    return line


def threads_line(cfg: Any) -> str:
    """How many kernel threads the trainer and the rollout worker run, and whether they compete for the cores."""
    from .kernels.numpy_kernels import threads
    from .rollout.async_worker import oversubscribed

    trainer, cores = threads(), len(os.sched_getaffinity(0))
    worker = cfg.rollout_worker_threads or trainer
    how = ("rollout_worker_threads" if cfg.rollout_worker_threads else "the trainer's, rollout_worker_threads 0")
    verdict = ("they compete (a warning at start-up; docs/async.md)" if oversubscribed(trainer, worker, cores)
               else "they fit")
    return (f"async rollout: the trainer's kernels run {trainer} thread(s) (OMP_NUM_THREADS), the worker's {worker} "
            f"({how}), on {cores} usable core(s): {verdict}")


def visible_gpus() -> int:
    """GPUs paddle can see (0 on a CPU build)."""
    import paddle

    return paddle.device.cuda.device_count() if paddle.device.is_compiled_with_cuda() else 0


def resolved_config_file(cfg: Config) -> str:
    """Write the whole resolved configuration to a file in the temporary directory and return its path: a dry run
    writes nothing into output_dir. The file is named by the run's output_dir (its absolute path), so every dry run
    of one run overwrites the same file rather than leaving one more behind each time a value changes."""
    run = os.path.abspath(cfg.output_dir)
    digest = hashlib.sha1(run.encode("utf-8")).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"paddle_grpo_dry_run_{digest}.yaml")
    dump_config(cfg, path)
    return path


def dry_run(cfg: Config, argv: Sequence[str], device: str, script: str = "run_rl.py") -> int:
    """Run every check for `cfg` (loaded from `argv`: config file + overrides) on `device` ("cpu"/"gpu"), print
    the keys that differ from the defaults, the keys set without effect, the warnings and the launch command; 0 when
    that launch could start, else 2."""
    print(f"configuration: the keys that differ from the defaults (all keys, resolved: {resolved_config_file(cfg)}; "
          f"a run writes them to {os.path.join(cfg.output_dir, 'config.yaml')})")
    print(cfg.format(only_changed=True), end="")
    print("\nchecks:")
    records: Dict[Tuple[str, str], list] = {}
    problems = check_data(cfg, records)
    # rollout_n 1 under a group estimator: the run trains, on other advantages than the estimator's name says
    warnings: List[str] = group_size_notes(cfg, given_keys(cfg))
    tokenizer = None
    if cfg.build_actor_if_missing and not os.path.isdir(cfg.actor_model_name_or_path):
        print(f"  actor_model_name_or_path: '{cfg.actor_model_name_or_path}' will be built first by the "
              f"'{cfg.build_actor_if_missing}' recipe (prompt lengths not checked: its tokenizer is built with it)")
    else:
        model_problems, config, tokenizer = inspect_model(cfg.actor_model_name_or_path, "actor_model_name_or_path",
                                                          cfg=cfg)
        problems += model_problems
        if config is not None:  # the LM head the run will use (chunked or full logits), as the run says it
            print(f"  {cfg.lm_head_decision(int(config.vocab_size))[1]}")
            line = decoder_line(cfg, config)
            print(f"  {line}" if line else "", end="\n" if line else "")
            refusal = encoder_decoder_refusal(cfg, bool(getattr(config, "is_encoder_decoder", False)))
            problems += [refusal] if refusal else []
        if tokenizer is not None and records:
            warnings += check_prompt_lengths(cfg, tokenizer, config, records)
    problems += check_critic(cfg, len(tokenizer) if tokenizer is not None else None)
    critic_lines, critic_warnings, critic_problems = critic_run_lines(cfg)  # ppo / vapo keys, resolved
    print("".join(f"  {line}\n" for line in critic_lines), end="")
    warnings, problems = warnings + critic_warnings, problems + critic_problems
    problems += check_rewards(cfg)
    problems += check_tools(cfg, tokenizer)
    launched = launched_processes()
    layout_problems, n = check_layout(cfg, launched)
    problems += layout_problems
    async_lines, async_problems = async_plan(cfg, n)
    print("".join(f"  {line}\n" for line in async_lines), end="")
    problems += async_problems
    if device == "gpu" and visible_gpus() < n:
        problems.append(f"the layout needs {n} GPUs; {visible_gpus()} are visible")
    rows = keys_without_effect(cfg, device)
    print(f"\nkeys set here that have no effect on this device ({device}): {len(rows) or 'none'}")
    key_width = max((len(k) for k, _, _, _ in rows), default=0)
    where_width = max((len(w) for _, _, w, _ in rows), default=0)
    for key, value, where, reason in rows:
        value = value if len(value) <= 24 else value[:21] + "..."  # the amp lists: one line per key
        print(f"  {key:<{key_width}}  {value:<12}  {where:<{where_width}}  {reason}")
    model = cfg.tensor_parallel_degree * cfg.pipeline_parallel_degree
    print(f"\nprocesses: {n} = tensor_parallel_degree {cfg.tensor_parallel_degree} x pipeline_parallel_degree "
          f"{cfg.pipeline_parallel_degree} x data/sharding ranks {n // model}"
          + (" (this dry run's own paddle.distributed.launch)" if launched is not None else ""))
    print(f"launch: {launch_command(cfg, argv, device, script)}")
    if warnings:
        print(f"\nwarning{'s' if len(warnings) > 1 else ''} (the launch can start, but check these):")
        for w in warnings:
            print(f"  ! {w}")
    if problems:
        print(f"\ndry run: {len(problems)} problem(s); the launch would not start:")
        for p in problems:
            print(f"  - {p}")
        return 2
    print(f"\ndry run: ok, with {len(warnings)} warning(s) above" if warnings else "\ndry run: ok")
    return 0
