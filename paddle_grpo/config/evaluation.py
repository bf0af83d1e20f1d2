"""EvalArguments: held-out evaluation during training (docs/evaluation.md): when, how many completions per prompt,
sampled how, and what counts as correct."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

from .fields import arg

# The evaluation's own sampling keys (verl's val_kwargs.temperature / top_p / top_k): unset, the rollout's key.
EVAL_SAMPLING_KEYS = {"eval_temperature": "temperature", "eval_top_p": "top_p", "eval_top_k": "top_k"}


@dataclass
class EvalArguments:
    do_eval: bool = arg(False, "Evaluate on eval_datasets every eval_steps.")
    per_device_eval_batch_size: int = arg(32, "Prompts per evaluation generation call.")
    evaluation_strategy: str = arg("steps", "When to evaluate: steps or no.", choices=("steps", "no"))
    eval_steps: int = arg(20, "Evaluate every this many steps.")
    eval_max_reward: Optional[float] = arg(None, "(new) The reward that counts as a correct answer in "
                                                "eval/accuracy; default: the maximum the reward functions "
                                                "declare (from the server's /health when use_rm_server).")
    eval_do_sample: bool = arg(False, "(new) Sample at evaluation (with eval_temperature / eval_top_p / eval_top_k) "
                                      "instead of greedy (verl's val_kwargs.do_sample).")
    eval_num_samples: int = arg(1, "(new) Completions per eval prompt (verl's val_kwargs.n). From 2 on, with "
                                   "eval_do_sample (greedy would repeat one completion), the evaluation also reports "
                                   "eval/pass@k (the unbiased estimator, k = 1, 2, 4, ... below n, and n), "
                                   "eval/mean@n and eval/maj@n (docs/evaluation.md).")
    eval_num_samples_final_only: bool = arg(False, "(new) Draw eval_num_samples completions per prompt only at the "
                                                   "last evaluation (at max_steps); the ones before draw one each, "
                                                   "at a fraction of the cost.")
    eval_temperature: Optional[float] = arg(None, "(new) Sampling temperature of the evaluation (verl's "
                                                  "val_kwargs.temperature); unset: temperature. Needs "
                                                  "eval_do_sample.")
    eval_top_p: Optional[float] = arg(None, "(new) Nucleus threshold of the evaluation, in (0, 1] (verl's "
                                            "val_kwargs.top_p); unset: top_p. Needs eval_do_sample.")
    eval_top_k: Optional[int] = arg(None, "(new) Top-k of the evaluation, 0: off (verl's val_kwargs.top_k); unset: "
                                          "top_k. Needs eval_do_sample.")
    eval_max_dec_len: Optional[int] = arg(None, "(new) Most tokens generated per eval completion (max_dec_len for "
                                                "the evaluation); unset: max_dec_len.")

    def eval_samples_at(self, final: bool) -> int:
        """Completions per prompt of an evaluation; `final`: the run's last (at max_steps)."""
        return self.eval_num_samples if final or not self.eval_num_samples_final_only else 1

    def eval_generation(self) -> Dict[str, Any]:
        """The evaluation's generation settings, unset keys resolved to the rollout's: `temperature`, `top_p`,
        `top_k`, `max_new_tokens`."""
        def own(value: Any, rollout: Any) -> Any:
            return rollout if value is None else value

        return {"temperature": own(self.eval_temperature, self.temperature),
                "top_p": own(self.eval_top_p, self.top_p), "top_k": own(self.eval_top_k, self.top_k),
                "max_new_tokens": own(self.eval_max_dec_len, self.max_dec_len)}


def check_evaluation(cfg: Any, bad: Callable[[str, str], None]) -> None:
    """The evaluation keys' ranges; `bad(key, message)` collects each error."""
    if cfg.eval_num_samples < 1:
        bad("eval_num_samples", "must be at least 1")
    if cfg.eval_temperature is not None and cfg.eval_temperature <= 0:
        bad("eval_temperature", "must be greater than 0 (greedy evaluation: eval_do_sample false)")
    if cfg.eval_top_p is not None and not 0 < cfg.eval_top_p <= 1:
        bad("eval_top_p", "must be in (0, 1]")
    if cfg.eval_top_k is not None and cfg.eval_top_k < 0:
        bad("eval_top_k", "must not be negative (0 turns top-k sampling off)")
    if cfg.eval_max_dec_len is not None and cfg.eval_max_dec_len < 1:
        bad("eval_max_dec_len", "must be at least 1")


def check_evaluation_combinations(cfg: Any, fail: Callable[[str, str], None]) -> None:
    """Keys that only mean something when the evaluation samples, refused with greedy evaluation; `fail(key,
    message)` raises."""
    if cfg.eval_do_sample:
        return
    if cfg.eval_num_samples > 1:
        fail("eval_num_samples", "needs eval_do_sample: true; greedy evaluation (eval_do_sample false) would give "
                                 "the same completion every time; set eval_do_sample: true to sample them, or "
                                 "eval_num_samples: 1")
    for key in EVAL_SAMPLING_KEYS:
        if getattr(cfg, key) is not None:
            fail(key, "applies to sampled evaluation only and eval_do_sample is false (greedy); set eval_do_sample: "
                      f"true, or leave {key} unset")
