"""How a key is declared: `arg` (default, help text, choices, its effect on each device), the effect statements
(`ON`, `off`, `on`, `nowhere`), the configuration errors, and the constants several argument groups share."""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

import yaml

from ..precision import CPU_REASONS, GPU_EFFECT, NOT_IMPLEMENTED

logger = logging.getLogger("paddle_grpo.config")

LR_SCHEDULERS = ("constant", "constant_with_warmup", "linear", "cosine")
REPORT_TO = ("visualdl", "all", "wandb", "tensorboard", "none")
VISUALDL_STANDS_IN = ("wandb", "tensorboard")  # PaddleNLP's other loggers: VisualDL records the metrics instead

# Older PaddleNLP configs used these names; they load as the key they became.
ALIASES = {
    "mini_batch_size": "global_mini_batch_size",
    "per_device_rollout_batch_size": "rollout_max_num_seqs",
    "quant_type": "rollout_quant_type",
    "num_return_sequences": "rollout_n",
    "lora_r": "lora_rank",                      # peft/TRL's name (LoRAConfig.r)
    "lora_target_modules": "target_modules",    # TRL's name
    "fused_linear": "use_fused_linear",         # PaddleNLP's name until it was renamed
}


SECRET_KEYS = ("reward_server_token", "tool_server_token")  # never printed or written out
# The environment variable each secret key takes when the file and the command line leave it unset: the command line
# shows in `ps`; the reward server reads the same $REWARD_SERVER_TOKEN.
SECRET_ENV = {"reward_server_token": "REWARD_SERVER_TOKEN", "tool_server_token": "TOOL_SERVER_TOKEN"}


def shown_value(key: str, value: Any) -> Any:
    """`value` of config key `key` as it may be printed or written out: '***' for a token (SECRET_KEYS) that is set."""
    return "***" if key in SECRET_KEYS and value else value


# Effect statements shared by several keys.
CPU_FLOAT32 = ("CPU runs compute in float32 (paddle's CPU kernels have no bfloat16 matmul, docs/platform.md)")
HOST_MEMORY = "on a CPU run everything is already in host memory"
# fused_head_chunk_size's default: at V = 151,936 the chunked head's forward + backward over 8 x 128 positions took
# 10.7 / 9.8 / 9.3 / 9.2 s with chunks of 128 / 256 / 512 / 1024 positions (tools/bench/bench.py --ops,
# docs/PERFORMANCE.md); 512 is within 2 % of 1024 at half its transient memory (512 x V float32 = 311 MB per buffer).
DEFAULT_HEAD_CHUNK_SIZE = 512
# use_fused_head_and_loss_fn when the config leaves it unset: the chunked head from this vocabulary size on, full
# logits below. Measured with `python tools/bench/bench_head.py` (the update's LM head, forward + backward, 8 x 128
# positions, hidden 896, chunk 512; docs/PERFORMANCE.md), in process CPU seconds because the 2-core host was under
# load 8: chunked / full time 2.1, 1.2, 1.3, 1.15, 0.81, 0.80, 0.77 and peak memory 1.0, 0.68, 0.60, 0.54, 0.63,
# 0.46, 0.40 at V = 128, 1,024, 2,048, 4,096, 8,192, 32,768, 151,936. From 8,192 on the chunked head is faster and
# smaller; below it the full logits are faster and small (175 MB at 4,096). Real vocabularies (Llama's 32,000,
# GPT-2's 50,257, Qwen's 151,936) are above, the project's toy models (128 to 512 tokens, whose numbers stay bit for
# bit) below.
HEAD_CHUNK_MIN_VOCAB = 8192


class ConfigError(ValueError):
    """A configuration problem; the message names the source (file:line or command line) and the key."""


def raise_errors(messages: Sequence[str], what: str) -> None:
    """Raise one ConfigError naming every one of `messages` (`what`: "unknown keys", "bad values"), so that several
    mistakes are found in one run: a single message as it is, several as "N <what>:" and one indented line each."""
    if len(messages) == 1:
        raise ConfigError(messages[0])
    if messages:
        raise ConfigError(f"{len(messages)} {what}:\n" + "\n".join(f"  {m}" for m in messages))


class LayoutError(ConfigError):
    """The parallel degrees do not fit the number of processes this run was started with (run_rl.py then prints
    the launch command the configuration needs)."""


Choices = Union[Tuple[str, ...], Callable[[], Tuple[str, ...]]]


def _from_algorithms(name: str) -> Callable[[], Tuple[str, ...]]:
    """The choices `paddle_grpo.algorithms.<name>` holds (a tuple, or a function of the registry that returns the
    names), read when they are asked for: what is registered after this module is imported is a valid choice, and
    `import paddle_grpo.config` stays light (algorithms/ imports paddle)."""
    def choices() -> Tuple[str, ...]:
        from .. import algorithms
        found = getattr(algorithms, name)
        return tuple(found() if callable(found) else found)

    return choices


def field_choices(f: dataclasses.Field) -> Optional[Tuple[str, ...]]:
    """The valid values of config field `f` (None: any value of its type)."""
    choices = f.metadata["choices"]
    return choices() if callable(choices) else choices


@dataclass(frozen=True)
class Effect:
    """What a key does on one device: `active` False means setting it changes nothing there, and `note` says why;
    active with a `note`: a caveat (for example which GPU paths are verified only on CPU)."""
    active: bool
    note: str = ""


ON = Effect(True)
DEVICES = ("cpu", "gpu")


def off(reason: str) -> Effect:
    """The key has no effect on that device, because `reason`."""
    return Effect(False, reason)


def on(note: str) -> Effect:
    """The key has its effect on that device, with a caveat `note`."""
    return Effect(True, note)


def nowhere(reason: str) -> Dict[str, Effect]:
    """`arg(..., **nowhere(reason))`: the key has no effect on any device."""
    return {"cpu": off(reason), "gpu": off(reason)}


def _amp_effect(key: str) -> Dict[str, Effect]:
    """The precision and kernel keys' statements, from precision.py's tables (one source): implemented on GPU (only
    the decision logic is verified, on CPU), off on CPU with the reason; or not implemented on any device."""
    if key in NOT_IMPLEMENTED:
        return nowhere(NOT_IMPLEMENTED[key])
    return {"cpu": off(CPU_REASONS.get(key, CPU_FLOAT32)),
            "gpu": on(f"{GPU_EFFECT[key]} (paddle_grpo/precision.py; verified only on CPU: the decision logic)")}


# recompute / recompute_granularity / recompute_use_reentrant on GPU: device-independent code (paddle's recompute).
_RECOMPUTE_GPU = on("the same paddle recompute as on CPU (policy/fast_decoder.py, PaddleNLP's forward); verified only "
                    "on CPU")


def arg(default: Any, help: str, *, choices: Optional[Choices] = None, cpu: Effect = ON, gpu: Effect = ON,
        default_factory: Optional[Callable[[], Any]] = None) -> Any:
    """A config field. `choices`: the valid values, or a function returning them when they are asked for (read with
    `field_choices`); `cpu` / `gpu`: the key's effect on that device (`ON`: what `help` says; `off(reason)`: none)."""
    meta = {"help": help, "choices": choices, "effect": {"cpu": cpu, "gpu": gpu}}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def yaml_value(value: Any) -> str:
    """`value` as it would be written after `key: ` in a YAML file (one line)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6)
    return text.removesuffix("\n").removesuffix("...").strip()
