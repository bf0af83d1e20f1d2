"""The tool quickstart's policy: a tiny Qwen2 that knows the calculator's call format but uses it only sometimes.

Task: `What is A*B?` with A in 100..999 and B in 10..99. The policy (0.6 M parameters) cannot multiply such numbers
itself; with the `calculator` tool it only has to copy the operands into the call and the tool's result into its
answer. The prompt is a Qwen chat with a system turn that lists the calculator in the Hermes format (Qwen2.5's
`# Tools` text, what `HermesFormat.prompt_with_tools` renders), then the question. A tool trajectory is

    <tool_call>\\n{"name": "calculator", "arguments": {"expression": "A*B"}}\\n</tool_call>      (the policy)
    <|im_end|>\\n<|im_start|>user\\n<tool_response>\\nP\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n   (tool)
    P<|im_end|>                                                                               (the policy)

and a direct answer is `P<|im_end|>`. `build_quickstart_tools_policy(out_dir, seed)` trains a byte-level BPE on the
task's text (the chat and tool markers are single tokens, digits too), initialises a random Qwen2ForCausalLM and
fine-tunes it (SFT) on transcripts of which a fraction `SFT["tool_share"]` call the tool and the rest answer
directly (right products the model cannot learn, so its direct answers stay wrong). The loss covers the policy's
tokens only; the tool turn is context, as in the RL step. The first `SFT["bare_steps"]` steps show the problems
without the system turn (copying forms much faster without 210 tokens of tool listing in front, and carries over:
the distances it copies across are the same); after them SFT stops once the validation loss of the tool
transcripts' copying (every policy token of a tool transcript but its first, `<tool_call>`) reaches
`SFT["target_loss"]`. The warm policy then writes well-formed calls when it calls, and calls about as often as SFT
showed it (a quarter of the time: the start's accuracy); RL has to raise that rate. `multiplication_reward` scores
the final answer.

Held-out problems: `eval_problems()` (the trainer's eval set) and `validation_problems()` (SFT's stopping set) are
the same for every run seed; neither SFT nor the RL train file ever contains them.
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import shutil
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..data import format_qwen_chat
from ..rewards.base import Completion, completion_text, references
from ..rewards.registry import register_reward
from .operand_pairs import OperandPairs
from .quickstart import answer_text

if TYPE_CHECKING:  # numpy and paddle are imported where used: this module's import stays light
    import numpy as np
    import paddle
    from paddlenlp.transformers import PretrainedTokenizer

Problem = Tuple[int, int]  # (a, b) of `What is a*b?`

logger = logging.getLogger("paddle_grpo.recipes.quickstart_tools")

A_RANGE, B_RANGE = (100, 999), (10, 99)
EVAL_SEED, VALIDATION_SEED = 0, 1   # the held-out sets are the same for every run seed
EVAL_SIZE = 500
TOOL = "calculator"
# The tool-call markers are single tokens, registered as Qwen2.5's vocabulary has them (added, not special), so the
# call-end marker can stop a turn; `<|im_start|>` and `<|im_end|>` are single tokens too (tiny.SPECIAL_TOKENS).
MARKERS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")

MODEL = dict(hidden_size=128, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
             max_position_embeddings=512)
SFT = dict(bare_steps=250, max_steps=1000, target_loss=0.03, tool_share=0.25, batch_size=64, learning_rate=1e-3,
           warmup_steps=20, weight_decay=0.0, val_size=128, check_every=25, vocab_size=500)
BUILD_INFO = "build_info.json"


# ------------------------------------------------------------------------------------------------ the task's text

def question(a: int, b: int) -> str:
    return f"What is {a}*{b}?"


def expression(a: int, b: int) -> str:
    return f"{a}*{b}"


def tool_schema() -> Dict[str, Any]:
    """The calculator's function schema, as the tool registry builds it from the function."""
    from ..environment import get_tool

    return get_tool(TOOL).schema


def _format():
    from ..environment import HermesFormat

    return HermesFormat()


def prompt(a: int, b: int) -> str:
    """The templated prompt (`src`) the trainer feeds verbatim: `HermesFormat.prompt_with_tools` of the question, a
    system turn listing the calculator as Qwen2.5's template does (no chat template in this tokenizer), the user
    turn, then the assistant turn opened."""
    return _format().prompt_with_tools(question(a, b), None, [tool_schema()])


def system_turn() -> str:
    """The prompts' common beginning: the system turn, up to the user turn."""
    text = prompt(A_RANGE[0], B_RANGE[0])
    return text[:text.index("<|im_start|>user")]


