"""How the run starts: `--dry_run` on the command line, the processes a layout takes (or the launch the dry
run itself runs under), and the exact launch command, thread settings included."""
from __future__ import annotations

import os
import shlex
from typing import List, Mapping, Optional, Sequence, Tuple

from ..config import Config, ConfigError, SECRET_KEYS


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


def check_layout(cfg: Config, launched: Optional[int] = None) -> Tuple[List[str], int]:
    """(problems, processes): whether the configured parallel layout can start, and on how many processes.
    `launched`: the processes of the launch the dry run itself runs under (launched_processes): the layout is checked
    on that many, as the run started by that launch would check it."""
    from ..parallel.layout import check_pipeline_config, unsupported_layout

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


def visible_gpus() -> int:
    """GPUs paddle can see (0 on a CPU build)."""
    import paddle

    return paddle.device.cuda.device_count() if paddle.device.is_compiled_with_cuda() else 0
