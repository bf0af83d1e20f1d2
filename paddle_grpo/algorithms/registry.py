"""Name -> spec registries of the advantage estimators and the policy losses.

A spec is the function plus what a caller must know to call it without branching on its name: what it needs and
where its KL goes (`EstimatorSpec`), which importance-sampling level it implements (`PolicyLossSpec`). The config's
valid choices are read from these registries, so registering a function makes it a valid config value.

An unknown name raises `UnknownNameError`, a `ValueError` (and `KeyError`) whose message lists the valid names, so a
typo in a config fails at the first lookup with the fix in the message.
"""
import dataclasses
from typing import Any, Callable, Dict, Generic, Iterable, Optional, Tuple, Type, TypeVar, Union

KL_IN_REWARD = ("token", "sequence", "token_rewards")
ConfigOption = Union[str, Tuple[str, str]]


class UnknownNameError(ValueError, KeyError):
    """Lookup of a name that is not registered; the message lists the valid names."""

    # KeyError.__str__ would print the message repr()-quoted; keep it readable.
    __str__ = ValueError.__str__


def unknown_name(kind: str, name: object, valid: Iterable[str]) -> UnknownNameError:
    """The error for `name` not being one of `valid` (listed sorted in the message)."""
    return UnknownNameError(f"unknown {kind} {name!r}; valid: {', '.join(sorted(valid))}")


def checked_options(owner: str, config_options: Any) -> Tuple[ConfigOption, ...]:
    """`config_options` as a tuple of `"key"` / `("config_key", "option")` entries (lists become tuples); a
    TypeError naming `owner` for anything else."""
    if isinstance(config_options, str):  # ("norm_adv_by_std") without the comma
        raise TypeError(f"{owner}: config_options must be a tuple of key names")
    options = tuple(tuple(o) if isinstance(o, list) else o for o in config_options)
    for option in options:
        pair = isinstance(option, tuple) and len(option) == 2 and all(isinstance(x, str) for x in option)
        if not (isinstance(option, str) or pair):
            raise TypeError(f"{owner}: each config_options entry must be a key name or a (config_key, option) "
                            f"pair, got {option!r}")
    return options


class ConfigOptions:
    """What a spec with a `config_options` field (config keys passed to its `fn` as keyword options) offers:
    `config_keys`, `option_names` and `options(cfg)`. Shared by the estimators and the policy losses."""
    config_options: Tuple[ConfigOption, ...]

    @property
    def _option_pairs(self) -> Tuple[Tuple[str, str], ...]:
        return tuple((o, o) if isinstance(o, str) else o for o in self.config_options)

    @property
    def config_keys(self) -> Tuple[str, ...]:
        """The config keys `fn` reads (the first of each `(config_key, option)` pair)."""
        return tuple(key for key, _ in self._option_pairs)

    @property
    def option_names(self) -> Tuple[str, ...]:
        """The keyword options `fn` takes from the config, in `config_options` order."""
        return tuple(option for _, option in self._option_pairs)

    def options(self, cfg: Any) -> Dict[str, Any]:
        """`{option: cfg.<config_key>}` for `fn`, from any object with the config keys as attributes."""
        return {option: getattr(cfg, key) for key, option in self._option_pairs}