def call_text(a: int, b: int) -> str:
    """The policy's tool call (Hermes): ends at the call-end marker, where the rollout stops the turn."""
    fmt = _format()
    return f"{fmt.call_start}\n" + json.dumps({"name": TOOL, "arguments": {"expression": expression(a, b)}}) + \
        f"\n{fmt.call_end}"


def tool_turn_text(result: str) -> str:
    """What the format appends after a call (`HermesFormat.tool_turn_text`): closes the assistant turn, the tool's
    answer as a user turn, opens the next assistant turn."""
    from ..environment import ToolResult

    return _format().tool_turn_text([ToolResult(TOOL, result)], ended_by_call_end=True)


def transcript(a: int, b: int, use_tool: bool) -> List[Tuple[str, bool]]:
    """The assistant's side of a solved problem as (text, is_policy_text) pieces; EOS is added by `encode`."""
    answer = str(a * b)
    if use_tool:
        return [(call_text(a, b), True), (tool_turn_text(answer), False), (answer, True)]
    return [(answer, True)]


# ---------------------------------------------------------------------------------------------------- problems

_PAIRS = OperandPairs(A_RANGE, B_RANGE, EVAL_SEED, VALIDATION_SEED)


def eval_problems(n: int = EVAL_SIZE) -> List[Problem]:
    """The fixed held-out problems: `n` distinct (a, b) pairs, the same for every run."""
    return _PAIRS.eval_problems(n)


def validation_problems() -> List[Problem]:
    """SFT's own held-out problems (it stops on their loss): fixed, distinct, disjoint from `eval_problems()`."""
    return _PAIRS.validation_problems(SFT["val_size"], EVAL_SIZE)


def train_problems(n: int, seed: int) -> List[Problem]:
    """`n` problems drawn with `seed` (repeats allowed), never one of the eval or validation problems."""
    return _PAIRS.train_problems(n, seed, set(eval_problems()) | set(validation_problems()))


def record(a: int, b: int) -> Dict[str, Any]:
    """A src/tgt dataset row for the trainer."""
    return {"src": prompt(a, b), "tgt": str(a * b)}


@register_reward("quickstart_multiplication", max_score=1.0, extract_answer=answer_text)
def multiplication_reward(prompts: Sequence[Any], completions: Sequence[Completion],
                          tgt: Optional[Sequence[Any]] = None, turns: Optional[Sequence[Any]] = None,
                          **kwargs: Any) -> List[float]:
    """1.0 when the final answer (the last assistant turn's content, surrounding whitespace ignored) is exactly the
    product, else 0.0. `turns` (the trajectory) is not needed: a right answer counts with or without the tool."""
    refs = references(tgt, completions, "quickstart_multiplication")
    return [1.0 if completion_text(c).strip() == str(r).strip() else 0.0 for c, r in zip(completions, refs)]


# ------------------------------------------------------------------------------------------------------ building

class _DigitwiseEncoder:
    """Token ids of task texts without re-running the (slow, pure-Python) BPE on each new problem.

    The Qwen2 pre-tokenizer makes every digit a token of its own, so a text's ids are those of the text between
    its digits, encoded once per distinct stretch and cached, with the digits' ids in between. `check(texts)`
    compares that with `tokenize_prompts` (how the trainer encodes prompts and the tool environment its tool
    turns), so a tokenizer that merges
    differently fails loudly instead of training on other ids than the trainer feeds."""

    def __init__(self, tokenizer):
        self.tokenizer, self.cache = tokenizer, {}
        self.digits = {d: self._plain(d) for d in "0123456789"}
        if any(len(ids) != 1 for ids in self.digits.values()):
            raise ValueError("quickstart_tools: the tokenizer does not encode each digit as one token")

    def _plain(self, text):
        from ..data import tokenize_prompts

        if text not in self.cache:
            self.cache[text] = tokenize_prompts(self.tokenizer, [text])[0]
        return self.cache[text]

    def __call__(self, text: str) -> List[int]:
        out = []
        for i, part in enumerate(re.split(r"(\d)", text)):
            out += self.digits[part] if i % 2 else self._plain(part) if part else []
        return out

    def check(self, texts: Sequence[str]) -> None:
        from ..data import tokenize_prompts

        if [self(t) for t in texts] != tokenize_prompts(self.tokenizer, list(texts)):
            raise ValueError("quickstart_tools: encoding the text between digits separately changed the token ids; "
                             "the tokenizer does not split at digits as Qwen2's does")


