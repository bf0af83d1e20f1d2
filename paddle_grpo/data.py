"""Prompt datasets: src/tgt JSONL (and parquet) reading, chat templates, left-padded collation, a resumable sampler.

The data protocol is PaddleNLP's (seed 003): one JSON object per line with a prompt field (`src`, renamed by
`prompt_key`) and a reference field (`tgt`, renamed by `response_key`), each a string or a one-element list of
strings. Every other column of a record is kept and reaches the reward functions as keyword arguments.

What is deliberately *not* here: no paddle tensors (collation returns numpy arrays; the trainer converts them), no
knowledge of ranks (the trainer splits a global batch of indices across data-parallel ranks), no streaming of
datasets larger than memory (prompt sets for RL are small), and no tokenizer downloads.

Chat templates (`chat_template` switch proposed for the config: `auto` | `none` | `qwen`):
- a prompt that already contains `<|im_start|>` is used verbatim in every mode (PaddleNLP's behaviour: its data is
  templated beforehand, e.g. seed 003's K&K prompts ending in `<|im_start|>assistant\\n<think>`);
- `none`: every prompt is used verbatim;
- `qwen`: a raw prompt is wrapped in Qwen's `<|im_start|>` format by this module (no tokenizer needed);
- `auto` (default): a raw prompt is rendered with the tokenizer's own chat template when it has a jinja one
  (a model's template is the format it was tuned on), and with the built-in Qwen format otherwise. PaddleNLP's
  legacy `chat_template.json` templates (`ChatTemplate` objects, deprecated by PaddleNLP) are not used because they
  cannot take a system message per prompt; such tokenizers get the Qwen format.

Tokenization (`tokenize_prompts`) cuts the text at the tokenizer's special tokens and encodes the pieces between
them, as HF's fast tokenizers do: paddlenlp 3.0.0b4 called on a whole Qwen prompt deletes the newline before each
`<|im_start|>`, or splits `<|im_start|>` into byte tokens when the tokenizer was built without registering it.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "DataError",
    "read_jsonl",
    "split_paths",
    "CHAT_TEMPLATE_MODES",
    "QWEN_DEFAULT_SYSTEM",
    "is_templated",
    "format_qwen_chat",
    "apply_chat_template",
    "special_token_ids",
    "tokenize_prompts",
    "collate_prompts",
    "encode_prompts",
    "PromptSampler",
    "write_jsonl",
    "shuffle_split",
]


class DataError(ValueError):
    """A dataset file that cannot be used; the message names the file, the line (or parquet row) and the key."""


# ----------------------------------------------------------------------------------------------------------------
# Reading
# ----------------------------------------------------------------------------------------------------------------

def split_paths(paths: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]) -> List[str]:
    """`"a.jsonl,b.parquet"` or a list of paths -> list of path strings (`train_datasets` may list several)."""
    if isinstance(paths, (str, os.PathLike)):
        items = [p.strip() for p in os.fspath(paths).split(",")]
    else:
        items = [os.fspath(p).strip() for p in paths]
    items = [p for p in items if p]
    if not items:
        raise DataError(f"no dataset file given (got {paths!r})")
    return items


def _to_python(value: Any) -> Any:
    """numpy scalars/arrays (as parquet cells come back from pandas) -> plain Python, recursively, so records are
    JSON-serialisable (they may be sent to a reward server)."""
    if isinstance(value, np.ndarray):
        return [_to_python(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_python(v) for v in value]
    return value


def _field(value: Any, where: str, key: str) -> str:
    """A string or a one-element list of strings -> the string; anything else -> DataError."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise DataError(f"{where}: key {key!r}: expected a string or a one-element list of strings, "
                            f"got a list of {len(value)} elements")
        value = value[0]
    if not isinstance(value, str):
        raise DataError(f"{where}: key {key!r}: expected a string or a one-element list of strings, "
                        f"got {type(value).__name__}")
    return value


