"""Evaluate a saved checkpoint on GSM8K: greedy or sampled answers, exact match under lm-eval's two filters.

    python tools/eval/eval_gsm8k.py --model DIR --data FILE [--limit N] [--batch-size B] [--max-new-tokens T]
        [--chat-template auto|none|qwen] [--temperature T [--seed S]] [--precision float32|bfloat16]
        [--output predictions.jsonl]

DIR is any `save_pretrained` directory with its tokenizer (a `checkpoint-<step>` of run_rl.py or a PaddleNLP
model). FILE is raw GSM8K JSONL (`question`, `answer` ending in `#### N`) or src/tgt JSONL as written by
tools/data/convert_gsm8k.py; a raw question gets exactly the prompt convert_gsm8k.py gives it for training, a `src` is
templated like the trainer does (`--chat-template`, default auto; an already templated prompt is used verbatim).

Scoring follows lm-evaluation-harness's `gsm8k` task (version 3):
- strict-match: the first `#### (-?[0-9.,]+)` in the completion;
- flexible-extract: the last match of `(-?[$0-9.,]{2,})|(-?[0-9]+)`, i.e. roughly the last number (like lm-eval,
  a run of punctuation such as "..." also matches);
- no match gives "[invalid]", which is never correct. Both sides are normalised as lm-eval's `regexes_to_ignore`
  do (drop every "," and "$", everything up to "#### ", one trailing "."; then lower case), and compared as
  strings. Unlike lm-eval, two strings that both parse as decimal numbers are also compared as numbers, so "18.0"
  equals "18" (lm-eval counts it wrong; this can only raise a score).
- exact_match is the mean over problems; its standard error is lm-eval's `mean_stderr`, the sample standard
  deviation (n - 1 denominator) over sqrt(n), which for 0/1 scores is sqrt(p (1 - p) / (n - 1)); "N/A" when n = 1.
The table has lm-eval's markdown layout. Its Version column is this tool's scoring version (1), not lm-eval's
task version: the filters and metric are lm-eval's, the prompt is not (see below), so numbers are comparable to
lm-eval's only as far as the prompts are.

Decoding is greedy unless `--temperature T` is given: then one completion per problem is sampled at temperature T
(no top-k/top-p) by the rollout's counter-based sampler, the trainer's eval_do_sample path: problem i (0-based, in
file order) draws from the key `row_keys(seed, 0, i)`, so a run is reproducible for a fixed `--seed` (default 0)
and does not depend on the batch size.

Left out on purpose: few-shot prompting (n-shot is always 0; lm-eval's default is 5-shot "Question: ...\\nAnswer:"
prompts, here the chat-templated zero-shot prompt the model was trained on), several samples per problem and self-consistency, lm-eval's "Question:" stop string (only useful with few-shot prompts; generation stops at the
tokenizer's/model's EOS and at `<|im_end|>`), and several devices (one process, whatever device paddle picks).
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import re
import sys
import time
from decimal import Decimal

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from paddle_grpo.data import (CHAT_TEMPLATE_MODES, DataError, apply_chat_template, collate_prompts,  # noqa: E402
                              iter_json_lines, special_token_ids, tokenize_prompts, write_jsonl)

TASK, VERSION, N_SHOT, METRIC = "gsm8k", 1, 0, "exact_match"
INVALID = "[invalid]"
STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")               # lm-eval gsm8k "strict-match", first match
FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")     # lm-eval gsm8k "flexible-extract", last match
_IGNORE = [re.compile(p) for p in (r",", r"\$", r"(?s).*#### ", r"\.$")]  # lm-eval's regexes_to_ignore, in order
_DECIMAL = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")
FILTERS = ("flexible-extract", "strict-match")  # lm-eval sorts "metric,filter" keys, so flexible comes first


# ------------------------------------------------------------------------------------------------- scoring

def extract_strict(text):
    found = STRICT.findall(text)
    return found[0].strip() if found else INVALID


def extract_flexible(text):
    found = FLEXIBLE.findall(text)
    if not found:
        return INVALID
    groups = [g for g in found[-1] if g]  # the alternative that matched
    return groups[0].strip() if groups else INVALID


EXTRACT = {"flexible-extract": extract_flexible, "strict-match": extract_strict}


def normalise(text):
    for pattern in _IGNORE:
        text = pattern.sub("", text)
    return text.strip().lower()


def answers_match(extracted, gold):
    """Whether an extracted answer equals the gold answer (both raw; normalised here)."""
    if extracted == INVALID:
        return False
    pred, ref = normalise(extracted), normalise(gold)
    if pred == ref:
        return True
    # Decimal, not float: exact for any length, so "18.0" == "18" but 0.1 + 0.2-style noise cannot creep in.
    return bool(_DECIMAL.fullmatch(pred) and _DECIMAL.fullmatch(ref)) and Decimal(pred) == Decimal(ref)


def mean_stderr(values):
    """lm-eval's mean_stderr: sample std (n - 1) / sqrt(n); None when n < 2 (lm-eval prints N/A)."""
    n = len(values)
    if n < 2:
        return None
    mu = sum(values) / n
    return math.sqrt(sum((x - mu) ** 2 for x in values) / (n - 1) / n)


