"""The SmolLM2 tool recipe's warm start: a short supervised fine-tuning that shows the calculator's call format.

Untrained, SmolLM2-135M-Instruct never calls the calculator of its prompt, and with worked examples it calls in
malformed ways (docs/smollm2_tools.md has the numbers), so GRPO would see no reward. As the tool quickstart builds its
policy (and DeepSeek-R1 cold-starts), `build_smollm2_tools_policy` fine-tunes the imported model on transcripts of
training problems (`split_problems()`'s training side; the held-out problems are never shown): with probability
`WARM["tool_share"]` the tool transcript

    <tool_call>\\n{"name": "calculator", "arguments": {"expression": "A*B"}}\\n</tool_call><|im_end|>     (policy)
    \\n<|im_start|>user\\n<tool_response>\\nP\\n</tool_response><|im_end|>\\n<|im_start|>assistant\\n    (tool turn)
    The answer is P.<|im_end|>                                                                         (policy)

else a direct answer `The answer is P.<|im_end|>` (the right product, which 135 M parameters cannot learn to
compute from a few hundred examples: its direct answers stay wrong). So the warm model writes well-formed calls
when it calls, about as often as the transcripts did, and RL has to raise that rate. The loss covers the policy's
tokens only (the tool turn is context, as in the RL step); the prompt's system turn, the same in every row, is the
rows' shared prompt (computed once per batch by the lean forward). The directory gets the weights, the imported
model's tokenizer and `build_info.json` (steps, losses, seconds).
"""
from __future__ import annotations

import json
import logging
import math
import os
import random
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from .smollm2_tools import IMPORT_COMMAND, MODEL_DIR, Problem, call_text, prompt, split_problems, tool_turn_text

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger("paddle_grpo.recipes.smollm2_tools_warm")

WARM = dict(tool_share=0.25, max_steps=40, batch_size=8, learning_rate=1e-4, warmup_steps=3, val_size=16,
            check_every=10, target_loss=0.02)
BUILD_INFO = "build_info.json"
EOS = "<|im_end|>"


def transcript(problem: Problem, use_tool: bool) -> List[Tuple[str, bool]]:
    """The assistant's side of a solved problem as (text, is_policy_text) pieces, the EOS of each turn included."""
    a, b, _ = problem
    answer = f"The answer is {a * b}.{EOS}"
    if not use_tool:
        return [(answer, True)]
    return [(call_text(f"{a}*{b}") + EOS, True), (tool_turn_text(str(a * b)), False), (answer, True)]


def _ids(tokenizer: Any, text: str, is_policy: bool) -> List[int]:
    """A piece's tokens as the rollout has them: the policy's text tokenized like a prompt (its `<|im_end|>` the
    EOS id), a tool turn as the environment tokenizes it (the format's text cut at special tokens)."""
    from ..data import tokenize_prompts
    from ..environment.executor import tool_turn_ids

    return tokenize_prompts(tokenizer, [text])[0] if is_policy else tool_turn_ids(tokenizer, [(text, False)])


def encode(tokenizer: Any, problems: Sequence[Problem],
           use_tool: Sequence[bool]) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """SFT rows (numpy int64) in `quickstart_tools.sft_loss`'s layout: the system turn's ids and mask [n, S] (the same
    in every row), then [n, T]: the rest of the prompt and the transcript (right-padded), the token mask and the
    policy mask (the tokens SFT learns). System turn + rest are the prompt's ids as the trainer tokenizes it (checked
    on the first row: a tokenizer that merges across the cut fails loudly)."""
    import numpy as np

    from ..data import tokenize_prompts

    first = prompt(*problems[0])
    head_text = first[:first.index("<|im_start|>user")]
    head = tokenize_prompts(tokenizer, [head_text])[0]
    rows = []
    for problem, tool in zip(problems, use_tool):
        text = prompt(*problem)
        rest = tokenize_prompts(tokenizer, [text[len(head_text):]])[0]
        if len(rows) == 0 and head + rest != tokenize_prompts(tokenizer, [text])[0]:
            raise ValueError("smollm2_tools warm start: the prompt's tokens change when cut after the system turn")
        toks, policy = list(rest), [0] * len(rest)
        for piece, is_policy in transcript(problem, tool):
            ids = _ids(tokenizer, piece, is_policy)
            toks += ids
            policy += [int(is_policy)] * len(ids)
        rows.append((toks, policy))
    width = max(len(t) for t, _ in rows)
    pid = np.tile(np.asarray(head, dtype="int64"), (len(rows), 1))
    cid = np.full((len(rows), width), tokenizer.pad_token_id, dtype="int64")
    cm, am = np.zeros_like(cid), np.zeros_like(cid)
    for i, (toks, policy) in enumerate(rows):
        cid[i, :len(toks)], cm[i, :len(toks)], am[i, :len(toks)] = toks, 1, policy
    return pid, np.ones_like(pid), cid, cm, am