def _make_record(obj: Any, where: str, prompt_key: str, response_key: str, require_response: bool) -> Dict[str, Any]:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with key {prompt_key!r}, got {type(obj).__name__}")
    if obj.get(prompt_key) is None:
        raise DataError(f"{where}: missing key {prompt_key!r} (the prompt; set prompt_key if the file names it "
                        f"differently; keys present: {sorted(obj)})")
    src = _field(obj[prompt_key], where, prompt_key)
    if not src.strip():
        raise DataError(f"{where}: key {prompt_key!r}: empty prompt")
    if obj.get(response_key) is None:
        if require_response:
            raise DataError(f"{where}: missing key {response_key!r} (the reference answer the rewards need; set "
                            f"response_key if the file names it differently; keys present: {sorted(obj)})")
        tgt = None
    else:
        tgt = _field(obj[response_key], where, response_key)
    record = {}
    for k, v in obj.items():
        if k in (prompt_key, response_key):
            continue
        if k in ("src", "tgt"):
            raise DataError(f"{where}: key {k!r} is present besides prompt_key={prompt_key!r} / "
                            f"response_key={response_key!r}; records store the prompt as 'src' and the reference "
                            f"as 'tgt', so this column would be shadowed. Rename it")
        record[k] = _to_python(v)
    record["src"] = src
    record["tgt"] = tgt
    return record


def iter_json_lines(path: str, expected: str) -> Iterator[Tuple[str, Any]]:
    """Yield (`path:line`, parsed value) for each non-blank line of a JSONL file; a UTF-8 BOM on the first line is
    accepted. Raises DataError naming the file and line for bytes that are not UTF-8 or text that is not JSON;
    `expected` ends that message (what a line should hold)."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not UTF-8 ({e}); expected {expected}") from None
            if not line.strip():
                continue  # blank lines (e.g. a trailing newline) are skipped silently
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: invalid JSON ({e.msg} at column {e.colno}); expected {expected}") from None


def read_json_rows(path: str, expected: str = "one JSON object per line") -> List[Any]:
    """Every line of a JSONL file the trainer wrote (metrics.jsonl, rollouts.jsonl), parsed; [] when the file does
    not exist. Errors as `iter_json_lines`."""
    if not os.path.exists(path):
        return []
    return [value for _, value in iter_json_lines(path, expected)]


def _read_jsonl_file(path: str, prompt_key: str, response_key: str, require_response: bool) -> List[Dict[str, Any]]:
    return [_make_record(obj, where, prompt_key, response_key, require_response)
            for where, obj in iter_json_lines(path, f"one JSON object per line with key {prompt_key!r}")]


def _read_parquet_file(path: str, prompt_key: str, response_key: str, require_response: bool) -> List[Dict[str, Any]]:
    import pandas as pd

    try:
        df = pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for a file that is not parquet
        raise DataError(f"{path}: cannot read as parquet ({type(e).__name__}: {e})") from None
    records = []
    for row, obj in enumerate(df.to_dict(orient="records"), start=1):
        obj = {k: (None if _is_missing(v) else v) for k, v in obj.items()}
        records.append(_make_record(obj, f"{path}: row {row}", prompt_key, response_key, require_response))
    return records


def _is_missing(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return False


def read_jsonl(path: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]], prompt_key: str = "src",
               response_key: str = "tgt", require_response: bool = True) -> List[Dict[str, Any]]:
    """Read prompt records from one or several src/tgt files.

    Args:
        path: a file, a comma-separated list of files (`train_datasets: a.jsonl,b.jsonl`), or a list of paths.
            Files ending in `.parquet` are read with pandas (same columns); anything else is JSON Lines.
        prompt_key, response_key: the column names of the prompt and of the reference answer.
        require_response: when False, a record without `response_key` gets `tgt=None` (prompts for evaluation
            by a reward that needs no reference); when True (training rewards need it) it is an error.

    Returns:
        records in file order, each a dict with `src` (str), `tgt` (str or None) and every other column unchanged
        (parquet numpy values converted to plain Python).

    Raises:
        DataError (a ValueError) naming the file, the 1-based line (parquet: row) and the key for: invalid JSON or
        UTF-8, a line that is not a JSON object, a missing or null prompt/response key, a field that is neither a
        string nor a one-element list of strings, an empty prompt, and a file with no records. Blank (whitespace-only)
        lines are skipped silently, so a trailing newline or an empty separator line is not an error.
    """
    records: List[Dict[str, Any]] = []
    for p in split_paths(path):
        if not os.path.isfile(p):
            raise DataError(f"{p}: dataset file not found")
        reader = _read_parquet_file if p.endswith(".parquet") else _read_jsonl_file
        file_records = reader(p, prompt_key, response_key, require_response)
        if not file_records:
            raise DataError(f"{p}: no records (empty file or only blank lines); expected JSON objects with key "
                            f"{prompt_key!r}")
        records.extend(file_records)
    return records


def write_jsonl(path: Union[str, os.PathLike], records: Sequence[Dict[str, Any]]) -> None:
    """Write records one JSON object per line (UTF-8, non-ASCII kept), creating the parent directory."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def _prompt_text(record: Dict[str, Any]) -> str:
    src = record["src"]
    return src[0] if isinstance(src, list) else src