def encode(tokenizer: PretrainedTokenizer, problems: Sequence[Problem], use_tool: Sequence[bool],
           listed: bool = True) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """SFT rows, numpy int64: the system turn's ids and mask [n, S] (the same in every row), then [n, T]: the rest
    of the prompt followed by the transcript (right-padded), its token mask (every token that exists: the
    attention mask) and its policy mask (the tokens SFT learns: calls and answers with EOS; not the prompt, not
    the tool turn). System turn + rest of the prompt are the trainer's prompt ids (`tokenize_prompts`); each piece
    of a transcript is encoded separately, as the rollout makes it (the policy's tokens, then the tool turn's).
    The system turn is [n, S] rather than part of each row because the lean forward computes identical prompt rows
    once: with the ~230-token tool preamble in every row SFT would cost several times more.
    `listed=False`: the prompts without the system turn (only the user turn; `<|im_start|>` is then the shared
    column), for SFT's first steps (`build_quickstart_tools_policy`)."""
    import numpy as np

    enc = _DigitwiseEncoder(tokenizer)
    sample = list(problems[:16])
    enc.check([prompt(a, b) for a, b in sample] +
              [text for a, b in sample for tool in (True, False) for text, _ in transcript(a, b, tool)])
    head_text = system_turn() if listed else "<|im_start|>"
    head = enc(head_text)
    rows = []
    for (a, b), tool in zip(problems, use_tool):
        text = prompt(a, b) if listed else format_qwen_chat(question(a, b), system=None)
        rest = enc(text[len(head_text):])
        toks, policy = list(rest), [0] * len(rest)
        for text, is_policy in transcript(a, b, tool):
            ids = enc(text)
            toks += ids
            policy += [int(is_policy)] * len(ids)
        rows.append((toks + [tokenizer.eos_token_id], policy + [1]))
    T = max((len(t) for t, _ in rows), default=1)
    pid = np.tile(np.asarray(head, dtype="int64"), (len(problems), 1))
    pm = np.ones_like(pid)
    cid = np.full((len(problems), T), tokenizer.pad_token_id, dtype="int64")
    cm, am = np.zeros_like(cid), np.zeros_like(cid)
    for i, (c, policy) in enumerate(rows):
        cid[i, :len(c)], cm[i, :len(c)], am[i, :len(c)] = c, 1, policy
    return pid, pm, cid, cm, am


def sft_loss(model: paddle.nn.Layer, batch: Sequence[np.ndarray], skip_first: bool = False) -> paddle.Tensor:
    """Mean negative log-likelihood per policy token of an `encode` batch (prompt and tool turn masked), through
    the same `completion_logprobs` the RL loss uses; `skip_first` leaves out each transcript's first token (the
    choice between calling and answering). A scalar paddle tensor."""
    import paddle

    from ..policy.causal import completion_logprobs

    pid, pm, cid, cm, am = (paddle.to_tensor(x) for x in batch)
    lp, _ = completion_logprobs(model, pid, pm, cid, cm)
    mask = am.astype("float32")
    if skip_first:  # drop each row's first policy token: cumsum of the policy mask is 1 there
        mask = mask * (paddle.cumsum(mask, axis=1) > 1).astype("float32")
    return -(lp * mask).sum() / mask.sum()