def score(completion, gold):
    """{filter: (extracted answer, 0/1)} for one completion."""
    out = {}
    for name in FILTERS:
        extracted = EXTRACT[name](completion)
        out[name] = (extracted, int(answers_match(extracted, gold)))
    return out


def aggregate(predictions):
    """{filter: (mean exact_match, stderr or None)} over prediction rows as written to --output."""
    out = {}
    for name in FILTERS:
        values = [row[name]["exact_match"] for row in predictions]
        out[name] = (sum(values) / len(values), mean_stderr(values))
    return out


def format_table(metrics):
    """lm-eval's markdown table (pytablewriter layout: centred headers, numbers right-aligned)."""
    headers = ["Tasks", "Version", "Filter", "n-shot", "Metric", "", "Value", "", "Stderr"]
    right = {1, 3, 6, 8}
    rows = []
    for i, name in enumerate(FILTERS):
        value, stderr = metrics[name]
        rows.append([TASK if i == 0 else "", str(VERSION) if i == 0 else "", name, str(N_SHOT), METRIC, "↑",
                     f"{value:.4f}", "±", "N/A" if stderr is None else f"{stderr:.4f}"])
    widths = [max(3, len(h), *(len(r[c]) for r in rows)) for c, h in enumerate(headers)]

    def centre(text, width):
        left = (width - len(text)) // 2
        return " " * left + text + " " * (width - len(text) - left)

    lines = ["|" + "|".join(centre(h, w) for h, w in zip(headers, widths)) + "|",
             "|" + "|".join("-" * (w - 1) + ":" if c in right else "-" * w for c, w in enumerate(widths)) + "|"]
    for r in rows:
        lines.append("|" + "|".join(cell.rjust(w) if c in right else cell.ljust(w)
                                    for c, (cell, w) in enumerate(zip(r, widths))) + "|")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- data

def _convert_gsm8k():
    """tools/data/convert_gsm8k.py (a script, not a package): its prompt builder and gold-answer parser."""
    name = "_eval_gsm8k_convert_gsm8k"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(_REPO, "tools", "data", "convert_gsm8k.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


def _text(obj, key, where):
    value = obj.get(key)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: key {key!r}: expected a non-empty string or a one-element list of strings, "
                        f"got {value!r:.80}")
    return value