def shuffle_split(records: Sequence[Dict[str, Any]], seed: int, limit: Optional[int] = None,
                  eval_fraction: float = 0.0) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """The converters' split: shuffle with `random.Random(seed)`, drop records whose prompt repeats an earlier one,
    keep the first `limit`, and move the first `round(eval_fraction * n)` of those to the eval part.

    Returns `(train, eval)`; no prompt is in both."""
    import random

    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
    records = list(records)
    random.Random(seed).shuffle(records)
    seen, unique = set(), []
    for r in records:
        key = _prompt_text(r)
        if key not in seen:
            seen.add(key)
            unique.append(r)
    if limit is not None:
        unique = unique[:limit]
    n_eval = int(round(eval_fraction * len(unique)))
    return unique[n_eval:], unique[:n_eval]


# ----------------------------------------------------------------------------------------------------------------
# Chat templates
# ----------------------------------------------------------------------------------------------------------------

CHAT_TEMPLATE_MODES = ("auto", "none", "qwen")
QWEN_DEFAULT_SYSTEM = "You are a helpful assistant."
_IM_START = "<|im_start|>"


def is_templated(prompt: str) -> bool:
    """True when the prompt already carries Qwen/ChatML turn markers and must be used as is."""
    return _IM_START in prompt


def format_qwen_chat(user: str, system: Optional[str] = QWEN_DEFAULT_SYSTEM, assistant_prefix: str = "") -> str:
    """One user turn in Qwen's ChatML format, ending with the assistant's turn opened (plus `assistant_prefix`).

    `system=None` or `""` leaves out the system turn. The K&K prompts of seed 003 are
    `format_qwen_chat(quiz + "\\n", system=KK_SYSTEM + "\\n", assistant_prefix="<think>")`.
    """
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{assistant_prefix}"


def _jinja_chat_template(tokenizer: Any) -> bool:
    """True when the tokenizer has a jinja chat template (paddlenlp compiles it to a jinja2 Template; an HF-style
    tokenizer keeps the source string). PaddleNLP's legacy `ChatTemplate` objects are deliberately not used."""
    template = getattr(tokenizer, "chat_template", None)
    if template is None:
        return False
    if isinstance(template, str):
        return bool(template.strip())
    try:
        from jinja2 import Template
    except ImportError:  # pragma: no cover - jinja2 ships with paddlenlp
        return False
    return isinstance(template, Template)


def apply_chat_template(prompt: str, tokenizer: Any = None, system: Optional[str] = None, mode: str = "auto") -> str:
    """Return the text the policy sees for `prompt` (see the module docstring for the modes).

    Args:
        prompt: the `src` of a record.
        tokenizer: used only in `auto` mode, for its jinja chat template.
        system: the system message for raw prompts. None means the template's default: the tokenizer template's
            own (Qwen2.5 adds one) or `QWEN_DEFAULT_SYSTEM` for the built-in format; `""` means no system turn
            in the built-in format.
        mode: `auto`, `none` or `qwen`.
    """
    if mode not in CHAT_TEMPLATE_MODES:
        raise ValueError(f"chat_template: unknown mode {mode!r}; expected one of {', '.join(CHAT_TEMPLATE_MODES)}")
    if mode == "none" or is_templated(prompt):
        return prompt
    if mode == "auto" and tokenizer is not None and _jinja_chat_template(tokenizer):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return format_qwen_chat(prompt, system=QWEN_DEFAULT_SYSTEM if system is None else system)


