"""The multi-turn decode loop: completions that call tools, with the KV cache kept across turns.

Each row is in one of four states, and every loop step advances all rows at once through one stepper call:
- generating: samples its next token with single_turn.py's maths (`choose`: temperature, repetition penalty, EOS
  blocked until the row has `min_new_tokens` actions, top-k / top-p, keyed uniforms at the row's own completion
  position), an action (completion_mask 1);
- waiting: its turn ended at EOS or at one of `tools.stop_token_ids()` (the call-end marker: with it a turn holds
  one call, since the row stops at the first one; docs/tools.md says why) and `tools.begin` submitted the turn's
  calls to the environment's pool; the row is idle (`keep` False: no cache slot, no position) until
  `PendingTurn.done()`, whose `result()` raises what the environment raises (a tool server out of reach after its
  retry budget: the step fails and the trainer saves as for any fault, run/faults.py);
- feeding: the tokens of its `ToolTurn` (the tool responses, framed by the chat template, then the opening of the
  next assistant turn) are fed one per step, forced (sample log-prob 0, completion_mask 0, tool_mask 1), into the
  same cache: nothing is re-encoded;
- done: a turn without calls (the final answer), the `max_turns`-th assistant turn (its calls are not run: the
  message records them, no tool message follows), or the `max_new_tokens` budget (actions and tool tokens together)
  ran out: what fits is kept and the row is `truncated` unless it ended with its final answer.
Rows that wait do not stall the others; when every unfinished row waits, the loop sleeps until a result arrives
instead of running the model. With the lean stepper (per-row cache slots) a row's logits are those of decoding it
alone, so its tokens depend on its keys and its own trajectory, not on the other rows or on tool latency; through
PaddleNLP's stepper they agree up to float32 rounding.

`tools` is the environment of paddle_grpo.environment (`ToolEnvironment`), which this package does not import: it
uses `stop_token_ids()`, `begin(turn_ids, ended_by_call_end) -> PendingTurn` and `assistant_message(turn_ids)`.

Tensor parallelism: the ranks of a group run the same rows and must call the model in lockstep (each step is a
collective), but each rank's tools finish at their own times. `sync` ([n] bool -> [n] bool, the AND over the group,
e.g. an all-reduce MIN: the caller's, since only parallel/ talks to paddle.distributed) makes a row's tool turn
start on the same step on every rank; the tools must then give every rank the same output (deterministic tools,
or one rank's results broadcast by the caller's environment).
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, List, Optional

import numpy as np
import paddle

from ..algorithms import gather_last
from ..precision import full_precision
from .sampling import uniforms
from .single_turn import Stepper, ToolStats, choose

if TYPE_CHECKING:
    from ..environment import ToolEnvironment

GENERATING, WAITING, FEEDING, DONE = range(4)
# When every unfinished row waits for a tool the loop polls, sleeping 0.5 ms first (a fast tool is picked up at
# once), then twice as long each time up to 5 ms: a slow tool's result is seen at most 5 ms late, and a second of
# waiting takes ~180 polls instead of ~1600 with a fixed 0.5 ms (each poll asks every waiting row's calls, and under
# tensor parallelism it is a collective).
_POLL_S, _POLL_MAX_S = 0.0005, 0.005


@dataclass
class TurnsChunk:
    """What `decode_turns` returns for one chunk of rows: numpy arrays [n, T] (T = the longest completion), the
    per-row messages and the chunk's timings."""
    ids: np.ndarray               # [n, T] int64, pad after the end
    sample_logprobs: np.ndarray   # [n, T] float32, 0 on tool tokens and padding
    completion_mask: np.ndarray   # [n, T] int64, 1 on actions (sampled tokens)
    tool_mask: np.ndarray         # [n, T] int64, 1 on fed tool-turn tokens
    lengths: np.ndarray           # [n] actions
    truncated: np.ndarray         # [n] bool
    turns: List[List[dict]]
    stats: ToolStats