def build_quickstart_tools_policy(out_dir: str, seed: int = 0, *, max_steps: Optional[int] = None,
                                  target_loss: Optional[float] = None, tool_share: Optional[float] = None,
                                  model_kwargs: Optional[Dict[str, Any]] = None,
                                  callback: Optional[Callable[[int, paddle.nn.Layer, float], Any]] = None,
                                  progress: bool = True) -> Dict[str, Any]:
    """Build the tool quickstart's policy (tokenizer + briefly SFT'd tiny Qwen2) in `out_dir`; returns SFT
    statistics.

    Each SFT example is a tool transcript with probability `tool_share` (drawn with `seed`), else a direct answer.
    SFT runs until the copying loss of the tool transcripts of `validation_problems()` falls to `target_loss`, or
    for `max_steps` steps. `callback(step, model, val_loss)` is called at every check (experiments); `progress`: a
    tqdm bar (else a log line per check). Written under a temporary name and renamed at the end, so an interrupted
    build never leaves a half-made policy. Returns, and writes to `out_dir/build_info.json`: "seed", "tool_share",
    "loss_init" and "loss_final" (validation copying loss before/after), "sft_steps", "target_loss", "seconds".
    """
    import paddle

    from tqdm.auto import tqdm

    from .. import cpu_tuning
    from ..policy import load_tokenizer, quiet_paddlenlp
    from .tiny import build_model, build_tokenizer

    quiet_paddlenlp()
    cpu_tuning.apply()
    t0 = time.perf_counter()
    max_steps = SFT["max_steps"] if max_steps is None else int(max_steps)
    target = SFT["target_loss"] if target_loss is None else float(target_loss)
    share = SFT["tool_share"] if tool_share is None else float(tool_share)
    bs, lr = SFT["batch_size"], SFT["learning_rate"]
    tmp = out_dir.rstrip("/") + ".building"
    shutil.rmtree(tmp, ignore_errors=True)

    problems = train_problems(max_steps * bs, seed=seed)
    rng = random.Random(seed)
    use_tool = [rng.random() < share for _ in problems]
    # The tokenizer only needs the task's characters and words: both kinds of transcript, a slice of the data.
    corpus = [prompt(a, b) + "".join(t for t, _ in transcript(a, b, tool)) + "<|im_end|>"
              for (a, b), tool in zip(problems[:2000], [True, False] * 1000)]
    build_tokenizer(corpus, tmp, vocab_size=SFT["vocab_size"], added_tokens=MARKERS)
    tokenizer = load_tokenizer(tmp)  # as the trainer loads it (markers kept whole)
    model = build_model(tmp, tokenizer, seed=seed, **{**MODEL, **(model_kwargs or {})})
    # The first `bare_steps` steps show the problems without the system turn: with the 210 tokens of the tool
    # listing in front, the attention that copies the operands (at fixed distances back) took far longer to form
    # (measured: no copying after 400 steps); the distances are the same without it, so the skill carries over.
    bare = min(SFT["bare_steps"], max_steps)
    data_bare = encode(tokenizer, problems[:bare * bs], use_tool[:bare * bs], listed=False)
    data = encode(tokenizer, problems[bare * bs:], use_tool[bare * bs:])
    val = validation_problems()
    val_batch = encode(tokenizer, val, [True] * len(val))

    def val_loss():
        model.eval()
        with paddle.no_grad():
            value = float(sft_loss(model, val_batch, skip_first=True))
        model.train()
        return value

    paddle.seed(seed)
    warmup = min(SFT["warmup_steps"], max(1, max_steps // 10))
    schedule = paddle.optimizer.lr.LambdaDecay(lr, lambda s: (s + 1) / warmup if s < warmup else
                                               0.1 + 0.45 * (1 + math.cos(math.pi * (s - warmup) /
                                                                            max(1, max_steps - warmup))))
    opt = paddle.optimizer.AdamW(learning_rate=schedule, parameters=model.parameters(),
                                 weight_decay=SFT["weight_decay"], grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    loss_init = loss_now = val_loss()
    step = 0
    model.train()
    bar = tqdm(total=max_steps, desc=f"SFT until tool-call loss <= {target:g}", unit="step", dynamic_ncols=True,
               disable=not progress)
    bar.set_postfix(val_loss=f"{loss_now:.3f}")
    while step < max_steps and (step < bare or loss_now > target):
        first = step * bs
        source, first = (data_bare, first) if step < bare else (data, first - bare * bs)
        loss = sft_loss(model, tuple(x[first:first + bs] for x in source))
        loss.backward()
        opt.step()
        opt.clear_grad()
        schedule.step()
        step += 1
        bar.update(1)
        if step % SFT["check_every"] == 0 or step == max_steps:
            loss_now = val_loss()
            if callback is not None:
                callback(step, model, loss_now)
            bar.set_postfix(train_loss=f"{float(loss):.3f}", val_loss=f"{loss_now:.3f}")
            if not progress:
                logger.info("quickstart_tools SFT step %d: train loss %.3f, tool-call validation loss %.3f (%.0f s)",
                            step, float(loss), loss_now, time.perf_counter() - t0)
    bar.close()
    model.eval()
    model.save_pretrained(tmp)
    stats = {"seed": seed, "tool_share": share, "loss_init": loss_init, "loss_final": loss_now, "sft_steps": step,
             "target_loss": target, "seconds": time.perf_counter() - t0}
    with open(os.path.join(tmp, BUILD_INFO), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
    os.replace(tmp, out_dir)
    logger.info("quickstart_tools policy built (%d SFT steps, tool-call validation loss %.3f -> %.3f, %.0f s)", step,
                loss_init, loss_now, stats["seconds"])
    return stats
