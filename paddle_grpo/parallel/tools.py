"""Multi-turn rollouts under tensor parallelism: the ranks of a tensor-parallel group decode the same rows in lockstep
(every model step is a collective), so a row's tool turn must start on the same step on every rank and hold the same
tokens. `GroupTools` wraps the run's tool environment (paddle_grpo.environment.ToolEnvironment, used by duck typing):
the group's first rank runs the calls, the others only read the turns; `sync` (the rollout's `tool_sync`) ANDs a
row's readiness over the group, and each tool turn's result is broadcast from the first rank, in the order the
rollout takes them (the same on every rank: the ready rows in row order). A tool whose output varies (timing,
timeouts, a random tool) therefore cannot make the ranks feed different tokens, and each call runs once per group."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from . import collectives


class GroupTools:
    """The tool environment of one rank of a tensor-parallel group (module docstring); everything but `begin`
    (the format, stop tokens, `assistant_message`, `close`, ...) is the wrapped environment's."""

    def __init__(self, env: Any, group: Any, first: bool, world: int):
        self.env, self.group, self.first, self.world = env, group, first, world

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def sync(self, ready: np.ndarray) -> np.ndarray:
        """[n] bool -> [n] bool: ready on every rank of the group (an all-reduce of the counts)."""
        counts = collectives.all_reduce_sum(np.asarray(ready, dtype=np.float64), self.group)
        return counts >= self.world

    def begin(self, turn_ids: Sequence[int], ended_by_call_end: bool) -> "SharedTurn":
        if self.first:
            pending = self.env.begin(turn_ids, ended_by_call_end)
            return SharedTurn(self, pending, pending.assistant, pending.has_calls)
        assistant = self.env.assistant_message(turn_ids)  # the same reading; no call starts here
        return SharedTurn(self, None, assistant, bool(assistant["tool_calls"]))


class SharedTurn:
    """A PendingTurn of `GroupTools`: `done()` is the first rank's (the others are always ready, so the AND over
    the group is the first rank's), `result()` the first rank's ToolTurn on every rank. A failure on the first rank
    (a tool server out of reach) is raised on every rank, not left as a hang."""

    def __init__(self, tools: GroupTools, pending: Optional[Any], assistant: dict, has_calls: bool):
        self.tools, self.pending, self.assistant, self.has_calls = tools, pending, assistant, has_calls

    def done(self) -> bool:
        return self.pending.done() if self.pending is not None else True

    def result(self) -> Any:
        out, error = None, None
        if self.pending is not None:
            try:
                out = ("ok", self.pending.result())
            except Exception as e:  # noqa: BLE001 - re-raised below, after the others have been told
                out, error = ("error", f"{type(e).__name__}: {e}"), e
        kind, value = collectives.broadcast_object(out, self.tools.group.ranks[0], self.tools.group)
        if error is not None:
            raise error
        if kind == "error":
            raise RuntimeError(f"the tool call failed on the first rank of this tensor-parallel group: {value}")
        return value
