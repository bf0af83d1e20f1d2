"""Held-out accuracy of a policy on the SmolLM2 tool recipe's problems, with the calculator and without it.

    python tools/eval/smollm2_tools_baseline.py [--model DIR] [--prompt tools|tools_examples|tools_qwen|plain] \\
        [--n 200] [--seed 0] [--out FILE.json] [--key NAME]

Samples one completion per held-out problem (data/smollm2_tools/eval.jsonl) at the recipe's temperature, through the
trainer's own rollout (`paddle_grpo.step.rollout`: the multi-turn loop with the calculator when the prompt lists it)
and scores it with the recipe's reward. `--prompt`: `tools` (the recipe's `src`: a short note on the calculator in
the system turn), `tools_qwen` (the tool listing of Qwen2.5's template instead), `..._examples` (two worked examples
as chat turns before the question), `plain` (no tools: the `*_plain.jsonl` prompt). Prints and
stores accuracy, tool-use rate (samples with >= 1 call), accuracy with / without a call, tool-error rate (calls whose
result is an error), turns per sample, tokens per sample, wall seconds, the load average, and a few transcripts.
`--out` merges the result under `--key` (default: the prompt's name) into a JSON file, keeping the other keys.
The decoding settings are those of configs/smollm2_tools.yaml (`--set key=value` overrides one).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from typing import Any, Dict, List, Optional

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

CONFIG = os.path.join(_REPO, "configs", "smollm2_tools.yaml")
PROMPTS = ("tools", "tools_examples", "tools_qwen", "tools_qwen_examples", "plain")


def _records(path: str, prompt: str, n: int) -> List[Dict[str, Any]]:
    from paddle_grpo.data import read_jsonl
    from paddle_grpo.recipes.smollm2_tools import plain_prompt, prompt as tools_prompt

    rows = read_jsonl(path)[:n]
    for r in rows:
        if prompt == "plain":
            r["src"] = plain_prompt(r["a"], r["b"], r["phrasing"])
        elif prompt != "tools":
            r["src"] = tools_prompt(r["a"], r["b"], r["phrasing"], listing="qwen" if "qwen" in prompt else "short",
                                    examples=prompt.endswith("examples"))
    return rows


def _summary(turns: List[List[dict]], correct: List[bool], tokens: List[int], tgt: List[str]) -> Dict[str, Any]:
    """The metrics of one evaluation; a "right call" is a sample one of whose tool results is the product."""
    calls = [[c for m in t if m.get("role") == "assistant" for c in (m.get("tool_calls") or [])] for t in turns]
    results = [m for t in turns for m in t if m.get("role") == "tool"]
    used = [bool(c) for c in calls]
    n = max(len(correct), 1)

    def share(rows: List[bool]) -> Optional[float]:
        picked = [ok for ok, u in zip(correct, used) if u == rows]
        return sum(picked) / len(picked) if picked else None

    return {"accuracy": sum(correct) / n, "tool_use_rate": sum(used) / n,
            "accuracy_with_tool_call": share(True), "accuracy_without_tool_call": share(False),
            "tool_calls_per_sample": sum(len(c) for c in calls) / n,
            "tool_error_rate": (sum(m.get("error") is not None for m in results) / len(results)) if results else None,
            "right_call_rate": sum(any(m.get("role") == "tool" and str(m.get("content")).strip() == t for m in row)
                                   for row, t in zip(turns, tgt)) / n,
            "turns_per_sample": sum(sum(m.get("role") == "assistant" for m in t) for t in turns) / n,
            "tokens_per_sample": sum(tokens) / n}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="build/models/smollm2-135m-instruct",
                        help="policy directory (default: the imported, untrained model)")
    parser.add_argument("--prompt", choices=PROMPTS, default="tools")
    parser.add_argument("--data", default=os.path.join(_REPO, "data", "smollm2_tools", "eval.jsonl"))
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (each row's keys derive from it)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    parser.add_argument("--out", default=None)
    parser.add_argument("--key", default=None)
    parser.add_argument("--show", type=int, default=4, help="transcripts printed")
    args = parser.parse_args(argv)

    import numpy as np

    from paddle_grpo import step
    from paddle_grpo.step.collection import completion_extent
    from paddle_grpo.config import load_config
    from paddle_grpo.policy import load_policy, load_tokenizer
    from paddle_grpo.recipes.smollm2_tools import final_answer_reward
    from paddle_grpo.rollout.sampling import row_keys

    overrides = [f"--{kv.split('=', 1)[0]}={kv.split('=', 1)[1]}" for kv in args.set]
    overrides += [f"--actor_model_name_or_path={args.model}", "--build_actor_if_missing="]
    if args.prompt == "plain":
        overrides.append("--tools=")
    cfg = load_config(CONFIG, overrides, warn=False)
    records = _records(args.data, args.prompt, args.n)
    tokenizer = load_tokenizer(cfg.actor_model_name_or_path)
    policy = load_policy(cfg.actor_model_name_or_path, trainable=False)
    tools = step.build_tools(cfg, tokenizer, policy)
    encode = step.PromptEncoder(policy, tokenizer, cfg.chat_template, cfg.max_prompt_len, tools)
    turns: List[List[dict]] = []
    texts: List[str] = []
    tokens: List[int] = []
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    for s in range(0, len(records), cfg.per_device_eval_batch_size):
        idx = list(range(s, min(s + cfg.per_device_eval_batch_size, len(records))))
        sampled = step.rollout(policy, encode, cfg, records, idx, 1, do_sample=True,
                               keys=row_keys(args.seed, 0, np.asarray(idx)))
        batch_texts = step.completion_texts(tokenizer, sampled)
        texts += batch_texts
        tokens += completion_extent(sampled).sum(1).astype(int).tolist()
        if sampled.turns is not None:
            turns += sampled.turns
        else:
            turns += [[{"role": "assistant", "content": t, "tool_calls": []}] for t in batch_texts]
        print(f"{len(texts)}/{len(records)} sampled, {time.perf_counter() - t0:.0f} s", flush=True)
    seconds = time.perf_counter() - t0
    tgt = [r["tgt"] for r in records]
    correct = [s == 1.0 for s in final_answer_reward([r["src"] for r in records], texts, tgt=tgt)]
    result = {"model": cfg.actor_model_name_or_path, "prompt": args.prompt, "problems": len(records),
              "seed": args.seed, "temperature": cfg.temperature, "max_dec_len": cfg.max_dec_len,
              "max_turns": cfg.max_turns if tools is not None else 1, **_summary(turns, correct, tokens, tgt),
              "wall_s": round(seconds, 1), "threads": os.environ.get("OMP_NUM_THREADS", ""),
              "load_average_start": [round(x, 2) for x in load0],
              "load_average_end": [round(x, 2) for x in os.getloadavg()], "cpu": platform.processor() or "",
              "transcripts": [{"tgt": t, "correct": c, "turns": tr} for t, c, tr in
                              list(zip(tgt, correct, turns))[:max(args.show, 8)]]}
    for key, value in result.items():
        if key != "transcripts":
            print(f"{key}: {value}")
    for t in result["transcripts"][:args.show]:
        print("---", "right" if t["correct"] else "wrong", t["tgt"])
        print(json.dumps(t["turns"], ensure_ascii=False, indent=None)[:1200])
    if args.out:
        data = {}
        if os.path.exists(args.out):
            with open(args.out, encoding="utf-8") as f:
                data = json.load(f)
        data[args.key or args.prompt] = result
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1, ensure_ascii=False)
            f.write("\n")
    if tools is not None:
        tools.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