class _Rows:
    """Per-row state of the loop: the completion buffers and the turn bookkeeping."""

    def __init__(self, n: int, max_new_tokens: int, pad_id: int, eos: List[int], tools: ToolEnvironment,
                 max_turns: int, sync: Optional[Callable[[np.ndarray], np.ndarray]] = None):
        self.n, self.budget, self.tools, self.max_turns, self.sync = n, max_new_tokens, tools, max_turns, sync
        self.eos = set(eos)
        self.stop = {int(t) for t in tools.stop_token_ids()} - self.eos
        self.state = np.full(n, GENERATING)
        self.pos = np.zeros(n, dtype=np.int64)         # completion tokens so far (actions + tool tokens)
        self.actions = np.zeros(n, dtype=np.int64)
        self.turn_start = np.zeros(n, dtype=np.int64)  # completion position where the current assistant turn began
        self.turns_taken = np.ones(n, dtype=np.int64)  # assistant turns begun
        self.ids = np.full((n, max_new_tokens), pad_id, dtype=np.int64)
        self.logps = np.zeros((n, max_new_tokens), dtype=np.float32)
        self.action = np.zeros((n, max_new_tokens), dtype=np.int64)
        self.tool = np.zeros((n, max_new_tokens), dtype=np.int64)
        self.truncated = np.zeros(n, dtype=bool)
        self.pending: List[Any] = [None] * n
        self.forced: List[List[int]] = [[] for _ in range(n)]
        self.fed = np.zeros(n, dtype=np.int64)        # forced tokens of the current tool turn fed so far
        self.messages: List[List[dict]] = [[] for _ in range(n)]

    def record(self, i: int, token: int, logp: float, action: bool) -> None:
        p = self.pos[i]
        self.ids[i, p] = token
        if action:
            self.logps[i, p], self.action[i, p] = logp, 1
            self.actions[i] += 1
        else:
            self.tool[i, p] = 1
        self.pos[i] = p + 1

    def after_action(self, i: int, token: int) -> None:
        """Row i just sampled `token`: end its turn at EOS / a stop token, or stop it at the budget."""
        ended = token in self.eos or token in self.stop
        if not ended:
            if self.pos[i] >= self.budget:  # cut mid-turn: record what it wrote, run nothing
                self.messages[i].append(self.tools.assistant_message(self._turn(i)))
                self.state[i], self.truncated[i] = DONE, True
            return
        if self.turns_taken[i] >= self.max_turns or self.pos[i] >= self.budget:
            # The last turn allowed, or no room left for a tool turn: its calls (if any) are recorded, not run.
            message = self.tools.assistant_message(self._turn(i))
            self.messages[i].append(message)
            self.state[i] = DONE
            self.truncated[i] = bool(message.get("tool_calls")) and self.turns_taken[i] < self.max_turns
            return
        pending = self.tools.begin(self._turn(i), token in self.stop)
        self.messages[i].append(pending.assistant)
        if pending.has_calls:
            self.pending[i], self.state[i] = pending, WAITING
        else:
            self.state[i] = DONE  # the final answer

    def after_forced(self, i: int) -> None:
        """Row i was fed a tool-turn token: start its next assistant turn after the last one, or stop at the
        budget."""
        self.fed[i] += 1
        if self.fed[i] == len(self.forced[i]):
            self.state[i] = GENERATING
            self.turns_taken[i] += 1
            self.turn_start[i] = self.pos[i]
        if self.pos[i] >= self.budget:
            self.state[i], self.truncated[i] = DONE, True

    def ready(self) -> np.ndarray:
        """[n] bool: waiting rows whose calls have finished here, agreed over the tensor-parallel group by `sync`."""
        local = np.zeros(self.n, dtype=bool)
        for i in np.flatnonzero(self.state == WAITING):
            local[i] = self.pending[i].done()
        return local if self.sync is None else np.asarray(self.sync(local), dtype=bool)

    def poll(self) -> None:
        """Move the rows whose tool calls have finished from waiting to feeding."""
        if not (self.state == WAITING).any():  # the same on every rank: no collective needed
            return
        for i in np.flatnonzero(self.ready()):
            result = self.pending[i].result()
            self.pending[i] = None
            self.messages[i].extend(result.messages)
            if not result.ids:
                raise RuntimeError("the tool environment returned a tool turn without tokens (its format's "
                                   "tool_turn_text must frame the responses and open the next assistant turn)")
            self.forced[i], self.fed[i], self.state[i] = list(result.ids), 0, FEEDING

    def wait_for_any(self) -> float:
        """Sleep until some waiting row's calls have finished (on every rank, with `sync`); the seconds waited."""
        start, pause = time.perf_counter(), _POLL_S
        while not self.ready().any():
            time.sleep(pause)
            pause = min(2 * pause, _POLL_MAX_S)
        return time.perf_counter() - start

    def _turn(self, i: int) -> List[int]:
        return self.ids[i, self.turn_start[i]:self.pos[i]].tolist()


