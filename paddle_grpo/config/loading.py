"""Loading: YAML/JSON files (with each key's line number) and `--key value` overrides, converted by field type,
then validated; writing the resolved configuration back out."""
from __future__ import annotations

import difflib
import json
import os
import typing
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import yaml

from .effects import inert_key_messages
from .fields import ALIASES, SECRET_ENV, SECRET_KEYS, ConfigError, logger, raise_errors, shown_value
from .flat import FIELDS, Config
from .validation import resolve_rollout_correction, resolve_rule_reward, validate

# ----------------------------------------------------------------------------------------------------- loading

class _Source:
    """Where a value came from, for error messages: 'file.yaml:12' or 'command line'."""

    def __init__(self, path=None, lines=None):
        self.path, self.lines = path, lines or {}

    def where(self, key):
        if self.path is None:
            return "command line"
        line = self.lines.get(key)
        return f"{self.path}:{line}" if line else str(self.path)


def _read_file(path):
    """Flat mapping from a YAML or JSON file, with the line number of each key."""
    if not os.path.isfile(path):
        raise ConfigError(f"config file not found: {path}")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        node = yaml.compose(text)  # JSON is YAML, and the node tree keeps line numbers
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML/JSON: {e}") from None
    if node is None:
        return {}, {}
    if not isinstance(node, yaml.MappingNode):
        raise ConfigError(f"{path}: the top level must be a mapping of key: value, got a {node.tag.rsplit(':', 1)[-1]}")
    values = yaml.safe_load(text)
    lines = {}
    for key_node, _ in node.value:
        if key_node.value in lines:
            raise ConfigError(f"{path}:{key_node.start_mark.line + 1}: key '{key_node.value}' appears twice "
                              f"(first on line {lines[key_node.value]})")
        lines[key_node.value] = key_node.start_mark.line + 1
    return values, lines


def _parse_overrides(argv):
    """`--key value` / `--key=value` pairs; values stay strings and are converted by field type."""
    out, i = {}, 0
    while i < len(argv):
        tok = argv[i]
        if not tok.startswith("--") or tok == "--":
            raise ConfigError(f"command line: expected --key value, got '{tok}'")
        if "=" in tok:
            key, val = tok[2:].split("=", 1)
            i += 1
        else:
            key = tok[2:]
            if i + 1 >= len(argv) or (argv[i + 1].startswith("--") and len(argv[i + 1]) > 2):
                raise ConfigError(f"command line: --{key} needs a value")
            val = argv[i + 1]
            i += 2
        out[key] = val
    return out


_BOOL_STRINGS = {"true": True, "false": False, "1": True, "0": False, "yes": True, "no": False, "on": True,
                 "off": False}


