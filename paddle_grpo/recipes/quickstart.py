"""The embedded default's policy: a tiny Qwen2 that half knows addition, made locally in about a minute.

Task: `What is A+B?` with A and B drawn from 10..99, answered with the bare sum (`137`) and `<|im_end|>`.
The prompt is Qwen's chat format without a system turn (17 tokens), the completion 3-4 tokens, so a GRPO step is
cheap on a CPU; digits are single tokens (Qwen2's pre-tokenizer splits numbers into digits).

`build_quickstart_policy(out_dir, seed)` trains a byte-level BPE tokenizer on the task's text, initialises a random
Qwen2ForCausalLM (`paddle_grpo.recipes.tiny`) and fine-tunes it briefly (SFT) on generated problems: cross-entropy on the
answer tokens only (prompt masked), in exactly the chat format the RL prompts use. SFT stops early on purpose, at
partial skill (sampled at temperature 1 the policy gets about half of the held-out sums right, greedy about 70%),
which leaves GRPO room to show learning in minutes. `addition_reward` scores 1.0 for exactly the right sum.

Held-out problems: `eval_problems()` (the trainer's eval set) and `validation_problems()` (SFT's stopping set) are
fixed, whatever the run's seed; neither SFT nor the RL train file ever contains them.
Left out on purpose: other operations, chain-of-thought, and any download.
"""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..data import format_qwen_chat, tokenize_prompts
from ..rewards.base import Completion, completion_text, references
from ..rewards.registry import register_reward
from .operand_pairs import OperandPairs

if TYPE_CHECKING:  # numpy and paddle are imported where used: this module's import stays light
    import numpy as np
    import paddle
    from paddlenlp.transformers import PretrainedTokenizer

Problem = Tuple[int, int]  # (a, b) of `What is a+b?`

logger = logging.getLogger("paddle_grpo.recipes.quickstart")

MIN_OPERAND, MAX_OPERAND = 10, 99
EVAL_SEED, VALIDATION_SEED = 0, 1   # the held-out sets are the same for every run seed
EVAL_SIZE = 1000

# Model and SFT defaults (measured on 2 CPU cores: see docs/quickstart.md).
MODEL = dict(hidden_size=128, intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
             max_position_embeddings=64)
SFT = dict(max_steps=1000, target_loss=0.3, batch_size=64, learning_rate=1e-3, warmup_steps=20, weight_decay=0.0,
           val_size=256, check_every=25)
BUILD_INFO = "build_info.json"      # written into the policy directory: seed, SFT steps, validation losses, time


def question(a: int, b: int) -> str:
    return f"What is {a}+{b}?"


def prompt(a: int, b: int) -> str:
    """The templated prompt (`src`) the trainer feeds verbatim: user turn, then the assistant turn opened."""
    return format_qwen_chat(question(a, b), system=None)


_PAIRS = OperandPairs((MIN_OPERAND, MAX_OPERAND), (MIN_OPERAND, MAX_OPERAND), EVAL_SEED, VALIDATION_SEED)


def eval_problems(n: int = EVAL_SIZE) -> List[Problem]:
    """The fixed held-out problems: `n` distinct (a, b) pairs, the same for every run."""
    return _PAIRS.eval_problems(n)


def validation_problems() -> List[Problem]:
    """SFT's own held-out problems (it stops on their loss): fixed, distinct, disjoint from `eval_problems()`."""
    return _PAIRS.validation_problems(SFT["val_size"], EVAL_SIZE)


def train_problems(n: int, seed: int) -> List[Problem]:
    """`n` problems drawn with `seed` (repeats allowed), never one of the eval or validation problems."""
    return _PAIRS.train_problems(n, seed, set(eval_problems()) | set(validation_problems()))


def record(a: int, b: int) -> Dict[str, str]:
    """A src/tgt dataset row for the trainer."""
    return {"src": prompt(a, b), "tgt": str(a + b)}