def decode_turns(stepper: Stepper, prompt_ids: paddle.Tensor, prompt_mask: paddle.Tensor, G: int,
                 max_new_tokens: int, min_new_tokens: int, eos: List[int], pad_id: int, temperature: float,
                 top_p: float, repetition_penalty: float, do_sample: bool, keys: Optional[np.ndarray],
                 penalize_prompt: bool, top_k: int, tools: ToolEnvironment, max_turns: int,
                 sync: Optional[Callable[[np.ndarray], np.ndarray]] = None) -> TurnsChunk:
    """The multi-turn loop (module docstring) over prompts [P, L] and their G samples each (N = P * G rows); the
    arguments are single_turn.decode's plus `tools`, `max_turns` (assistant turns per row, >= 1) and `sync`
    (tensor parallelism: module docstring)."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    stats = ToolStats()
    timed = _timer(stats)
    logits = timed(stepper.start, prompt_ids, prompt_mask, G, max_new_tokens)
    N = logits.shape[0]
    rows = _Rows(N, max_new_tokens, pad_id, eos, tools, max_turns, sync)
    eos_t = paddle.to_tensor(eos, dtype="int64")
    seen = None  # [N, S] ids seen by each row for the repetition penalty (-1: none)
    if repetition_penalty != 1.0 and penalize_prompt:
        seen = paddle.repeat_interleave(paddle.where(prompt_mask.astype("bool"), prompt_ids,
                                                     paddle.full_like(prompt_ids, -1)), G, axis=0)
    while True:
        rows.poll()
        moving = (rows.state == GENERATING) | (rows.state == FEEDING)
        if not moving.any():
            if not (rows.state == WAITING).any():
                break
            stats.wait_s += rows.wait_for_any()
            continue
        token = np.full(N, pad_id, dtype=np.int64)
        gen = np.flatnonzero(rows.state == GENERATING)
        if gen.size:
            sampled, logp = _sample_rows(logits, gen, N, seen, rows, eos_t, temperature, repetition_penalty,
                                         min_new_tokens, do_sample, top_k, top_p, keys)
            token[gen] = sampled
        for i in np.flatnonzero(rows.state == FEEDING):
            token[i] = rows.forced[i][rows.fed[i]]
            rows.record(i, int(token[i]), 0.0, action=False)
            rows.after_forced(i)
        for j, i in enumerate(gen):
            rows.record(i, int(token[i]), float(logp[j]), action=True)
            rows.after_action(i, int(token[i]))
        if (rows.state == DONE).all():
            break
        if repetition_penalty != 1.0:
            column = paddle.to_tensor(np.where(moving, token, -1)).unsqueeze(-1)
            seen = column if seen is None else paddle.concat([seen, column], axis=-1)
        logits = timed(stepper.step, paddle.to_tensor(token), paddle.to_tensor(moving))
        stats.steps += 1
    T = max(int(rows.pos.max()), 1)
    return TurnsChunk(ids=rows.ids[:, :T], sample_logprobs=rows.logps[:, :T], completion_mask=rows.action[:, :T],
                      tool_mask=rows.tool[:, :T], lengths=rows.actions.copy(), truncated=rows.truncated.copy(),
                      turns=rows.messages, stats=stats)


def _sample_rows(logits: paddle.Tensor, gen: np.ndarray, N: int, seen: Optional[paddle.Tensor], rows: _Rows,
                 eos_t: paddle.Tensor, temperature: float, repetition_penalty: float, min_new_tokens: int,
                 do_sample: bool, top_k: int, top_p: float, keys: Optional[np.ndarray]):
    """Tokens and sample log-probs (numpy [g]) of the generating rows `gen`, each from its own logits, keyed by its
    own completion position (every op is per row, so the other rows do not change a row's result)."""
    index = None if gen.size == N else paddle.to_tensor(gen)
    pick = (lambda x: x) if index is None else (lambda x: paddle.index_select(x, index))
    blocked = rows.actions[gen] < min_new_tokens
    block_eos = None if not blocked.any() else (True if blocked.all() else paddle.to_tensor(blocked))
    u = None if keys is None or not do_sample else uniforms(keys[gen], rows.pos[gen])
    with full_precision():  # under the update's autocast only the model runs in it (single_turn.py)
        token, z, lse = choose(pick(logits), temperature, None if seen is None else pick(seen), repetition_penalty,
                               block_eos, paddle.tile(eos_t.unsqueeze(0), [gen.size, 1]), do_sample, top_k, top_p, u)
        logp = gather_last(z, token.unsqueeze(-1)).squeeze(-1) - lse
    return token.numpy(), logp.numpy()


def _timer(stats: ToolStats) -> Callable[..., Any]:
    def run(fn: Callable[..., Any], *args: Any) -> Any:
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            stats.model_s += time.perf_counter() - start
    return run
