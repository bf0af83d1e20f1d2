"""`python run_rl.py CONFIG --dry_run`: check everything a run needs that does not need the run itself.

Checks, each reporting every problem it finds (not only the first): the data files (read as the trainer reads them:
line-numbered errors), the model and tokenizer directories (config.json and the tokenizer files load with PaddleNLP's
Auto classes, no weights), the reward functions or the reward server's `/health`, and the parallel layout against
the processes it implies. Prints the resolved config, a table of the keys with no effect on this device (with the
reason), and the exact launch command. Exit status 0 when that launch could start, 2 otherwise.

The key checks (names, types, ranges, combinations) happen before, in `config.load_config`, as for a real run.
"""
from __future__ import annotations

import os
import shlex
from typing import Callable, List, Optional, Sequence, Tuple

from .config import FIELDS, GROUPS, Config, ConfigError, key_effect, yaml_value

MAX_PROCESSES = 1024  # the launch sizes tried, as multiples of the model-parallel ranks
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


def launch_command(cfg: Config, argv: Sequence[str], device: str, script: str = "run_rl.py") -> str:
    """The command that starts this run (`argv`: the config file and overrides, without --dry_run) with the number
    of processes the config needs: plain `python run_rl.py ...` for one process, else paddle.distributed.launch
    (CPU: `--devices "" --nproc_per_node N`; GPU: `--devices "0,1,..."`)."""
    try:
        n = required_processes(cfg)
    except ConfigError:
        n = model_ranks(cfg)
    tail = " ".join([shlex.quote(script)] + [shlex.quote(a) for a in argv])
    if n == 1:
        return f"python {tail}"
    devices = '--devices "" --nproc_per_node ' + str(n) if device == "cpu" else \
        '--devices "' + ",".join(str(i) for i in range(n)) + '"'
    return f"python -m paddle.distributed.launch {devices} {tail}"


def keys_without_effect(cfg: Config, device: str) -> List[Tuple[str, str, str]]:
    """(key, value, reason) of every key that has no effect on `device`, in the documentation's order."""
    return [(f.name, yaml_value(getattr(cfg, f.name)), key_effect(f.name, device).note)
            for group in GROUPS for f in group.__dataclass_fields__.values()
            if f.name in FIELDS and not key_effect(f.name, device).active]


def check_data(cfg: Config) -> List[str]:
    """Problems with the training (and, with do_eval, evaluation) files, each naming file and line."""
    from .data import DataError, read_jsonl

    problems = []
    files = [("train_datasets", cfg.train_datasets)]
    if cfg.do_eval and cfg.eval_datasets:
        files.append(("eval_datasets", cfg.eval_datasets))
    for key, paths in files:
        if not paths.strip():
            problems.append(f"{key}: is empty; name the JSONL/parquet file(s) to read")
            continue
        try:
            n = len(read_jsonl(paths, prompt_key=cfg.prompt_key, response_key=cfg.response_key))
            print(f"  {key}: {n} records ({paths})")
        except (DataError, OSError) as e:
            problems.append(f"{key}: {e}")
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


def check_model(name: str, key: str) -> List[str]:
    """Problems loading the config.json and tokenizer of model `name` (no weights are read)."""
    if not name:
        return [f"{key}: is empty; name the model directory (or a PaddleNLP model ID)"]
    try:
        path, note = resolve_model(name, key)
    except (OSError, ValueError, ConfigError) as e:
        return [f"{key}: {e}"]
    if path is None:
        print(f"  note: {note}")
        return []
    if not os.path.isfile(os.path.join(path, "config.json")):
        return [f"{key}: '{path}' has no config.json (not a model directory written by save_pretrained)"]
    from paddlenlp.transformers import AutoConfig, AutoTokenizer

    from .policy import quiet_paddlenlp

    quiet_paddlenlp()
    try:
        config = AutoConfig.from_pretrained(path)
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001  PaddleNLP raises many types; the message is what the user needs
        return [f"{key}: '{path}' does not load with PaddleNLP's AutoConfig/AutoTokenizer: {type(e).__name__}: {e}"]
    print(f"  {key}: {path} ({type(config).__name__}, {type(tokenizer).__name__}, vocabulary {len(tokenizer)})")
    return []


def check_rewards(cfg: Config, get: Optional[Callable] = None) -> List[str]:
    """Problems with the reward: each reward server's GET /health (short timeout), or the in-process reward
    functions (resolved by name) and the reward model."""
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

    for name in [r.strip() for r in cfg.reward_funcs.split(",") if r.strip()]:
        try:
            get_reward_fn(name)
        except Exception as e:  # noqa: BLE001  a user's module may raise anything on import
            problems.append(f"reward_funcs: {name!r}: {e}")
    if cfg.reward_model_name_or_path:
        problems += check_model(cfg.reward_model_name_or_path, "reward_model_name_or_path")
    return problems


def check_layout(cfg: Config) -> Tuple[List[str], int]:
    """(problems, processes): whether the configured parallel layout can start, and on how many processes."""
    from .parallel.layout import check_pipeline_config, unsupported_layout

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


def visible_gpus() -> int:
    """GPUs paddle can see (0 on a CPU build)."""
    import paddle

    return paddle.device.cuda.device_count() if paddle.device.is_compiled_with_cuda() else 0


def dry_run(cfg: Config, argv: Sequence[str], device: str, script: str = "run_rl.py") -> int:
    """Run every check for `cfg` (loaded from `argv`: config file + overrides) on `device` ("cpu"/"gpu"), print
    the resolved config, the keys without effect and the launch command; 0 when that launch could start, else 2."""
    print("resolved configuration:")
    print(cfg.format(), end="")
    print("\nchecks:")
    problems = check_data(cfg)
    if cfg.build_actor_if_missing and not os.path.isdir(cfg.actor_model_name_or_path):
        print(f"  actor_model_name_or_path: '{cfg.actor_model_name_or_path}' will be built first by the "
              f"'{cfg.build_actor_if_missing}' recipe")
    else:
        problems += check_model(cfg.actor_model_name_or_path, "actor_model_name_or_path")
    problems += check_rewards(cfg)
    layout_problems, n = check_layout(cfg)
    problems += layout_problems
    if device == "gpu" and visible_gpus() < n:
        problems.append(f"the layout needs {n} GPUs; {visible_gpus()} are visible")
    rows = keys_without_effect(cfg, device)
    print(f"\nkeys with no effect on this device ({device}): {len(rows)}")
    width = max(len(k) for k, _, _ in rows)
    for key, value, reason in rows:
        value = value if len(value) <= 24 else value[:21] + "..."  # the amp lists: one line per key
        print(f"  {key:<{width}}  {value:<12}  {reason}")
    model = cfg.tensor_parallel_degree * cfg.pipeline_parallel_degree
    print(f"\nprocesses: {n} = tensor_parallel_degree {cfg.tensor_parallel_degree} x pipeline_parallel_degree "
          f"{cfg.pipeline_parallel_degree} x data/sharding ranks {n // model}")
    print(f"launch: {launch_command(cfg, argv, device, script)}")
    if problems:
        print(f"\ndry run: {len(problems)} problem(s); the launch would not start:")
        for p in problems:
            print(f"  - {p}")
        return 2
    print("\ndry run: ok")
    return 0
