"""Configuration: PaddleNLP's GRPO keys as dataclass fields, loaded from flat YAML/JSON plus `--key value` overrides.

An existing PaddleNLP `grpo_argument.yaml` loads unchanged: every key of PaddleNLP's GRPO / REINFORCE++ configs is a
field here with PaddleNLP's meaning, or is accepted with a one-line warning saying why it has no effect. Keys this
project adds are marked "(new)" in their help text. Everything is validated at load time; every error names the file,
line and key (see `ConfigError`).

PaddleNLP's own `PdArgumentParser` is not used: it cannot say which line of a YAML file is wrong, does not suggest
the closest key, and importing paddlenlp only to read a config costs seconds.

The package follows PaddleNLP's argument groups, one file each (model.py, lora.py, data.py, parallel.py,
rollout.py, training.py, algorithm.py, evaluation.py, logs.py, kernels.py, critic.py, tools.py); `arg` and the effect
statements are in fields.py, the flat `Config` and its batch geometry in flat.py, what a key does in a run in
effects.py, validation in validation.py and loading in loading.py. Import from the package: which file a name lives in
is not part of the API.
"""
from __future__ import annotations

from .algorithm import AlgorithmArguments
from .critic import CriticArguments
from .data import DataArguments
from .effects import (
    CONSTANT_SCHEDULES,
    CRITIC_KEYS,
    SHARDING_OPTIONS,
    TOOL_KEYS,
    group_size_notes,
    inert_key_messages,
    key_effect,
    reward_kl_notes,
    run_key_effect,
    run_key_notes,
    sharding_options,
)
from .evaluation import EvalArguments
from .fields import (
    ALIASES,
    CPU_FLOAT32,
    DEFAULT_HEAD_CHUNK_SIZE,
    DEVICES,
    HEAD_CHUNK_MIN_VOCAB,
    HOST_MEMORY,
    LR_SCHEDULERS,
    ON,
    REPORT_TO,
    SECRET_KEYS,
    VISUALDL_STANDS_IN,
    Choices,
    ConfigError,
    Effect,
    LayoutError,
    arg,
    field_choices,
    logger,
    nowhere,
    off,
    on,
    shown_value,
    yaml_value,
)
from .flat import FIELDS, GROUPS, BatchGeometry, Config
from .kernels import KernelArguments
from .loading import (config_from_dict, default_device, dump_config, given_keys, load_config, parse_args,
                      relative_path_note, write_config)
from .logs import LoggingArguments
from .lora import LoRAArguments
from .model import ModelArguments
from .parallel import ParallelArguments
from .rollout import RolloutArguments
from .tools import ToolArguments
from .training import TrainingArguments
from .validation import (critic_refusals, encoder_decoder_refusal, real_model_name_marks, resolve_rule_reward,
                         resolve_rollout_correction, url_problem, validate)

__all__ = [
    'logger', 'LR_SCHEDULERS', 'REPORT_TO', 'VISUALDL_STANDS_IN', 'ALIASES', 'SECRET_KEYS', 'CPU_FLOAT32',
    'HOST_MEMORY', 'DEFAULT_HEAD_CHUNK_SIZE', 'HEAD_CHUNK_MIN_VOCAB', 'ConfigError', 'LayoutError', 'Choices',
    'field_choices', 'Effect', 'ON', 'DEVICES', 'off', 'on', 'nowhere', 'arg', 'yaml_value', 'ModelArguments',
    'LoRAArguments', 'DataArguments', 'ParallelArguments', 'RolloutArguments', 'TrainingArguments', 'shown_value',
    'AlgorithmArguments', 'EvalArguments', 'LoggingArguments', 'KernelArguments', 'CriticArguments',
    'ToolArguments', 'BatchGeometry', 'Config', 'GROUPS', 'FIELDS', 'key_effect', 'SHARDING_OPTIONS',
    'sharding_options', 'inert_key_messages', 'CRITIC_KEYS', 'CONSTANT_SCHEDULES', 'TOOL_KEYS', 'run_key_notes',
    'run_key_effect', 'reward_kl_notes', 'group_size_notes', 'validate', 'url_problem', 'critic_refusals',
    'encoder_decoder_refusal',
    'resolve_rule_reward', 'resolve_rollout_correction', 'load_config', 'default_device', 'parse_args', 'config_from_dict', 'given_keys',
    'dump_config', 'write_config', 'relative_path_note', 'real_model_name_marks',
]