def load_examples(path, limit=None):
    """[{"id", "prompt" (src, untemplated for src/tgt rows), "gold"}] from raw GSM8K or src/tgt JSONL lines."""
    if not os.path.isfile(path):
        raise DataError(f"{path}: data file not found")
    convert = _convert_gsm8k()
    examples = []
    for where, obj in iter_json_lines(path, "one object per line with 'question'/'answer' (GSM8K) or 'src'/'tgt'"):
        if limit is not None and len(examples) >= limit:
            break
        if not isinstance(obj, dict) or not ({"question", "answer", "src", "tgt"} & set(obj)):
            keys = sorted(obj) if isinstance(obj, dict) else type(obj).__name__
            raise DataError(f"{where}: expected 'question'/'answer' (GSM8K) or 'src'/'tgt' keys, got {keys}")
        if "question" in obj or "answer" in obj:
            prompt = convert.build_prompt(_text(obj, "question", where))
            gold = convert.gold_answer(_text(obj, "answer", where), where)
        else:
            prompt, gold = _text(obj, "src", where), _text(obj, "tgt", where)
            if not normalise(gold):
                raise DataError(f"{where}: key 'tgt': {gold!r} has no answer left after normalisation")
        examples.append({"id": str(obj.get("id", os.path.basename(where))), "prompt": prompt,
                         "gold": gold})
    if not examples:
        raise DataError(f"{path}: no records (empty file or only blank lines)")
    return examples


# ---------------------------------------------------------------------------------------------- generation

def stop_token_ids(tokenizer, model):
    """Tokenizer EOS, the model config's EOS id(s), and `<|im_end|>` when the vocabulary has it (the chat turn end;
    lm-eval stops there too)."""
    ids = {tokenizer.eos_token_id}
    config_eos = getattr(model.config, "eos_token_id", None)
    ids.update(config_eos if isinstance(config_eos, (list, tuple)) else [config_eos])
    ids.add(special_token_ids(tokenizer).get("<|im_end|>"))
    return sorted(int(i) for i in ids if i is not None)


def generate_completions(model, tokenizer, prompts, *, batch_size, max_new_tokens, chat_template="auto",
                         temperature=None, seed=0, log=None, precision="float32"):
    """Completions decoded up to (not including) EOS as the trainer does; one dict per prompt. Greedy when
    `temperature` is None, else sampled at that temperature with prompt i's row key `row_keys(seed, 0, i)`.
    `precision`: the decode engine's products (causal.stepper_for)."""
    import numpy as np

    from paddle_grpo.policy.causal import generate, stepper_for
    from paddle_grpo.rollout.sampling import row_keys

    token_ids = tokenize_prompts(tokenizer, [apply_chat_template(p, tokenizer, mode=chat_template) for p in prompts])
    # Longest first, so each batch holds prompts of similar length (less padding); results go back in file order.
    order = sorted(range(len(prompts)), key=lambda i: -len(token_ids[i]))
    eos, pad = stop_token_ids(tokenizer, model), int(tokenizer.pad_token_id)
    out, start = [None] * len(prompts), time.perf_counter()
    for s in range(0, len(order), batch_size):
        batch = order[s:s + batch_size]
        ids, mask = collate_prompts([token_ids[i] for i in batch], pad, None)
        # Keys by file index, not batch position: the sample of a problem is the same whatever the batching.
        sampling = ({"do_sample": False} if temperature is None else
                    {"do_sample": True, "temperature": float(temperature),
                     "row_keys": row_keys(seed, 0, np.asarray(batch, dtype=np.uint64))})
        rollout = generate(model, ids, mask, num_samples=1, max_new_tokens=max_new_tokens, eos_token_ids=eos,
                           pad_token_id=pad, stepper=stepper_for(model, precision), **sampling)
        completion_ids = rollout.completion_ids.numpy()
        for row, i in enumerate(batch):
            n, cut = int(rollout.lengths[row]), bool(rollout.truncated[row])
            keep = completion_ids[row, :n] if cut else completion_ids[row, :max(0, n - 1)]
            text = tokenizer.decode(keep.tolist(), skip_special_tokens=False, clean_up_tokenization_spaces=False)
            out[i] = {"completion": text, "num_tokens": n, "truncated": cut}
        if log:
            log(f"generated {min(s + batch_size, len(order))}/{len(order)} ({time.perf_counter() - start:.1f} s)")
    return out