def _convert(value, tp, key, where):
    """Value of YAML/JSON/command-line origin converted to the field type `tp`, or ConfigError."""
    origin, targs = typing.get_origin(tp), typing.get_args(tp)

    def bad(expected):
        shown = "***" if key in SECRET_KEYS else repr(value)  # a mistyped token is still a secret
        return ConfigError(f"{where}: key '{key}' expects {expected}, got {shown} ({type(value).__name__})")

    if origin is Union:
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in targs:
                return None
        members = [a for a in targs if a is not type(None)]
        if len(members) == 1:  # Optional[X]: X's own, more specific message
            return _convert(value, members[0], key, where)
        for t in members:
            try:
                return _convert(value, t, key, where)
            except ConfigError:
                pass
        raise bad(" or ".join(_type_name(a) for a in members))
    if origin in (list, List):
        if isinstance(value, str):  # command line or a YAML scalar: comma-separated
            value = [v.strip() for v in value.strip("[]").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise bad("a list")
        return [_convert(v, targs[0], f"{key}[{i}]", where) for i, v in enumerate(value)]
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):  # PaddleNLP scripts write `--recompute 1`
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in _BOOL_STRINGS:
            return _BOOL_STRINGS[value.strip().lower()]
        raise bad("true or false")
    if tp is int:
        if isinstance(value, bool):
            raise bad("an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                try:
                    f = float(value)
                except ValueError:
                    raise bad("an integer") from None
                if f.is_integer():
                    return int(f)
        raise bad("an integer")
    if tp is float:
        if isinstance(value, bool):
            raise bad("a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            # PyYAML reads `5e-7` (no dot) as a string; PaddleNLP's own configs are written that way.
            try:
                return float(value.strip())
            except ValueError:
                pass
        raise bad("a number")
    if tp is str:
        if isinstance(value, (dict, list)):
            raise bad("a string")
        return "" if value is None else str(value)
    raise TypeError(f"unsupported field type {tp} for {key}")


def _type_name(tp):
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(tp, "a list")


def _field_type(f):
    hints = typing.get_type_hints(Config)
    return hints[f.name]


def _unknown_keys(values: Dict[str, Any], source: _Source) -> List[str]:
    """One line per key of `values` that is not a config key (nor an old alias): where it was set, and the closest
    key when one is close."""
    lines = []
    for raw_key in values:
        if ALIASES.get(raw_key, raw_key) in FIELDS:
            continue
        close = difflib.get_close_matches(str(raw_key), list(FIELDS) + list(ALIASES), n=1, cutoff=0.6)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        lines.append(f"{source.where(raw_key)}: unknown key '{raw_key}'{hint}")
    return lines


def _refuse_unknown_keys(*sources: Tuple[Dict[str, Any], _Source]) -> None:
    """Raise one ConfigError naming every unknown key of every source (file, then command line), so that several
    typos are found in one run, not one per run."""
    raise_errors([line for values, source in sources for line in _unknown_keys(values, source)], "unknown keys")


def _apply(values, source, cfg_values, given) -> List[str]:
    """Convert each of `values` (known keys: _refuse_unknown_keys ran first) to its field's type into
    `cfg_values`, and record where it was set in `given`; return the type errors, one line per key, for the caller
    to raise together (all of them in one run)."""
    errors = []
    for raw_key, value in values.items():
        key = ALIASES.get(raw_key, raw_key)
        try:
            cfg_values[key] = _convert(value, _field_type(FIELDS[key]), raw_key, source.where(raw_key))
        except ConfigError as e:
            errors.append(str(e))
        given[key] = source.where(raw_key)
    return errors


def _secrets_from_environment(cfg_values: Dict[str, Any], given: Dict[str, str]) -> None:
    """Each secret key the file and the command line leave unset takes its environment variable (SECRET_ENV) when
    that is set and not empty; `given` records '$VARIABLE' as where it was set. An explicit value, even '', wins."""
    for key, variable in SECRET_ENV.items():
        if key not in given and os.environ.get(variable):
            cfg_values[key], given[key] = os.environ[variable], f"${variable}"


def load_config(path: Union[str, os.PathLike, None] = None, overrides: Sequence[str] = (), *,
                device: Optional[str] = None, warn: bool = True) -> Config:
    """Load `path` (YAML or JSON, flat keys), apply `--key value` `overrides`, take the tokens they leave unset
    from the environment (SECRET_ENV), validate, and return a `Config`.

    `device` ("cpu"/"gpu"; default: what paddle is compiled for, or "cpu" when paddle is absent) decides which
    GPU-only keys are reported as having no effect. Raises `ConfigError` on any problem.
    """
    values, given = {}, {}
    file_values, file_source = {}, _Source(path)
    if path is not None:
        file_values, lines = _read_file(path)
        file_source = _Source(path, lines)
    overridden = _parse_overrides(list(overrides))
    _refuse_unknown_keys((file_values, file_source), (overridden, _Source()))
    errors = _apply(file_values, file_source, values, given)
    dirs_before = {k: values.get(k, FIELDS[k].default) for k in ("output_dir", "logging_dir")}
    command_line = {ALIASES.get(k, k) for k in overridden}
    errors += _apply(overridden, _Source(), values, given)
    raise_errors(errors, "bad values")
    _follow_output_dir(values, dirs_before, command_line)
    _secrets_from_environment(values, given)
    cfg = Config(**values)
    resolve_rule_reward(cfg, given)
    resolve_rollout_correction(cfg, given)  # unset with a lagged sampler: clip
    validate(cfg, given)
    cfg._given = dict(given)  # given_keys
    cfg._file = os.path.abspath(path) if path is not None else None  # config_file
    if warn:
        for message in inert_key_messages(cfg, given, device or default_device()):
            logger.warning(message)
    return cfg


def _inside(path: str, directory: str) -> bool:
    path, directory = os.path.abspath(path), os.path.abspath(directory)
    return path == directory or path.startswith(directory.rstrip(os.sep) + os.sep)


def _follow_output_dir(values: Dict[str, Any], before: Dict[str, str], command_line: set) -> None:
    """A logging_dir inside the file's output_dir follows an output_dir given on the command line (the file's
    `output/quickstart/vdl_log` becomes `X/vdl_log` with `--output_dir X`), so that a second run's VisualDL record
    does not land in the first run's folder; a logging_dir given on the command line, or one outside the file's
    output_dir (a folder shared by runs on purpose), stays as it is."""
    if "output_dir" not in command_line or "logging_dir" in command_line or not before["logging_dir"]:
        return
    if not _inside(before["logging_dir"], before["output_dir"]):
        return
    rel = os.path.relpath(os.path.abspath(before["logging_dir"]), os.path.abspath(before["output_dir"]))
    moved = os.path.normpath(os.path.join(values["output_dir"], rel))
    if moved != os.path.normpath(before["logging_dir"]):
        values["logging_dir"] = moved
        logger.info("logging_dir follows --output_dir: %s (the file's %s lies inside its output_dir %s; give "
                    "--logging_dir to choose another)", moved, before["logging_dir"], before["output_dir"])


def default_device() -> str:
    """"gpu" when paddle is compiled with CUDA and sees a GPU, else "cpu" (also when paddle is absent)."""
    try:
        import paddle
        return "gpu" if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0 else "cpu"
    except ImportError:
        return "cpu"


def parse_args(argv: Sequence[str]) -> Config:
    """`[CONFIG.yaml|CONFIG.json] [--key value ...]` -> Config (PaddleNLP's run_rl.py convention)."""
    argv = list(argv)
    path = argv.pop(0) if argv and not argv[0].startswith("--") else None
    return load_config(path, argv)


def config_from_dict(values: Dict[str, Any], **kwargs: Any) -> Config:
    """A validated Config from a plain dict (tests, tools); the same conversions and errors as a file. The
    environment's tokens are not read: what a shell exports must not change a config built in code."""
    cfg_values, given = {}, {}
    _refuse_unknown_keys((values, _Source("<dict>")))
    raise_errors(_apply(values, _Source("<dict>"), cfg_values, given), "bad values")
    cfg = Config(**cfg_values)
    resolve_rule_reward(cfg, given)
    resolve_rollout_correction(cfg, given)  # unset with a lagged sampler: clip
    validate(cfg, given)
    cfg._given = dict(given)  # given_keys
    return cfg


def given_keys(cfg: Config) -> Dict[str, str]:
    """The keys the file or command line set (key -> 'file:line', 'command line' or '<dict>'), and the tokens taken
    from the environment (key -> '$REWARD_SERVER_TOKEN', ...); {} for a Config built directly."""
    return dict(getattr(cfg, "_given", {}))


def config_file(cfg: Config) -> Optional[str]:
    """The absolute path of the file `cfg` was loaded from (None: no file, or a Config built directly)."""
    return getattr(cfg, "_file", None)


def relative_path_note(cfg: Config, path: str) -> str:
    """What to add to a 'not found' message about `path`, a path given in the config: paths resolve against the
    working directory, as in PaddleNLP (its configs' relative paths are written for the directory a run starts
    in), so a relative path says so; and when the path exists relative to the config file's directory, that path.
    '' for an absolute path."""
    if os.path.isabs(path):
        return ""
    note = f" (relative to the working directory {os.getcwd()}"
    source = config_file(cfg)
    if source is not None:
        beside = os.path.normpath(os.path.join(os.path.dirname(source), path))
        if os.path.exists(beside) and beside != os.path.abspath(path):
            note += (f"; {beside} exists: paths in a config resolve against the working directory, as in "
                     f"PaddleNLP, not against the file's directory: start the run from "
                     f"{os.path.dirname(source)} or give that path")
    return note + ")"


def dump_config(cfg: Config, path: Union[str, os.PathLike]) -> None:
    """Write the resolved configuration as YAML (JSON if `path` ends in .json)."""
    with open(path, "w", encoding="utf-8") as f:
        if str(path).endswith(".json"):
            json.dump({k: shown_value(k, v) for k, v in cfg.to_dict().items()}, f, indent=2)
        else:
            f.write(cfg.format())


def write_config(cfg: Config, path: Union[str, os.PathLike]) -> None:
    """Write the resolved configuration to `path` (a run's `output_dir/config.yaml`). When a previous start of
    the same run wrote one (a resume), name the keys whose values changed since, rather than replace it silently."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            before = yaml.safe_load(f) or {}
        now = yaml.safe_load(cfg.format())
        changed = sorted(k for k in now if k in before and before[k] != now[k])
        if changed:
            logger.info("%s: keys changed since the run's previous start: %s", path,
                        ", ".join(f"{k} {before[k]!r} -> {now[k]!r}" for k in changed))
    dump_config(cfg, path)
