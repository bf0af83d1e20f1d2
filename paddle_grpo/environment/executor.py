"""Running the calls of a multi-turn rollout: `ToolEnvironment.begin(turn_ids, ...)` reads an assistant turn, starts
its calls and returns at once (`PendingTurn`); `.result()` waits for them and gives the tool turn's tokens
(`ToolTurn`), which the rollout feeds to the policy as context.

Concurrency: every call runs in its own daemon thread, at most `max_workers` at a time, so the calls of all rows
run together and a row waiting for a slow tool does not hold up the others. A call that has run `timeout_s`
seconds gives a "timeout" result; Python cannot stop a thread, so its thread is abandoned (it runs on until the
function returns, no longer counted against `max_workers`; being a daemon thread it never keeps the process from
exiting, which a ThreadPoolExecutor's workers would). The time limit starts when the call starts running, not
while it waits for a slot. Built-in tools bound themselves (the calculator by sizes, `python` by its own limits);
a user's tool that can hang should too. A RemoteToolSet's calls are not cut at `timeout_s`: they bound themselves
(a reply not in full within `timeout_s` is their "timeout" result) and a tool server out of reach must raise, after
the client's retry budget, rather than become a "timeout" the policy reads.

The tool turn's tokens (`tool_turn_ids`): the format's own text is tokenized like a prompt, its markers
(`<|im_end|>`, `<|im_start|>`) special ids; each tool output is plain text, so a special token's string in it
(`<|im_end|>`, EOS) is its characters, never the token: what a tool prints cannot close the turn, open another,
or end the sequence. Lone surrogates in an output (which UTF-8 cannot encode) become U+FFFD.
"""
import os
import re
import threading
import time
from concurrent.futures import Future, TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..data import special_token_ids
from .format import HermesFormat
from .tool import ToolCall, ToolResult, ToolSet, error_result, precheck

# How many characters of a tool's output are tokenized per token kept (ToolEnvironment._cut). A BPE token of these
# vocabularies spells a few characters on average (about 4 in English text, code or JSON; a long run of one
# character can be one token of up to a few dozen): 32 per token puts the character cut far past the kept tokens,
# and a cut changes the tokens of its last word only, so the kept tokens are those of the whole output. An output
# whose start averages more characters per token than this shows fewer tokens than max_tool_response_len, never
# more.
CUT_CHARS_PER_TOKEN = 32


@dataclass
class ToolTurn:
    """The tool turn after an assistant turn: `messages` (one {"role": "tool", "name", "content", "error",
    "latency_s"} per call, content as the policy sees it), `ids` (the tokens of the format's tool_turn_text: the
    assistant turn closed if needed, the responses, the next assistant turn opened; the responses' contents as
    plain text: `tool_turn_ids`), `results` (the ToolResults)."""
    messages: List[Dict[str, Any]]
    ids: List[int]
    results: List[ToolResult]


class _Running:
    """One call in its thread: `started` (monotonic time, set when it gets a worker slot), its future."""

    def __init__(self, call: ToolCall) -> None:
        self.call = call
        self.future: Future = Future()
        self.started_event = threading.Event()
        self.started: Optional[float] = None
        self.lock = threading.Lock()
        self.holds_slot = False


