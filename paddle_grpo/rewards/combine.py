"""Several reward functions on one batch: weighted total, per-function scores, per-sample failure reasons.

A function that raises or times out must not cost the whole batch: the batch call comes first (fast path), and
only when it fails is the function called once per sample, so the bad sample alone fails, with its reason.

Combining (see base.py): a sample on which any function *failed* (raised, timed out, returned a non-number, or
None with a reason in `Scores.errors`) gets the combined reward None. A failure is not evidence about the
completion, and summing the other terms would score it as if the failing term were 0 (`kk,tag_format` with kk
failing would pay the format bonus alone). A plain None is an abstention and is skipped in the weighted sum, as in
TRL; the combined reward is None only when every function abstains.
"""
import dataclasses
import logging
import math
import threading
import time
from typing import Any, Dict, List, Optional, Sequence, Union

from .base import Completion, RewardFn, Scores
from .registry import get_reward_fn

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RewardResult:
    """`scores[i]`: weighted total for sample i (None when a function failed on it or every function abstained);
    `scores_by_function[name][i]`: that function's raw score (None: failed or abstained); `errors[i]`: the
    failure reasons ("name: reason; ..."), or None."""
    scores: List[Optional[float]]
    scores_by_function: Dict[str, List[Optional[float]]]
    errors: List[Optional[str]]


class RewardTimeout(Exception):
    """A reward-function call exceeded RewardSet's timeout_s."""


def _call_with_timeout(fn, args, kwargs, timeout_s):
    """fn(*args, **kwargs), raising RewardTimeout after `timeout_s` seconds (None: no limit).

    Python threads cannot be killed: a timed-out call keeps running in its daemon thread and its result is
    dropped. Functions that can run away for good should bound themselves (gsm8k runs math-verify in a killable
    process)."""
    if timeout_s is None:
        return fn(*args, **kwargs)
    box = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True, name=f"reward-{getattr(fn, '__name__', 'fn')}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise RewardTimeout(f"timed out after {timeout_s:g} s")
    error = box.get("error")
    if isinstance(error, Exception):
        raise error
    if error is not None:  # SystemExit & co. from a reward function must not stop the caller's thread
        raise RuntimeError(f"raised {type(error).__name__}: {error}") from error
    return box["value"]


def _describe(exc):
    if isinstance(exc, RewardTimeout):
        return str(exc)
    return f"{type(exc).__name__}: {str(exc)[:300]}"


def _check_value(value):
    """(float or None, failure reason or None) for one returned score; bools count as 1.0 / 0.0."""
    if value is None:
        return None, None
    if isinstance(value, (str, bytes)):
        return None, f"returned a {type(value).__name__}, not a number"
    try:
        value = float(value)  # also numpy / paddle scalars
    except (TypeError, ValueError):
        return None, f"returned a {type(value).__name__}, not a number"
    if not math.isfinite(value):
        return None, f"returned {value}"
    return value, None