# ----------------------------------------------------------------------------------------------------------------
# Tokenization and collation
# ----------------------------------------------------------------------------------------------------------------

_TURN_MARKERS = ("<|im_start|>", "<|im_end|>")


_SPECIAL_IDS_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def special_token_ids(tokenizer: Any) -> Dict[str, int]:
    """The tokenizer's special and added tokens (plus the ChatML turn markers when its vocabulary has them), each
    mapped to its single id. Cached per tokenizer (a Qwen vocabulary has 150k entries) until its size or its list
    of special tokens changes."""
    try:
        version = (len(tokenizer), tuple(getattr(tokenizer, "all_special_tokens", None) or ()))
    except TypeError:
        version = None
    try:
        cached = _SPECIAL_IDS_CACHE.get(tokenizer)
    except TypeError:  # not weak-referenceable
        cached = None
    if cached is not None and version is not None and cached[0] == version:
        return dict(cached[1])
    out = _find_special_token_ids(tokenizer)
    if version is not None:
        try:
            _SPECIAL_IDS_CACHE[tokenizer] = (version, out)
        except TypeError:
            pass
    return dict(out)


def _find_special_token_ids(tokenizer: Any) -> Dict[str, int]:
    try:
        vocab = tokenizer.get_vocab()
    except (AttributeError, NotImplementedError):
        vocab = {}
    names = set(getattr(tokenizer, "all_special_tokens", None) or [])
    names.update(getattr(tokenizer, "added_tokens_encoder", None) or {})
    names.update(m for m in _TURN_MARKERS if m in vocab)
    out = {}
    for name in names:
        if not isinstance(name, str) or not name:
            continue
        if name in vocab:
            out[name] = int(vocab[name])
        else:
            added = getattr(tokenizer, "added_tokens_encoder", None) or {}
            if name in added:
                out[name] = int(added[name])
    return out


def tokenize_prompts(tokenizer: Any, prompts: Sequence[str], exact_special_tokens: bool = True) -> List[List[int]]:
    """Token ids of each (already templated) prompt, without BOS/EOS (the template text carries its own special
    tokens).

    With `exact_special_tokens` (default) the text is cut at the tokenizer's special tokens (`special_token_ids`),
    each special token becomes its id, and each piece between them is encoded with
    `tokenizer(piece, add_special_tokens=False)["input_ids"]`. This is how HF's fast tokenizers and vLLM tokenize
    Qwen prompts. Calling a paddlenlp 3.0.0b4 tokenizer on the whole text instead (`exact_special_tokens=False`,
    PaddleNLP's own behaviour) differs in two ways: it deletes the whitespace on both sides of a special token
    registered as a plain string, which is how `from_pretrained` registers Qwen's `<|im_start|>` (so the `\\n`
    between `<|im_end|>` and the next `<|im_start|>` is lost), and a `Qwen2Tokenizer(...)` constructed directly
    with `additional_special_tokens=[...]` splits the markers into several byte tokens.
    """
    specials = special_token_ids(tokenizer) if exact_special_tokens else {}
    pattern = re.compile("(" + "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")") \
        if specials else None
    out = []
    for text in prompts:
        if pattern is None:
            out.append([int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]])
            continue
        ids: List[int] = []
        for piece in pattern.split(text):
            if not piece:
                continue
            if piece in specials:
                ids.append(specials[piece])
            else:
                ids.extend(int(i) for i in tokenizer(piece, add_special_tokens=False)["input_ids"])
        out.append(ids)
    return out