@dataclasses.dataclass(frozen=True)
class EstimatorSpec(ConfigOptions):
    """An advantage estimator and how to call it.

    fn: `fn(token_level_rewards [bs, T], response_mask [bs, T], index [bs], **options) -> (advantages, returns)`.
    kl_in_reward: where the KL penalty of the reward (`kl_coeff`) goes. "token": the estimator takes it per token
        and needs `kl_coeff=`, `old_log_probs=`, `ref_log_probs=` `[bs, T]` and `kl_estimator=` (REINFORCE++).
        "token_rewards": the caller builds `token_level_rewards` with `kl_token_rewards(...)` (PaddleNLP's PPO
        reward, `-kl_coeff * KL_t` per token plus the score at the end) and the estimator takes no KL option
        (ppo, vapo). "sequence": the caller subtracts `kl_coeff * sum_t m_t KL_t` from each sequence's scalar
        reward first, and only when `use_kl_in_reward` asks for it (`reward_kl_coeff`: PaddleNLP's GRPO ignores
        kl_coeff).
    config_options: config keys passed to `fn` as keyword options, each `"key"` (an option of the same name; grpo:
        `norm_adv_by_std`) or `("config_key", "option")` (vapo: `("vapo_alpha", "alpha")`). `options(cfg)`
        resolves them; `config_keys` lists the config keys.
    min_group_size: samples per prompt (`rollout_n`) the estimator needs (rloo: 2, its baseline is the others).
    uses_groups: whether `index` (which prompt each sample answers) changes the result.
    normalization_keys: whether the config keys `normalize_reward` / `normalize_advantage` apply. False for grpo:
        PaddleNLP's RL config sets both to False for GRPO whatever the file says (`paddlenlp/rl/utils/
        config_utils.py`, `TrainingArguments.__post_init__`), so a PaddleNLP GRPO config trains the same here.
    needs_values: the estimator takes `values=[bs, T]` (the critic's value of each completion token) and the run
        trains a critic (ppo, vapo); the config's `needs_critic`.
    key_defaults: `(("config_key", default), ...)`: defaults of config keys that depend on the estimator, used when
        the key is left at None (vapo: `positive_example_lm_coeff` 0.1, the paper's recipe).
    group_of_one: what a `uses_groups` estimator computes when every group holds one sample (`rollout_n` 1), for
        the start-up note (config.effects.group_size_notes); empty: a generic note.
    """
    name: str
    fn: Callable
    kl_in_reward: str = "sequence"
    config_options: Tuple[ConfigOption, ...] = ()
    min_group_size: int = 1
    uses_groups: bool = True
    normalization_keys: bool = True
    needs_values: bool = False
    key_defaults: Tuple[Tuple[str, Any], ...] = ()
    group_of_one: str = ""

    def __post_init__(self) -> None:
        if self.kl_in_reward not in KL_IN_REWARD:
            raise ValueError(f"advantage estimator {self.name!r}: kl_in_reward must be one of {KL_IN_REWARD}, "
                             f"got {self.kl_in_reward!r}")
        if not isinstance(self.min_group_size, int) or self.min_group_size < 1:
            raise ValueError(f"advantage estimator {self.name!r}: min_group_size must be an int >= 1, "
                             f"got {self.min_group_size!r}")
        object.__setattr__(self, "config_options", checked_options(f"advantage estimator {self.name!r}",
                                                                   self.config_options))
        defaults = tuple(tuple(d) for d in self.key_defaults)
        if any(len(d) != 2 or not isinstance(d[0], str) for d in defaults):
            raise TypeError(f"advantage estimator {self.name!r}: key_defaults must be (config_key, default) pairs, "
                            f"got {self.key_defaults!r}")
        object.__setattr__(self, "key_defaults", defaults)

    @property
    def reward_kl_per_token(self) -> bool:
        """Whether `kl_coeff`'s KL always goes into the reward per token ("token", "token_rewards"), whatever
        `use_kl_in_reward` says."""
        return self.kl_in_reward in ("token", "token_rewards")

    def key_default(self, key: str, fallback: Any = None) -> Any:
        """The estimator's default for config key `key` (`key_defaults`), else `fallback`."""
        return dict(self.key_defaults).get(key, fallback)


RATIO_LEVELS = ("token", "sequence")