class RewardSet:
    """Evaluate reward functions on a batch.

    names_or_fns: list of registered names, `module:function` specs or callables, or a comma-separated string.
    weights: one per function (list or comma-separated string); default all 1.0.
    timeout_s: limit per call of a function (the batch call; then the per-sample calls, which run concurrently);
        None: no limit. A sample whose call exceeds it has failed.

    A sample's total is the weighted sum of the functions' scores, skipping the ones that returned None; it is None
    when any function failed on the sample (the reason is in `errors`) or when every function returned None.
    """

    def __init__(self, names_or_fns: Union[str, RewardFn, Sequence[Union[str, RewardFn]]],
                 weights: Union[str, Sequence[float], None] = None, timeout_s: Optional[float] = None) -> None:
        if isinstance(names_or_fns, str) or callable(names_or_fns):
            names_or_fns = [names_or_fns] if callable(names_or_fns) else \
                [s.strip() for s in names_or_fns.split(",") if s.strip()]
        items = list(names_or_fns)
        if not items:
            raise ValueError("RewardSet needs at least one reward function")
        self.fns, self.names = [], []
        for item in items:
            self.fns.append(get_reward_fn(item))
            # A reward model names itself ("reward_model"), not by its spec's path.
            name = getattr(self.fns[-1], "reward_name", None) or \
                (item.strip() if isinstance(item, str) else getattr(item, "__name__", "reward"))
            self.names.append(self._unique(name))
        self.weights = self._parse_weights(weights)
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError(f"timeout_s must be positive or None, got {timeout_s}")
        self.timeout_s = timeout_s

    @property
    def max_score(self) -> Optional[float]:
        """The best weighted total: sum of w * fn.max_score, or None when a function does not declare its
        maximum or a weight is negative (the total's maximum would then depend on the function's minimum)."""
        maxima = [getattr(fn, "max_score", None) for fn in self.fns]
        if any(m is None for m in maxima) or any(w < 0 for w in self.weights):
            return None
        return float(sum(w * m for w, m in zip(self.weights, maxima)))

    @property
    def answer_source(self) -> Optional[str]:
        """The name of the function whose `extract_answer` gives the samples' answers: the first that has one in
        the order given (None: no function reads an answer)."""
        return next((name for name, fn in zip(self.names, self.fns) if callable(getattr(fn, "extract_answer", None))),
                    None)

    def extract_answers(self, prompts: Sequence[Any], completions: Sequence[Completion],
                        **kwargs: Any) -> Optional[List[Optional[str]]]:
        """Each completion's final answer as `answer_source` reads it (None where it reads none), or None when no
        function has an extractor. An extractor that raises or returns a wrong-length list gives no answers for the
        batch, with a warning (the evaluation's vote then counts none of its samples)."""
        source = self.answer_source
        if source is None:
            return None
        fn = self.fns[self.names.index(source)]
        n = len(completions)
        try:
            out = list(fn.extract_answer(list(prompts), list(completions), **kwargs))
            if len(out) != n:
                raise ValueError(f"returned {len(out)} answers for {n} completions")
        except Exception as exc:  # noqa: BLE001 - a user's extractor may raise anything; the run goes on
            logger.warning("reward %s: extract_answer failed on a batch of %d (%s); those samples give no answer",
                           source, n, _describe(exc))
            return [None] * n
        return [None if a is None else str(a) for a in out]

    def _unique(self, name):
        candidate, k = name, 2
        while candidate in self.names:
            candidate, k = f"{name}#{k}", k + 1
        return candidate

    def _parse_weights(self, weights):
        if weights is None:
            return [1.0] * len(self.fns)
        if isinstance(weights, str):
            weights = [w for w in weights.split(",") if w.strip()]
        try:
            weights = [float(w) for w in weights]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"reward weights must be numbers, got {weights!r}") from exc
        if len(weights) != len(self.fns):
            raise ValueError(f"got {len(weights)} reward weights for {len(self.fns)} reward functions "
                             f"({', '.join(self.names)}); give one weight per function")
        return weights

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Completion], **kwargs: Any) -> RewardResult:
        """RewardResult for the batch. kwargs (tgt, completion_ids, other columns) go to every function."""
        prompts, completions = list(prompts), list(completions)
        n = len(completions)
        if len(prompts) != n:
            raise ValueError(f"{len(prompts)} prompts but {n} completions")
        by_function, errors = {}, [[] for _ in range(n)]
        for name, fn in zip(self.names, self.fns):
            values, reasons = self._evaluate(fn, prompts, completions, kwargs)
            by_function[name] = values
            failed = [i for i, reason in enumerate(reasons) if reason is not None]
            for i in failed:
                errors[i].append(f"{name}: {reasons[i]}")
            if failed:  # the one place a failure shows up in the trainer's or the server's log
                logger.warning("reward %s failed on %d of %d samples (their total reward is None); first: %s",
                               name, len(failed), n, reasons[failed[0]])
        totals = []
        for i in range(n):
            if errors[i]:
                totals.append(None)
                continue
            terms = [w * by_function[name][i] for name, w in zip(self.names, self.weights)
                     if by_function[name][i] is not None]
            totals.append(sum(terms) if terms else None)
        return RewardResult(totals, by_function, ["; ".join(e) if e else None for e in errors])

    def _evaluate(self, fn, prompts, completions, kwargs):
        """(values, reasons): reasons[i] is not None exactly when fn failed on sample i (values[i] is then None)."""
        n = len(completions)
        try:
            out = _call_with_timeout(fn, (prompts, completions), kwargs, self.timeout_s)
            return self._validate(out, n)
        except Exception as exc:  # noqa: BLE001 - any failure: fall back to one call per sample
            logger.warning("reward %s failed on a batch of %d (%s); scoring the samples one by one",
                           getattr(fn, "__name__", fn), n, _describe(exc))
        return self._per_sample(fn, prompts, completions, kwargs)

    @staticmethod
    def _validate(out, n):
        if isinstance(out, (str, bytes, dict)) or not hasattr(out, "__len__"):
            raise TypeError(f"returned a {type(out).__name__}, not a list of scores")
        if len(out) != n:
            raise ValueError(f"returned {len(out)} scores for {n} samples")
        given = out.errors if isinstance(out, Scores) else [None] * n
        if len(given) != n:  # a Scores appended to after construction
            raise ValueError(f"returned Scores with {n} values but {len(given)} errors")
        values, reasons = [], []
        for value, note in zip(out, given):
            value, reason = _check_value(value)
            # Beside None a reason reports a failure (base.py); beside a number it is dropped, so errors[i] is
            # set exactly when a failure made the total None.
            if reason is None and value is None and note is not None:
                reason = str(note)
            values.append(value)
            reasons.append(reason)
        return values, reasons

    def _per_sample(self, fn, prompts, completions, kwargs):
        n = len(completions)
        results = {}

        def one(i):
            # List-valued columns with one entry per sample are sliced; anything else is passed whole.
            sample_kwargs = {k: ([v[i]] if isinstance(v, (list, tuple)) and len(v) == n else v)
                             for k, v in kwargs.items()}
            try:
                (value,), (reason,) = self._validate(fn([prompts[i]], [completions[i]], **sample_kwargs), 1)
                results[i] = (value, reason)
            except Exception as exc:  # noqa: BLE001 - recorded as this sample's reason
                results[i] = (None, _describe(exc))

        if self.timeout_s is None:
            for i in range(n):
                one(i)
        else:
            # All samples run concurrently against one deadline, so a batch costs at most about two limits.
            # A call still running at the deadline may finish later; it only writes into `results`, which
            # has been read by then, so the late value is ignored.
            threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
            for thread in threads:
                thread.start()
            deadline = time.monotonic() + self.timeout_s
            for thread in threads:
                thread.join(max(0.0, deadline - time.monotonic()))
            timed_out = (None, f"timed out after {self.timeout_s:g} s")
            results = {i: timed_out if t.is_alive() else results.get(i, (None, "ended without a result"))
                       for i, t in enumerate(threads)}
        return [results[i][0] for i in range(n)], [results[i][1] for i in range(n)]