# ---------------------------------------------------------------------------------------------------- main

def _check_model_dir(path):
    if not os.path.isdir(path):
        raise FileNotFoundError(f"--model: '{path}' is not a directory (give a directory written by save_pretrained, "
                                "e.g. <output_dir>/checkpoint-<step>; models are never downloaded)")
    if not any(os.path.isfile(os.path.join(path, f)) for f in ("config.json", "model_config.json")):
        raise FileNotFoundError(f"--model: '{path}' has no config.json (not a save_pretrained directory)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="save_pretrained directory with model and tokenizer")
    parser.add_argument("--data", required=True, help="GSM8K (question/answer) or src/tgt JSONL")
    parser.add_argument("--limit", type=int, default=None, help="evaluate the first N problems of the file")
    parser.add_argument("--batch-size", type=int, default=8, help="prompts per generation call (default 8)")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="generation budget (default 512)")
    parser.add_argument("--chat-template", choices=CHAT_TEMPLATE_MODES, default="auto",
                        help="templating of untemplated src prompts, as the trainer's chat_template (default auto)")
    parser.add_argument("--temperature", type=float, default=None,
                        help="sample one completion per problem at this temperature (default: greedy)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed with --temperature (default 0)")
    parser.add_argument("--output", default=None, help="write per-problem predictions (JSONL) here")
    parser.add_argument("--precision", choices=("float32", "bfloat16"), default="float32",
                        help="the CPU decode engine's matrix products (rollout_precision's values; default float32): "
                             "bfloat16 is faster on CPUs with AVX512-BF16 or AMX and changes some answers")
    args = parser.parse_args(argv)
    for key in ("limit", "batch_size", "max_new_tokens"):
        if getattr(args, key) is not None and getattr(args, key) < 1:
            parser.error(f"--{key.replace('_', '-')} must be at least 1")
    if args.temperature is not None and not (math.isfinite(args.temperature) and args.temperature > 0):
        parser.error(f"--temperature must be a positive number (leave it out for greedy), got {args.temperature}")

    def log(msg):
        print(f"eval_gsm8k: {msg}", file=sys.stderr, flush=True)

    try:
        examples = load_examples(args.data, args.limit)
        _check_model_dir(args.model)
    except (DataError, FileNotFoundError) as e:
        print(f"eval_gsm8k.py: error: {e}", file=sys.stderr)
        return 2
    from paddle_grpo.policy import load_tokenizer
    from paddle_grpo.policy.causal import load_causal_lm

    tokenizer, model = load_tokenizer(args.model), load_causal_lm(args.model, trainable=False)
    log(f"{len(examples)} problems from {args.data}")
    generated = generate_completions(model, tokenizer, [e["prompt"] for e in examples], batch_size=args.batch_size,
                                     max_new_tokens=args.max_new_tokens, chat_template=args.chat_template,
                                     temperature=args.temperature, seed=args.seed, log=log,
                                     precision=args.precision)
    predictions = []
    for index, (example, gen) in enumerate(zip(examples, generated)):
        scores = score(gen["completion"], example["gold"])
        predictions.append({"index": index, "id": example["id"], "prompt": example["prompt"],
                            "gold": example["gold"], **gen,
                            **{name: {"extracted": x, "exact_match": m} for name, (x, m) in scores.items()}})
    if args.output:
        write_jsonl(args.output, predictions)
        log(f"wrote {len(predictions)} predictions to {args.output}")
    truncated = sum(p["truncated"] for p in predictions)
    print(f"paddle_grpo (model={args.model}), data: {args.data}, n: {len(predictions)}, limit: {args.limit}, "
          f"num_fewshot: {N_SHOT}, batch_size: {args.batch_size}, max_new_tokens: {args.max_new_tokens} "
          f"({truncated} truncated), "
          + ("greedy" if args.temperature is None else f"sampled at temperature {args.temperature}, seed {args.seed}")
          + f", {args.precision} products")
    print(format_table(aggregate(predictions)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