def collate_prompts(token_id_lists: Sequence[Sequence[int]], pad_token_id: int, max_prompt_len: Optional[int],
                    return_num_truncated: bool = False
                    ) -> Union[Tuple[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray, int]]:
    """Left-pad a batch of prompts; left-truncate the ones longer than `max_prompt_len`.

    Generation appends to the right, so every prompt must end at the last column: padding goes on the left, and a
    too-long prompt keeps its last `max_prompt_len` tokens (the end holds the question and the opened assistant
    turn; the start is usually the system prompt). Each truncation is counted and logged as a warning.

    Args:
        token_id_lists: B lists of token ids, each non-empty.
        pad_token_id: the id used for padding (masked out).
        max_prompt_len: the longest prompt kept, or None for no limit.
        return_num_truncated: also return how many prompts were truncated.

    Returns:
        `(input_ids, attention_mask)`, both int64 numpy arrays of shape [B, L] where L is the longest prompt after
        truncation (not padded up to `max_prompt_len`); the mask is 1 on real tokens, 0 on padding.
        With `return_num_truncated=True`, `(input_ids, attention_mask, num_truncated)`.
    """
    if len(token_id_lists) == 0:
        raise ValueError("collate_prompts: empty batch")
    if max_prompt_len is not None and max_prompt_len <= 0:
        raise ValueError(f"collate_prompts: max_prompt_len must be positive, got {max_prompt_len}")
    seqs = []
    num_truncated = 0
    longest_before = 0
    for i, ids in enumerate(token_id_lists):
        ids = list(ids)
        if not ids:
            raise ValueError(f"collate_prompts: prompt {i} of the batch has no tokens")
        longest_before = max(longest_before, len(ids))
        if max_prompt_len is not None and len(ids) > max_prompt_len:
            ids = ids[-max_prompt_len:]
            num_truncated += 1
        seqs.append(ids)
    if num_truncated:
        logger.warning("%d of %d prompts longer than max_prompt_len=%d were left-truncated (longest: %d tokens)",
                       num_truncated, len(seqs), max_prompt_len, longest_before)
    width = max(len(s) for s in seqs)
    input_ids = np.full((len(seqs), width), pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(seqs), width), dtype=np.int64)
    for row, ids in enumerate(seqs):
        input_ids[row, width - len(ids):] = ids
        attention_mask[row, width - len(ids):] = 1
    if return_num_truncated:
        return input_ids, attention_mask, num_truncated
    return input_ids, attention_mask


def pad_columns(x: Any, width: int, value: Any, side: str = "right") -> Any:
    """`x` [n, w] padded with `value` to [n, width] on the `side` ("left" or "right"); a numpy array or a paddle
    tensor (the same type comes back). Prompts are padded on the left (generation appends on the right),
    completions and per-token values on the right."""
    missing = width - x.shape[1]
    if missing == 0:
        return x
    if isinstance(x, np.ndarray):
        return np.pad(x, ((0, 0), (missing, 0) if side == "left" else (0, missing)), constant_values=value)
    import paddle  # data files are read without paddle; only tensors need it

    filler = paddle.full([x.shape[0], missing], value, dtype=x.dtype)
    return paddle.concat([filler, x] if side == "left" else [x, filler], axis=1)