class PendingTurn:
    """An assistant turn whose calls are running. `assistant` = {"role": "assistant", "content": the text outside
    the calls, "tool_calls": [{"name", "arguments"} (+ "error": "malformed", "raw" for a call that could not be
    read)]}; `has_calls`: the turn wrote at least one call (then the rollout continues with the tool turn)."""

    def __init__(self, env: "ToolEnvironment", assistant: Dict[str, Any], items: List[Union[ToolResult, _Running]],
                 close_turn: bool) -> None:
        self.assistant = assistant
        self._env, self._items, self._close_turn = env, items, close_turn
        self._turn: Optional[ToolTurn] = None

    @property
    def has_calls(self) -> bool:
        return bool(self._items)

    def done(self) -> bool:
        """True when result() would not block: every call has finished or run out of time."""
        return self._turn is not None or all(self._env._finished(item) for item in self._items)

    def result(self) -> ToolTurn:
        """The tool turn (blocks until every call has finished or run `timeout_s`). A RemoteToolSet's transport
        failure (the tool server unreachable after its retries) is raised here, never turned into a result. A
        turn without calls has an empty ToolTurn."""
        if self._turn is None and not self._items:
            self._turn = ToolTurn([], [], [])
        if self._turn is None:
            results = [item if isinstance(item, ToolResult) else self._env._wait(item) for item in self._items]
            self._turn = self._env._tool_turn(results, self._close_turn)
        return self._turn


