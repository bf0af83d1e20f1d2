"""The keys set without effect on this device (the table the dry run prints) and the resolved configuration file."""
from __future__ import annotations

import hashlib
import os
import tempfile
from typing import List, Mapping, Optional, Tuple

from ..config import (Config, DEVICES, FIELDS, GROUPS, dump_config, given_keys, key_effect, run_key_effect, shown_value,
                      yaml_value)


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


def keyed(key: str, message: str) -> str:
    """`key: message`, without naming the key twice when the message already starts with it."""
    return message if message.startswith(f"{key}:") else f"{key}: {message}"


def resolved_config_file(cfg: Config) -> str:
    """Write the whole resolved configuration to a file in the temporary directory and return its path: a dry run
    writes nothing into output_dir. The file is named by the run's output_dir (its absolute path), so every dry run
    of one run overwrites the same file rather than leaving one more behind each time a value changes."""
    run = os.path.abspath(cfg.output_dir)
    digest = hashlib.sha1(run.encode("utf-8")).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"paddle_grpo_dry_run_{digest}.yaml")
    dump_config(cfg, path)
    return path