def encode_prompts(prompts: Sequence[str], tokenizer: Any, max_prompt_len: Optional[int], chat_template: str = "auto",
                   system: Optional[str] = None) -> Tuple[np.ndarray, np.ndarray, int]:
    """Template, tokenize and collate a batch of `src` strings in one call.

    Returns `(input_ids, attention_mask, num_truncated)` as in `collate_prompts`. The pad id is the tokenizer's
    `pad_token_id`, else its `eos_token_id` (masked out either way)."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "eos_token_id", None)
    if pad is None:
        raise ValueError("encode_prompts: the tokenizer has neither pad_token_id nor eos_token_id")
    texts = [apply_chat_template(p, tokenizer=tokenizer, system=system, mode=chat_template) for p in prompts]
    return collate_prompts(tokenize_prompts(tokenizer, texts), int(pad), max_prompt_len, return_num_truncated=True)


# ----------------------------------------------------------------------------------------------------------------
# Micro-batches by length, balanced row partitions
# ----------------------------------------------------------------------------------------------------------------

def row_extents(prompt_mask: np.ndarray, completion_mask: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """The columns each row needs: prompt [n] = L - its first real column (prompts are left-padded; 0 when it has
    none), completion [n] = its last real column + 1 (completions are right-padded; 0 when it has none). int64."""
    def last_real(mask):  # index of the last non-zero column + 1, 0 for an all-zero row
        real = np.asarray(mask) != 0
        return np.where(real.any(1), real.shape[1] - np.argmax(real[:, ::-1], axis=1), 0)

    return last_real(np.asarray(prompt_mask)[:, ::-1]).astype(np.int64), last_real(completion_mask).astype(np.int64)


def form_micro_batches(prompt_len: np.ndarray, completion_len: np.ndarray, max_rows: int, max_tokens: int = 0
                       ) -> List[np.ndarray]:
    """Rows grouped into micro-batches of similar length (the idea of verl's dynamic batch size).

    prompt_len, completion_len: [n] the columns each row needs (`row_extents`). Rows are sorted by
    prompt + completion, longest first (ties: lower index first), and cut greedily into consecutive runs: with
    `max_tokens` > 0 a run grows while `rows x (longest prompt + longest completion)` of the run stays within it (a
    row longer than the budget alone forms a micro-batch); otherwise runs of `max_rows` rows. Returns the
    micro-batches longest first, each an int64 array of row indices in ascending order (so the samples of one
    prompt stay adjacent, which the policies' prompt sharing uses); every row is in exactly one."""
    p, c = np.asarray(prompt_len, dtype=np.int64), np.asarray(completion_len, dtype=np.int64)
    n = len(p)
    if max_tokens <= 0 and max_rows <= 0:
        raise ValueError(f"form_micro_batches needs max_rows > 0 or max_tokens > 0, got {max_rows}, {max_tokens}")
    order = np.argsort(-(p + c), kind="stable")
    out, start = [], 0
    while start < n:
        end, wp, wc = start + 1, p[order[start]], c[order[start]]
        while end < n:
            if max_tokens > 0:
                np_, nc = max(wp, p[order[end]]), max(wc, c[order[end]])
                if (end - start + 1) * (np_ + nc) > max_tokens:
                    break
                wp, wc = np_, nc
            elif end - start >= max_rows:
                break
            end += 1
        out.append(np.sort(order[start:end]))
        start = end
    return out


def balanced_partition(weights: np.ndarray, parts: int) -> List[np.ndarray]:
    """Split rows into `parts` sets of equal size (len(weights) / parts) with near-equal weight sums.

    Rows are taken heaviest first (ties: lower index first) in rounds of `parts`; in each round the heaviest row goes
    to the set with the smallest sum so far, the next to the next smallest, and so on. By induction over the rounds
    the sums end within the heaviest row's weight of each other. Deterministic: the same on every rank. Returns
    `parts` int64 arrays of row indices, each ascending."""
    w = np.asarray(weights, dtype=np.float64)
    if parts <= 0 or len(w) % parts:
        raise ValueError(f"balanced_partition: {len(w)} rows cannot be split into {parts} sets of equal size")
    order = np.argsort(-w, kind="stable")
    sums, members = np.zeros(parts), [[] for _ in range(parts)]
    for r in range(0, len(w), parts):
        for row, part in zip(order[r:r + parts], np.argsort(sums, kind="stable")):
            members[part].append(row)
            sums[part] += w[row]
    return [np.sort(np.asarray(m, dtype=np.int64)) for m in members]


def balance_rows(weights: np.ndarray, ranks: int, rows_per_mini_batch: int) -> List[np.ndarray]:
    """The rows each data-parallel rank holds after balancing, mini-batch by mini-batch.

    weights: [ranks * n] per row (its tokens), in rank order: rank r holds rows r*n .. r*n + n - 1 and its k-th
    local mini-batch is its rows k*m .. k*m + m - 1 (m = `rows_per_mini_batch`, per rank). Global mini-batch k (the
    union of every rank's k-th local mini-batch) is split by `balanced_partition` into `ranks` sets of m rows, and
    rank r's k-th local mini-batch becomes set r: every optimizer step still sees exactly the same rows.
    Returns per rank its global row indices [n] int64, mini-batch after mini-batch."""
    w = np.asarray(weights)
    if ranks <= 0 or len(w) % ranks:
        raise ValueError(f"balance_rows: {len(w)} rows are not {ranks} equal shares")
    n = len(w) // ranks
    m = rows_per_mini_batch if 0 < rows_per_mini_batch and n % rows_per_mini_batch == 0 else n
    out: List[List[np.ndarray]] = [[] for _ in range(ranks)]
    for k in range(0, n, m):
        members = np.concatenate([np.arange(r * n + k, r * n + k + m) for r in range(ranks)])
        for r, part in enumerate(balanced_partition(w[members], ranks)):
            out[r].append(members[part])
    return [np.concatenate(x).astype(np.int64) for x in out]


# ----------------------------------------------------------------------------------------------------------------
# Sampling
# ----------------------------------------------------------------------------------------------------------------

class PromptSampler:
    """Deterministic, seedable, resumable batches of record indices.

    Epoch `e` visits the records in the order `permutation(seed, e)` (numpy's PCG64 seeded with `[seed, e]`; the
    identity when `shuffle` is False) in consecutive batches of `batch_size`. With `drop_last` the incomplete tail
    of an epoch is skipped; without it the last batch of an epoch is smaller. Batches never straddle epochs.

    The state is `(epoch, position)`: `position` counts the records of epoch `epoch` already handed out. A sampler
    restored with `set_state_dict(old.state_dict())` hands out exactly the batches the old one would have.

    Use `next_batch()` for an endless stream (the trainer counts steps), or iterate the sampler for the rest of the
    current epoch (`for epoch in ...: for batch in sampler: ...`). `len(sampler)` is the number of batches per epoch.
    """

    def __init__(self, num_records: int, batch_size: int, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False):
        if num_records <= 0:
            raise ValueError(f"PromptSampler: num_records must be positive, got {num_records}")
        if batch_size <= 0:
            raise ValueError(f"PromptSampler: batch_size must be positive, got {batch_size}")
        if drop_last and num_records < batch_size:
            raise ValueError(f"PromptSampler: drop_last with {num_records} records and batch_size {batch_size} "
                             "would never yield a batch")
        self.num_records = int(num_records)
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.drop_last = bool(drop_last)
        self.epoch = 0
        self.position = 0
        self._order_epoch = None
        self._order = None

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_records // self.batch_size
        return -(-self.num_records // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The visiting order of epoch `epoch` (int64 indices)."""
        if self._order_epoch != epoch:
            if self.shuffle:
                rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
                self._order = rng.permutation(self.num_records).astype(np.int64)
            else:
                self._order = np.arange(self.num_records, dtype=np.int64)
            self._order_epoch = epoch
        return self._order

    def _epoch_exhausted(self) -> bool:
        remaining = self.num_records - self.position
        return remaining <= 0 or (self.drop_last and remaining < self.batch_size)

    def next_batch(self) -> List[int]:
        """The next batch of record indices, moving on to the next epoch when this one is used up."""
        if self._epoch_exhausted():
            self.epoch += 1
            self.position = 0
        batch = self.order(self.epoch)[self.position:self.position + self.batch_size]
        self.position += len(batch)
        if self._epoch_exhausted():
            self.epoch += 1
            self.position = 0
        return [int(i) for i in batch]

    def __iter__(self) -> Iterator[List[int]]:
        """The remaining batches of the current epoch."""
        if self._epoch_exhausted():
            self.epoch += 1
            self.position = 0
        epoch = self.epoch
        while self.epoch == epoch:
            yield self.next_batch()

    def state_dict(self) -> Dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "num_records": self.num_records,
                "shuffle": self.shuffle, "batch_size": self.batch_size, "drop_last": self.drop_last}

    def set_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore `(epoch, position)`. The order depends on `num_records`, `seed` and `shuffle`, so a state saved
        with different values cannot be continued exactly and is refused; `batch_size`/`drop_last` may change."""
        for key in ("num_records", "seed", "shuffle"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(f"PromptSampler.set_state_dict: saved {key}={state[key]!r} differs from "
                                 f"{getattr(self, key)!r}; the run cannot resume on the same data order")
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.num_records:
            raise ValueError(f"PromptSampler.set_state_dict: invalid epoch/position {epoch}/{position}")
        self.epoch, self.position = epoch, position