class ToolEnvironment:
    """Tools + format + tokenizer for the multi-turn rollout; a context manager (`close()` refuses new turns).

    tools: a ToolSet or RemoteToolSet. fmt: the tool-call format (HermesFormat). timeout_s: per call, from its
    start (not applied to a tool set that `times_own_calls`, a RemoteToolSet: its bound on the whole reply is the
    tool's time limit, and its retries end with a ToolServerError that `result()` raises). max_workers: calls
    running at once.
    max_response_tokens: a tool output longer than this many tokens is cut to it, followed by a line saying how
    many tokens (for an output over max_response_tokens * CUT_CHARS_PER_TOKEN characters: characters) were cut."""

    def __init__(self, tools: ToolSet, fmt: HermesFormat, tokenizer: Any, *, timeout_s: float = 10,
                 max_workers: int = 8, max_response_tokens: int = 256) -> None:
        if timeout_s <= 0:
            raise ValueError(f"tool_timeout_s must be > 0, got {timeout_s}")
        if max_workers < 1:
            raise ValueError(f"tool_max_workers must be >= 1, got {max_workers}")
        if max_response_tokens < 1:
            raise ValueError(f"max_tool_response_len must be >= 1, got {max_response_tokens}")
        self.tools, self.fmt, self.tokenizer = tools, fmt, tokenizer
        self.timeout_s, self.max_workers, self.max_response_tokens = timeout_s, max_workers, max_response_tokens
        self._slots = threading.Semaphore(max_workers)
        self._active: set = set()  # calls holding a slot
        self._active_lock = threading.Lock()
        self._names = list(tools.names)
        self._timed = not getattr(tools, "times_own_calls", False)  # a RemoteToolSet's calls end by themselves
        self._closed = False
        self._eos = getattr(tokenizer, "eos_token_id", None)
        self._eos_text = self._decode([self._eos]) if self._eos is not None else None

    # ---- the rollout's side ---------------------------------------------------------------------------------------

    def stop_token_ids(self) -> List[int]:
        """Tokens that end a turn besides EOS: the call-end marker's id when the vocabulary has it as one token."""
        try:
            vocab = self.tokenizer.get_vocab()
        except (AttributeError, NotImplementedError):
            vocab = {}
        token = special_token_ids(self.tokenizer).get(self.fmt.call_end, vocab.get(self.fmt.call_end))
        if token is None or self._decode([int(token)]) != self.fmt.call_end:
            return []
        return [int(token)]

    def begin(self, turn_ids: Sequence[int], ended_by_call_end: bool) -> PendingTurn:
        """Read an assistant turn (its sampled tokens, ending at EOS or the call-end marker), start its calls and
        return without waiting. `ended_by_call_end`: the turn stopped at the call-end marker (its turn is then
        closed by the tool turn's text)."""
        if self._closed:
            raise RuntimeError("ToolEnvironment is closed")
        assistant, calls, at_eos = self._read(turn_ids)
        items: List[Union[ToolResult, _Running]] = []
        for call in calls:
            early = precheck(call, self._names)
            items.append(early if early is not None else self._start(call))
        close_turn = ended_by_call_end or not (at_eos and self._eos_text == self.fmt.turn_end)
        return PendingTurn(self, assistant, items, close_turn)

    def assistant_message(self, turn_ids: Sequence[int]) -> Dict[str, Any]:
        """The `PendingTurn.assistant` dict of an assistant turn whose calls are not to run (the rollout's last
        turn allowed by max_turns, or one cut by its token budget): read, nothing started."""
        return self._read(turn_ids)[0]

    def _read(self, turn_ids: Sequence[int]) -> Tuple[Dict[str, Any], List[ToolCall], bool]:
        """(assistant dict, calls, whether the turn ends at EOS) of an assistant turn's tokens."""
        ids = [int(i) for i in turn_ids]
        at_eos = bool(ids) and ids[-1] == self._eos
        content, calls = self.fmt.parse(self._decode(ids[:-1] if at_eos else ids))
        return {"role": "assistant", "content": content, "tool_calls": [_call_json(c) for c in calls]}, calls, at_eos

    def close(self) -> None:
        """Refuse new turns; running calls finish in their (daemon) threads."""
        self._closed = True

    def __enter__(self) -> "ToolEnvironment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- running calls --------------------------------------------------------------------------------------------

    def _start(self, call: ToolCall) -> _Running:
        running = _Running(call)
        threading.Thread(target=self._run, args=(running,), daemon=True, name=f"tool-{call.name}").start()
        return running

    def _run(self, running: _Running) -> None:
        self._slots.acquire()
        with running.lock:
            running.holds_slot = True
            running.started = time.monotonic()
        with self._active_lock:
            self._active.add(running)
        running.started_event.set()
        try:
            running.future.set_result(self.tools.call(running.call))
        except BaseException as exc:  # a RemoteToolSet's transport failure: re-raised by PendingTurn.result
            running.future.set_exception(exc)
        finally:
            self._release(running)

    def _release(self, running: _Running) -> None:
        with running.lock:
            if running.holds_slot:
                running.holds_slot = False
                self._slots.release()
        with self._active_lock:
            self._active.discard(running)

    def _reap(self) -> None:
        """Free the slots of calls past their time limit (their threads are abandoned), so that calls queued
        behind hung ones start even before anyone waits for the hung ones."""
        if not self._timed:
            return
        now = time.monotonic()
        with self._active_lock:
            expired = [r for r in self._active if r.started is not None and now - r.started >= self.timeout_s]
        for running in expired:
            self._release(running)

    def _finished(self, item: Union[ToolResult, _Running]) -> bool:
        if isinstance(item, ToolResult) or item.future.done():
            return True
        if not self._timed:
            return False
        self._reap()
        started = item.started
        return started is not None and time.monotonic() - started >= self.timeout_s

    def _wait(self, running: _Running) -> ToolResult:
        while not running.started_event.wait(0.05):  # queued behind max_workers running calls
            self._reap()
        if not self._timed:  # its result, or its ToolServerError raised here (never a "timeout" observation)
            return running.future.result()
        left = running.started + self.timeout_s - time.monotonic()
        try:
            return running.future.result(timeout=max(left, 0.0))
        except FutureTimeout:
            self._release(running)  # the abandoned thread no longer counts against max_workers
            return error_result(running.call.name, "timeout", f"{running.call.name} did not finish within "
                                f"{self.timeout_s:g} s", self.timeout_s)

    # ---- the tool turn's tokens -----------------------------------------------------------------------------------

    def _tool_turn(self, results: List[ToolResult], close_turn: bool) -> ToolTurn:
        shown = [self._cut(ToolResult(r.name, valid_text(r.content), r.error, r.latency_s)) for r in results]
        messages = [{"role": "tool", "name": r.name, "content": r.content, "error": r.error,
                     "latency_s": r.latency_s} for r in shown]
        return ToolTurn(messages, tool_turn_ids(self.tokenizer, self.fmt.tool_turn_parts(shown, close_turn)), shown)

    def _cut(self, result: ToolResult) -> ToolResult:
        """`result` with its content cut to max_response_tokens tokens and a note saying how much is not shown.
        Only the first max_response_tokens * CUT_CHARS_PER_TOKEN characters are tokenized (a tool may return
        megabytes, and tokenizing them all took seconds per call): an output within that bound is cut exactly as
        if tokenized whole, with the count of tokens not shown; a longer one's total token count is unknown, so its
        note counts the characters not shown."""
        text, limit = result.content, self.max_response_tokens
        bound = limit * CUT_CHARS_PER_TOKEN
        ids = plain_text_ids(self.tokenizer, text[:bound])
        if len(text) <= bound:
            if len(ids) <= limit:
                return result
            kept = self._decode(ids[:limit])
            note = f"\n[output cut: {len(ids) - limit} more tokens not shown]"
        else:
            kept = self._decode(ids[:limit])
            # kept is text's start, but for a character whose bytes the last kept token splits (decoded as U+FFFD)
            shown = len(os.path.commonprefix([kept, text[:len(kept)]]))
            note = f"\n[output cut: {len(text) - shown} more characters not shown]"
        return ToolResult(result.name, kept + note, result.error, result.latency_s)

    def _decode(self, ids: List[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def valid_text(text: str) -> str:
    """`text` with every lone surrogate (a str can hold one, e.g. a tool echoing JSON's `"\\ud800"`; UTF-8
    cannot encode it, so tokenizing it raises) replaced by U+FFFD, as decoding invalid bytes does."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def plain_text_ids(tokenizer: Any, text: str) -> List[int]:
    """Token ids of `text` as plain text: the string of a special or added token in it (`<|im_end|>`,
    `<|endoftext|>`, `<tool_call>`) gets the tokens of its characters, never the token's id
    (`split_special_tokens`, which PaddleNLP's and HF's tokenizers take). A tokenizer that ignores the flag gets
    the text cut after the first character of each such string, so that no piece holds one whole."""
    if not text:
        return []
    ids = [int(i) for i in tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]]
    specials = special_token_ids(tokenizer)
    if set(specials.values()).isdisjoint(ids):
        return ids
    cuts = sorted({m.start() + 1 for token in specials if len(token) > 1
                   for m in re.finditer(f"(?={re.escape(token)})", text)})
    pieces = [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]
    return [int(i) for piece in pieces if piece
            for i in tokenizer(piece, add_special_tokens=False)["input_ids"]]


def tool_turn_ids(tokenizer: Any, parts: Sequence[Tuple[str, bool]]) -> List[int]:
    """The tokens of a tool turn (or of a prompt with tools: `HermesFormat.prompt_with_tools_parts`, the
    schemas' special-token strings as contents) given as the format's (text, is_content) pieces: the format's own
    text is cut at special tokens, each one its id (as prompts are tokenized: data.tokenize_prompts); the text
    between them and the contents are encoded together as plain text (`plain_text_ids`). So a content without
    special-token strings gives exactly the tokens of the whole turn tokenized like a prompt, and one with them
    cannot forge a turn: its `<|im_end|>` is the characters, not the marker."""
    specials = special_token_ids(tokenizer)
    pattern = re.compile("(" + "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")") \
        if specials else None
    ids: List[int] = []
    plain: List[str] = []  # plain text waiting to be encoded as one piece
    for text, is_content in parts:
        for piece in ([text] if is_content or pattern is None else pattern.split(text)):
            if piece and not is_content and piece in specials:
                ids += plain_text_ids(tokenizer, "".join(plain)) + [specials[piece]]
                plain = []
            elif piece:
                plain.append(piece)
    return ids + plain_text_ids(tokenizer, "".join(plain))


def _call_json(call: ToolCall) -> Dict[str, Any]:
    out: Dict[str, Any] = {"name": call.name, "arguments": call.arguments}
    if call.error:
        out.update(error=call.error, raw=call.raw)
    return out