def answer_text(prompts: Sequence[Any], completions: Sequence[Completion], **kwargs: Any) -> List[Optional[str]]:
    """The answer `addition_reward` compares: the completion, surrounding whitespace stripped (None when empty);
    its `extract_answer`, for the evaluation's majority vote."""
    return [completion_text(c).strip() or None for c in completions]


@register_reward("quickstart_addition", max_score=1.0, extract_answer=answer_text)
def addition_reward(prompts: Sequence[Any], completions: Sequence[Completion], tgt: Optional[Sequence[Any]] = None,
                    **kwargs: Any) -> List[float]:
    """1.0 when the completion (surrounding whitespace ignored) is exactly the reference sum, else 0.0."""
    refs = references(tgt, completions, "quickstart_addition")
    return [1.0 if completion_text(c).strip() == str(r).strip() else 0.0 for c, r in zip(completions, refs)]


# ------------------------------------------------------------------------------------------------------ building

def encode(tokenizer: PretrainedTokenizer, problems: Sequence[Problem]
           ) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Left-padded prompt ids/mask [n, L] and right-padded answer ids/mask [n, T] (answer + EOS), numpy int64.

    Prompts are tokenized exactly as the trainer does (`tokenize_prompts`); each distinct problem once."""
    import numpy as np

    distinct = sorted(set(problems))
    ids = dict(zip(distinct, tokenize_prompts(tokenizer, [prompt(a, b) for a, b in distinct])))
    sums = sorted({a + b for a, b in distinct})
    answer_ids = {s: tokenizer(str(s), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                  for s in sums}
    prompts, answers = [ids[p] for p in problems], [answer_ids[a + b] for a, b in problems]
    L, T = max(map(len, prompts)), max(map(len, answers))
    pid = np.full((len(problems), L), tokenizer.pad_token_id, dtype="int64")
    pm = np.zeros_like(pid)
    cid = np.full((len(problems), T), tokenizer.pad_token_id, dtype="int64")
    cm = np.zeros_like(cid)
    for i, (p, c) in enumerate(zip(prompts, answers)):
        pid[i, L - len(p):], pm[i, L - len(p):] = p, 1
        cid[i, :len(c)], cm[i, :len(c)] = c, 1
    return pid, pm, cid, cm


def sft_loss(model: paddle.nn.Layer, batch: Sequence[np.ndarray]) -> paddle.Tensor:
    """Mean negative log-likelihood per answer token (prompt tokens masked) of an `encode` batch, through the
    same `completion_logprobs` the RL loss uses. A scalar paddle tensor."""
    import paddle

    from ..policy.causal import completion_logprobs

    pid, pm, cid, cm = (paddle.to_tensor(x) for x in batch)
    lp, _ = completion_logprobs(model, pid, pm, cid, cm)
    mask = cm.astype("float32")
    return -(lp * mask).sum() / mask.sum()


def build_quickstart_policy(out_dir: str, seed: int = 0, *, max_steps: Optional[int] = None,
                            target_loss: Optional[float] = None, batch_size: Optional[int] = None,
                            learning_rate: Optional[float] = None, model_kwargs: Optional[Dict[str, Any]] = None,
                            callback: Optional[Callable[[int, paddle.nn.Layer, float], Any]] = None,
                            progress: bool = True) -> Dict[str, Any]:
    """Build the quickstart policy (tokenizer + briefly SFT'd tiny Qwen2) in `out_dir`; returns SFT statistics.

    SFT runs until the answer-token loss on `validation_problems()` (never trained on, disjoint from the eval
    problems) falls to `target_loss`, or for `max_steps` steps: stopping at a loss rather than after a fixed number
    of steps gives every seed (and every machine) the same partial skill. `callback(step, model, val_loss)` is
    called at every check (experiments). `progress`: a tqdm bar (else a log line per check). The directory is written under a temporary name and renamed at the end,
    so an interrupted build never leaves a half-made policy that a later run would load.
    Returns, and writes to `out_dir/build_info.json`: "seed", "loss_init" and "loss_final" (validation loss
    before/after), "sft_steps", "target_loss" and "seconds".
    """
    import paddle

    from tqdm.auto import tqdm

    from .. import cpu_tuning
    from ..policy import quiet_paddlenlp
    from .tiny import build_model, build_tokenizer

    quiet_paddlenlp()  # PaddleNLP's INFO lines (unk_token, every file saved) are noise before the first step
    cpu_tuning.apply()  # the trainer applies it when it loads the policy; SFT runs before that and gains as much
    t0 = time.perf_counter()
    max_steps = SFT["max_steps"] if max_steps is None else int(max_steps)
    target = SFT["target_loss"] if target_loss is None else float(target_loss)
    bs = SFT["batch_size"] if batch_size is None else int(batch_size)
    lr = SFT["learning_rate"] if learning_rate is None else float(learning_rate)
    tmp = out_dir.rstrip("/") + ".building"
    shutil.rmtree(tmp, ignore_errors=True)

    problems = train_problems(max_steps * bs, seed=seed)
    # The tokenizer only needs the task's characters and words; a slice of the data is plenty.
    corpus = [prompt(a, b) + str(a + b) + "<|im_end|>" for a, b in problems[:2000]]
    tokenizer = build_tokenizer(corpus, tmp, vocab_size=300)
    model = build_model(tmp, tokenizer, seed=seed, **{**MODEL, **(model_kwargs or {})})
    data, val_batch = encode(tokenizer, problems), encode(tokenizer, validation_problems())

    def val_loss():
        model.eval()
        with paddle.no_grad():
            value = float(sft_loss(model, val_batch))
        model.train()
        return value

    paddle.seed(seed)
    warmup = min(SFT["warmup_steps"], max(1, max_steps // 10))
    # Linear warm-up, then cosine decay over the step cap (to 10% of the peak).
    schedule = paddle.optimizer.lr.LambdaDecay(lr, lambda s: (s + 1) / warmup if s < warmup else
                                               0.1 + 0.45 * (1 + math.cos(math.pi * (s - warmup) /
                                                                            max(1, max_steps - warmup))))
    opt = paddle.optimizer.AdamW(learning_rate=schedule, parameters=model.parameters(),
                                 weight_decay=SFT["weight_decay"], grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    loss_init = loss_now = val_loss()
    step = 0
    model.train()
    # The end is a validation loss, not a step count: the bar's total is the cap, its description the rule.
    bar = tqdm(total=max_steps, desc=f"SFT until validation loss <= {target:g}", unit="step", dynamic_ncols=True,
               disable=not progress)
    bar.set_postfix(val_loss=f"{loss_now:.3f}")
    while step < max_steps and loss_now > target:
        rows = slice(step * bs, (step + 1) * bs)
        loss = sft_loss(model, tuple(x[rows] for x in data))
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
                logger.info("quickstart SFT step %d: train loss %.3f, validation loss %.3f (%.0f s)", step,
                            float(loss), loss_now, time.perf_counter() - t0)
    bar.close()
    model.eval()
    model.save_pretrained(tmp)
    stats = {"seed": seed, "loss_init": loss_init, "loss_final": loss_now, "sft_steps": step,
             "target_loss": target, "seconds": time.perf_counter() - t0}
    with open(os.path.join(tmp, BUILD_INFO), "w", encoding="utf-8") as f:  # what SFT did, for tools and users
        json.dump(stats, f, indent=1)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.makedirs(os.path.dirname(os.path.abspath(out_dir)), exist_ok=True)
    os.replace(tmp, out_dir)
    logger.info("quickstart policy built (%d SFT steps, validation loss %.3f -> %.3f, %.0f s)", step, loss_init,
                loss_now, stats["seconds"])
    return stats
