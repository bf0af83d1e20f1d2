"""A tiny Qwen2 policy that calls tools, for the multi-turn rollout tests: a random model (hidden 64, 2 layers) with
Qwen2.5's `<tool_call>` / `</tool_call>` as single tokens, fine-tuned for a few seconds to memorise one conversation
per prompt, so greedy decoding makes real calls through the real ToolEnvironment:
- "What is 12*34?": calls the built-in calculator, then answers;
- "Look up zeta." / "Look up eta.": call `lookup` (a test tool whose latency the tests set), then answer;
- "Say hi.": answers without a call;
- "Break it.": writes a call that is not JSON (trained on that turn only: the error message is long);
- "Use calc.": calls a tool that does not exist, then apologises.
The tool turns it is trained on are the environment's own tokens (`ToolEnvironment.begin(...).result().ids`), and
only the assistant's tokens are trained (the tool turns are context, as in RL).
"""
from __future__ import annotations

import time
from typing import Dict, List, Tuple

import numpy as np
import paddle

from paddle_grpo.data import tokenize_prompts
from paddle_grpo.environment import HermesFormat, Tool, ToolEnvironment, ToolSet, get_tool

FMT = HermesFormat()
DELAYS: Dict[str, float] = {}  # lookup key -> seconds the lookup sleeps (set by the tests)


def lookup(key: str) -> str:
    """Look a key up in a slow store.

    Args:
        key: the key to look up.
    """
    time.sleep(DELAYS.get(key, 0.0))
    return f"value of {key}"


def call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


# (user question, first assistant turn, final answer or None when the first turn is the answer)
CONVERSATIONS: List[Tuple[str, str, str]] = [
    ("What is 12*34?", call("calculator", '{"expression": "12*34"}'), "The answer is 408."),
    ("Look up zeta.", call("lookup", '{"key": "zeta"}'), "Found zeta."),
    ("Look up eta.", call("lookup", '{"key": "eta"}'), "Found eta."),
    ("Say hi.", "Hi there.", None),
    ("Break it.", '<tool_call>\n{"name": "lookup", "arguments": {"key": \n</tool_call>', None),
    ("Use calc.", call("calc", '{"expression": "1+1"}'), "Sorry."),
]


def prompt_text(question: str) -> str:
    return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"


def tool_set() -> ToolSet:
    return ToolSet([get_tool("calculator"), Tool.from_function(lookup, name="lookup")])


def environment(tokenizer, **kwargs) -> ToolEnvironment:
    return ToolEnvironment(tool_set(), FMT, tokenizer, **kwargs)


def build_tool_policy(out_dir: str, steps: int = 400, seed: int = 0) -> None:
    """Tokenizer + model in `out_dir`, the model fine-tuned until greedy decoding follows every conversation."""
    from paddle_grpo.policy.causal import load_causal_lm
    from paddle_grpo.recipes.tiny import build_model, build_tokenizer

    texts = [prompt_text(q) + a + "<|im_end|>" + (f"\n<|im_start|>user\n<tool_response>\nvalue of x\n"
                                                   f"</tool_response><|im_end|>\n<|im_start|>assistant\n{b}"
                                                   f"<|im_end|>" if b else "")
             for q, a, b in CONVERSATIONS]
    tok = build_tokenizer(texts * 8, out_dir, vocab_size=400, added_tokens=("<tool_call>", "</tool_call>"))
    build_model(out_dir, tok, seed=seed)
    model = load_causal_lm(out_dir)
    seqs, masks = [], []
    with environment(tok) as env:
        for q, a, b in CONVERSATIONS:
            ids = tokenize_prompts(tok, [prompt_text(q)])[0]
            mask = [0] * len(ids)
            first = tokenize_prompts(tok, [a])[0]
            first += [] if b is not None and first[-1] in env.stop_token_ids() else [tok.eos_token_id]
            ids, mask = ids + first, mask + [1] * len(first)
            if b is not None:
                tool = env.begin(first, ended_by_call_end=first[-1] in env.stop_token_ids()).result().ids
                answer = tokenize_prompts(tok, [b])[0] + [tok.eos_token_id]
                ids, mask = ids + tool + answer, mask + [0] * len(tool) + [1] * len(answer)
            seqs.append(ids)
            masks.append(mask)
    T = max(map(len, seqs))
    x = paddle.to_tensor(np.array([s + [tok.pad_token_id] * (T - len(s)) for s in seqs], dtype="int64"))
    attn = paddle.to_tensor(np.array([[1] * len(s) + [0] * (T - len(s)) for s in seqs], dtype="int64"))
    target = np.array([s[1:] + [tok.pad_token_id] * (T - len(s) + 1) for s in seqs], dtype="int64")
    weight = np.array([m[1:] + [0] * (T - len(m) + 1) for m in masks], dtype="float32")
    target_t, weight_t = paddle.to_tensor(target), paddle.to_tensor(weight)
    paddle.seed(seed)
    opt = paddle.optimizer.AdamW(learning_rate=3e-3, parameters=model.parameters(), weight_decay=0.0)
    for step in range(steps):
        logits = model(x, attention_mask=attn, return_dict=True).logits
        nll = paddle.nn.functional.cross_entropy(logits, target_t.unsqueeze(-1), reduction="none").squeeze(-1)
        loss = (nll * weight_t).sum() / weight_t.sum()
        loss.backward()
        opt.step()
        opt.clear_grad()
        if step % 10 == 9:
            hits = (logits.argmax(axis=-1).numpy() == target) | (weight == 0)
            if hits.all():
                break
    model.eval()
    model.save_pretrained(out_dir)