def sft_plan(seed: int, steps: int, batch_size: int, tool_share: float,
             val_size: int) -> Tuple[List[Problem], List[bool], List[Problem]]:
    """(problems, use_tool, validation problems): `steps * batch_size` training problems drawn with `seed` from the
    training side (repeats allowed), each a tool transcript with probability `tool_share`; the validation problems
    are the training side's last `val_size`, never drawn for SFT."""
    train, _ = split_problems()
    pool, val = train[:-val_size], train[-val_size:]
    rng = random.Random(seed)
    problems = [rng.choice(pool) for _ in range(steps * batch_size)]
    return problems, [rng.random() < tool_share for _ in problems], val


def build_smollm2_tools_policy(out_dir: str, seed: int = 0, *, base: str = MODEL_DIR, progress: bool = False,
                               max_steps: Optional[int] = None, tool_share: Optional[float] = None) -> Dict[str, Any]:
    """Fine-tune the imported SmolLM2 at `base` on the recipe's transcripts (module docstring) and write it to
    `out_dir`. SFT stops after `max_steps` (default WARM's) or once the validation loss of the tool transcripts'
    copying (every policy token of a tool transcript but its first) reaches WARM["target_loss"], checked every
    WARM["check_every"] steps. Returns, and writes to `out_dir/build_info.json`: seed, tool_share, steps, the
    validation loss before and after, seconds (wall) and cpu_seconds (this process's CPU time: on a shared machine
    the wall time says more about the other jobs)."""
    import paddle

    from .. import cpu_tuning
    from ..policy import load_policy, load_tokenizer, quiet_paddlenlp
    from .quickstart_tools import sft_loss

    if not os.path.isdir(base):
        raise FileNotFoundError(f"the SmolLM2 tool recipe's warm start needs the imported model at {base}; "
                                f"import it once with: {IMPORT_COMMAND}")
    quiet_paddlenlp()
    cpu_tuning.apply()
    t0, cpu0 = time.perf_counter(), time.process_time()
    steps = WARM["max_steps"] if max_steps is None else int(max_steps)
    share = WARM["tool_share"] if tool_share is None else float(tool_share)
    bs = WARM["batch_size"]
    tokenizer = load_tokenizer(base)
    policy = load_policy(base)
    model = policy.model
    problems, use_tool, val = sft_plan(seed, steps, bs, share, WARM["val_size"])
    val_batch = encode(tokenizer, val, [True] * len(val))

    def val_loss() -> float:  # Llama has no dropout: the loss is the same in train mode
        with paddle.no_grad():
            return float(sft_loss(model, val_batch, skip_first=True))

    paddle.seed(seed)
    warmup = WARM["warmup_steps"]
    schedule = paddle.optimizer.lr.LambdaDecay(
        WARM["learning_rate"], lambda s: (s + 1) / warmup if s < warmup else
        0.5 * (1 + math.cos(math.pi * (s - warmup) / max(1, steps - warmup))))
    opt = paddle.optimizer.AdamW(learning_rate=schedule, parameters=model.parameters(), weight_decay=0.0,
                                 grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    loss_init = loss_now = val_loss()
    logger.info("smollm2_tools warm start: tool-call validation loss %.3f before SFT", loss_init)
    step, loss = 0, float("nan")
    model.train()
    while step < steps and loss_now > WARM["target_loss"]:
        batch = encode(tokenizer, problems[step * bs:(step + 1) * bs], use_tool[step * bs:(step + 1) * bs])
        value = sft_loss(model, batch)
        value.backward()
        opt.step()
        opt.clear_grad()
        schedule.step()
        step, loss = step + 1, float(value)
        if step % WARM["check_every"] == 0 or step == steps:
            loss_now = val_loss()
            logger.info("smollm2_tools warm start, SFT step %d: train loss %.3f, tool-call validation loss %.3f "
                        "(%.0f s)", step, loss, loss_now, time.perf_counter() - t0)
        elif progress:
            logger.info("smollm2_tools warm start, SFT step %d: train loss %.3f (%.0f s)", step, loss,
                        time.perf_counter() - t0)
    model.eval()
    os.makedirs(out_dir, exist_ok=True)
    policy.save(out_dir)
    tokenizer.save_pretrained(out_dir)
    stats = {"base": base, "seed": seed, "tool_share": share, "sft_steps": step, "batch_size": bs,
             "loss_init": loss_init, "loss_final": loss_now, "seconds": time.perf_counter() - t0,
             "cpu_seconds": time.process_time() - cpu0}
    with open(os.path.join(out_dir, BUILD_INFO), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1)
    logger.info("smollm2_tools warm start built: %d SFT steps, tool-call validation loss %.3f -> %.3f, %.0f s", step,
                loss_init, loss_now, stats["seconds"])
    return stats