@dataclasses.dataclass(frozen=True)
class PolicyLossSpec(ConfigOptions):
    """A policy loss and how to call it.

    fn: `fn(log_prob, old_log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c,
        **options) -> (pg_losses [bs, T], {"clip_low"|"clip_high"|"clip_dual": bool [bs, T]})`; `options` from
        `config_options`.
    importance_sampling_level: the config value of `importance_sampling_level` that selects this loss ("token",
        "sequence"), or None when it is only reachable by its name (config key `policy_loss`, or an alias such as
        "clip").
    needs_old_log_probs: whether `old_log_prob` enters the loss (every ratio-based loss); on policy the caller
        passes `log_prob.detach()`.
    advantage_weighted: whether every token's loss is a multiple of its advantage (PPO clip, dual-clip, GSPO), so
        that with every advantage 0 the loss and its gradient are exactly 0 whatever the parameters; the update then
        skips the forward and backward of such a mini-batch (step.policy_update.nothing_to_learn). False (the
        default of a registered loss) never skips.
    config_options: config keys passed to `fn` as keyword options, as `EstimatorSpec.config_options` (SAPO's
        temperatures, Clip-Cov's ratio and bounds).
    ratio_level: "token" or "sequence": the level of the ratio the loss takes (GSPO's and GMPO's are per
        sequence); a run's `importance_sampling_level` must agree with it (config validation).
    loss_agg_mode: the aggregation the loss is defined with, or None when `loss_agg_mode` chooses it (a run with
        another loss_agg_mode is refused).
    clip_keys: the clip-range config keys the loss reads ("clip_range_ratio_low", "clip_range_ratio_high"); the
        others have no effect with it.
    dual_clip: whether `clip_ratio_c` (dual-clip) applies; a run that sets it with a loss that does not take it is
        refused.
    """
    name: str
    fn: Callable
    importance_sampling_level: Optional[str] = None
    needs_old_log_probs: bool = True
    advantage_weighted: bool = False
    config_options: Tuple[ConfigOption, ...] = ()
    ratio_level: str = "token"
    loss_agg_mode: Optional[str] = None
    clip_keys: Tuple[str, ...] = ("clip_range_ratio_low", "clip_range_ratio_high")
    dual_clip: bool = False

    def __post_init__(self) -> None:
        if self.ratio_level not in RATIO_LEVELS:
            raise ValueError(f"policy loss {self.name!r}: ratio_level must be one of {RATIO_LEVELS}, "
                             f"got {self.ratio_level!r}")
        object.__setattr__(self, "config_options", checked_options(f"policy loss {self.name!r}",
                                                                   self.config_options))
        object.__setattr__(self, "clip_keys", tuple(self.clip_keys))

    @property
    def summary(self) -> str:
        """`fn`'s docstring up to its first ": " (the loss's name and paper, what the dry run prints)."""
        return (self.fn.__doc__ or self.name).strip().split(": ")[0]


SpecT = TypeVar("SpecT", EstimatorSpec, PolicyLossSpec)


class Registry(Generic[SpecT]):
    """A name -> spec table. `register(name, **fields)` is a decorator; `spec(name)` / `get(name)` look up the spec /
    its function. Names are kept in registration order."""

    def __init__(self, kind: str, spec_type: Type[SpecT]) -> None:
        self.kind = kind
        self.spec_type = spec_type
        self._specs: Dict[str, SpecT] = {}

    def register(self, name: str, **fields: object) -> Callable[[Callable], Callable]:
        def decorator(fn: Callable) -> Callable:
            spec = self.spec_type(name=name, fn=fn, **fields)
            # Re-registering the same spec (module reload) is harmless; a different one would silently replace a
            # built-in, which is never what a user meant.
            if name in self._specs and self._specs[name] != spec:
                raise ValueError(f"{self.kind} {name!r} is already registered ({self._specs[name].fn.__qualname__})")
            self._specs[name] = spec
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        self.spec(name)  # unknown name: the usual error
        del self._specs[name]

    def spec(self, name: str) -> SpecT:
        try:
            return self._specs[name]
        except (KeyError, TypeError):
            raise unknown_name(self.kind, name, self._specs) from None

    def get(self, name: str) -> Callable:
        return self.spec(name).fn

    def names(self) -> Tuple[str, ...]:
        return tuple(self._specs)

    def specs(self) -> Tuple[SpecT, ...]:
        return tuple(self._specs.values())

    def __contains__(self, name: object) -> bool:
        return name in self._specs
