"""The PyTorch peer of tools/bench/bench.py: TRL's GRPOTrainer on a random Qwen2 of a SHAPE.json's sizes.

    python -m venv .peer-venv && PADDLE_GRPO_PEER_ONLY=1 .peer-venv/bin/pip install -e ".[peer]"   # once
    .peer-venv/bin/python tools/bench/trl_bench.py --shape tools/bench/shapes/default.json [--threads 2] \
        [--set KEY=VALUE]
    .peer-venv/bin/python tools/bench/trl_bench.py --model build/models/smollm2-135m-instruct-hf \
        --shape tools/bench/shapes/smollm2.json                 # a real model (a transformers checkpoint)

Runs in its own virtual environment (setup.py's `peer` extra: torch 2.13.0 and TRL 1.16.0, which cannot share one
with paddlenlp, and PADDLE_GRPO_PEER_ONLY=1 leaves the project's own requirements out). Takes the same SHAPE.json
files as tools/bench/bench.py (tools/bench/shapes/*.json, tools/bench/shapes/peer/*.json: model sizes, prompt and
completion lengths, prompts per step, group size, beta, warm-up and timed steps) and builds, in a temporary directory
and without any download:
- the same tokenizer as bench.py: build_char_tokenizer's vocabulary (recipes/tiny.py's write_char_vocab), loaded
  with transformers' Qwen2Tokenizer, so that prompts and completions are the same number of tokens on both sides;
- a random transformers Qwen2ForCausalLM of the shape's sizes (untied LM head, as bench.py's model), saved and
  given to GRPOTrainer by path (it loads the policy, and the reference when beta > 0, from there);
- `prompts_per_step * (warmup_steps + timed_steps)` prompts of exactly `prompt_len` letters and digits, drawn as
  bench.py draws them.
Then `warmup_steps + timed_steps` GRPO steps: each samples `group_size` completions of exactly `completion_len`
tokens (min_new_tokens = max_new_tokens, so no EOS: bench.py's `fixed` lengths) for `prompts_per_step` prompts,
scores them with bench.py's reward (share of vowels), and takes one optimizer step (AdamW, constant lr 1e-5, beta as
the KL coefficient, all sequences of a step in one micro-batch unless SHAPE.json has `micro_batch_size`).

`--model DIR`: a transformers checkpoint (tools/models/export_hf.py's export of the model directory tools/bench/bench.py
--model runs, so the same weights) instead of the random model, with its own tokenizer and chat template. The
prompts are tools/bench/bench.py's for --model (`chat_questions`: the user questions of data/smollm2_add/train.jsonl),
given to GRPOTrainer as conversations (one user message), so that TRL renders them with the model's chat template
itself; `prompt_tokens` in the JSON line counts each as TRL tokenizes it and must equal bench.py's list. As in
bench.py, SHAPE.json's model sizes and `prompt_len` are ignored (`ignored_shape_keys`; `shape` holds the model's).

Settings that GRPOConfig defaults differently from our trainer are set to our trainer's, so that both run the
same arithmetic: `bf16=False` (GRPOConfig turns bfloat16 autocast on by default, also on CPU) with the model
loaded in float32, `gradient_checkpointing=False` (GRPOConfig's default recomputes activations; our trainer's
`recompute` is off; `--gradient-checkpointing` turns it on, to compare with bench.py's `--config recompute=true`),
and AdamW's weight decay 0.01 (our trainer's `weight_decay`; transformers' is 0). The effective values, read back
from the trainer and its model, are in `trl_settings`.

Prints ONE JSON line (stdout; TRL's own logging goes to stderr) with tools/bench/bench.py's names where they mean the
same: `step_s_median` (wall seconds per step, median over the timed steps; TRL's step = rollout + reward + reference
+ update), `step_s_min`, `step_s_max`,
`step_s_all`, `completion_tokens_per_step`, `completion_tokens_per_s` (completion tokens / step time),
`completion_len_mean` (what TRL logged: checks the forced length), `peak_rss_mb` (the process's high-water mark,
model building included), `threads`, `load_average`, `shape`; plus `peer`, `trl_version`, `torch_version`,
`transformers_version`. TRL has no per-phase timings, so there are none here. SHAPE.json's `config` (our trainer's
keys, e.g. use_fused_head_and_loss_fn) has no TRL counterpart and is ignored (listed in `ignored_config`); `lengths`
other than `fixed` is refused. The torch model's random weights are not paddle's: compare times and memory, not
losses.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import pathlib
import resource
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[2]
KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "prompt_len",
        "completion_len", "prompts_per_step", "group_size", "beta", "warmup_steps", "timed_steps")
LEARNING_RATE = 1e-5  # bench.py's
WEIGHT_DECAY = 0.01   # our trainer's default weight_decay (bench.py leaves it so); transformers' default is 0


def load_shape(path: str, sets: Sequence[str] = ()) -> Dict[str, Any]:
    """SHAPE.json with `--set KEY=VALUE` applied (VALUE as JSON); exits with a message naming the file or the
    flag on a missing key, a bad override, or completion lengths other than `fixed`."""
    try:
        with open(path) as f:
            shape = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise SystemExit(f"{path}: {e}")
    for kv in sets:
        key, sep, value = kv.partition("=")
        if not sep:
            raise SystemExit(f"--set: expected KEY=VALUE, got {kv!r}")
        try:
            shape[key] = json.loads(value)
        except json.JSONDecodeError as e:
            raise SystemExit(f"--set {kv}: VALUE must be JSON ({e})")
    missing = [k for k in KEYS if k not in shape]
    if missing:
        raise SystemExit(f"{path}: missing keys {missing} (a SHAPE.json needs {list(KEYS)})")
    if shape.get("lengths", "fixed") != "fixed":
        raise SystemExit(f"{path}: lengths {shape['lengths']!r}: this harness forces every completion to exactly "
                         "completion_len tokens (tools/bench/bench.py's 'fixed'); TRL has no hook to end rows at drawn "
                         "lengths")
    n = shape["prompts_per_step"] * shape["group_size"]
    if n % shape.get("micro_batch_size", n):
        raise SystemExit(f"{path}: micro_batch_size {shape['micro_batch_size']} must divide prompts_per_step x "
                         f"group_size = {n}")
    return shape


def prompts(shape: Dict[str, Any], seed: int = 0) -> List[str]:
    """tools/bench/bench.py's prompts: letters and digits of the character alphabet (one token each), `prompt_len`
    long."""
    import random

    from paddle_grpo.recipes.tiny import CHAR_ALPHABET

    letters = [c for c in CHAR_ALPHABET[:shape["vocab_size"] - 3] if c.isalnum()]
    rng = random.Random(seed)
    n = shape["prompts_per_step"] * (shape["warmup_steps"] + shape["timed_steps"])
    return ["".join(rng.choice(letters) for _ in range(shape["prompt_len"])) for _ in range(n)]


def vowel_share(completions: Sequence[Any], **kwargs: Any) -> List[float]:
    """bench.py's reward (the share of lowercase vowels), in TRL's reward-function signature."""
    texts = [c if isinstance(c, str) else str(c) for c in completions]
    return [sum(ch in "aeiou" for ch in t) / max(1, len(t)) for t in texts]


def build(shape: Dict[str, Any], workdir: str, seed: int = 0) -> Any:
    """Tokenizer and random model in workdir/model; returns the tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    from paddle_grpo.recipes.tiny import IM_END, PAD, write_char_vocab

    model_dir = os.path.join(workdir, "model")
    os.makedirs(model_dir)
    vocab_file, merges_file = write_char_vocab(workdir, shape["vocab_size"])
    tokenizer = Qwen2Tokenizer(vocab_file, merges_file, unk_token=None, bos_token=None, eos_token=IM_END,
                               pad_token=PAD)
    if len(tokenizer) != shape["vocab_size"]:
        raise RuntimeError(f"tokenizer has {len(tokenizer)} tokens, the shape {shape['vocab_size']}")
    tokenizer.padding_side = "left"
    tokenizer.save_pretrained(model_dir)
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                         intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_layers"],
                         num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
                         max_position_embeddings=shape["prompt_len"] + shape["completion_len"],
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.pad_token_id)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(model_dir)
    del model  # GRPOTrainer loads its own copies from model_dir; this one would only add to the peak
    return tokenizer


class StepTimer:
    """Wall time of every optimizer step, from transformers' callback hooks (made a TrainerCallback in `run`)."""

    def __init__(self) -> None:
        self.times: List[float] = []
        self._t0 = 0.0

    def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
        self._t0 = time.perf_counter()

    def on_step_end(self, *args: Any, **kwargs: Any) -> None:
        self.times.append(time.perf_counter() - self._t0)


def bench_module() -> Any:
    """tools/bench/bench.py as a module (its --model prompts and model sizes; it imports neither paddle nor torch)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_paddle_grpo_bench", REPO / "tools" / "bench" / "bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model_prompts(shape: Dict[str, Any], model_dir: str) -> Any:
    """--model: (tokenizer, conversational prompts, each prompt's token count as TRL tokenizes it, shape with the
    model's sizes and prompt_len = the longest prompt, ignored SHAPE.json keys)."""
    from transformers import AutoTokenizer

    bench = bench_module()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit(f"--model {model_dir}: its tokenizer has no chat template (tokenizer_config.json "
                         "'chat_template'); the benchmark renders its prompts with the model's own")
    tokenizer.padding_side = "left"
    n = shape["prompts_per_step"] * (shape["warmup_steps"] + shape["timed_steps"])
    conversations = [[{"role": "user", "content": q}] for q in bench.chat_questions(n)]
    # GRPOTrainer._tokenize_prompts' call for conversational prompts
    ids = tokenizer.apply_chat_template(conversation=conversations, add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
    prompt_tokens = [len(i) for i in ids]
    shape, ignored = bench.model_shape(shape, model_dir)
    shape["prompt_len"] = max(prompt_tokens)
    return tokenizer, conversations, prompt_tokens, shape, ignored


def run(shape: Dict[str, Any], threads: int, workdir: str, seed: int = 0,
        model: Optional[str] = None, checkpointing: bool = False) -> Dict[str, Any]:
    """One benchmark in this process (`model`: --model's transformers checkpoint, else a random model); returns the
    result dict (module docstring)."""
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(threads)
    if model is None:
        tokenizer = build(shape, workdir, seed)
        model_dir, train_prompts = os.path.join(workdir, "model"), prompts(shape, seed)
    else:
        model_dir = os.path.abspath(model)
        tokenizer, train_prompts, prompt_tokens, shape, ignored = model_prompts(shape, model_dir)
    P, G, T = shape["prompts_per_step"], shape["group_size"], shape["completion_len"]
    n = P * G
    micro = shape.get("micro_batch_size", n)
    steps = shape["warmup_steps"] + shape["timed_steps"]
    args = GRPOConfig(
        output_dir=os.path.join(workdir, "out"), report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, use_cpu=True, seed=seed, max_steps=steps, learning_rate=LEARNING_RATE,
        lr_scheduler_type="constant",  # bench.py's (transformers' default decays linearly)
        per_device_train_batch_size=micro, gradient_accumulation_steps=n // micro, num_generations=G,
        max_completion_length=T, temperature=1.0, top_p=1.0, top_k=0, beta=shape["beta"], num_iterations=1,
        generation_kwargs={"min_new_tokens": T}, shuffle_dataset=False,
        # our trainer's arithmetic (module docstring): float32, no recomputation, its weight decay
        bf16=False, gradient_checkpointing=checkpointing, model_init_kwargs={"dtype": "float32"},
        weight_decay=WEIGHT_DECAY)
    timer = type("Timer", (StepTimer, TrainerCallback), {})()
    trainer = GRPOTrainer(model=model_dir, processing_class=tokenizer, reward_funcs=[vowel_share], args=args,
                          train_dataset=Dataset.from_dict({"prompt": train_prompts}), callbacks=[timer])
    with contextlib.redirect_stdout(sys.stderr):  # transformers prints each step's log dict: stdout is the JSON line
        trainer.train()
    timed = timer.times[shape["warmup_steps"]:]
    if len(timed) != shape["timed_steps"]:
        raise RuntimeError(f"timed {len(timed)} steps, expected {shape['timed_steps']} (TRL ran {len(timer.times)})")
    logged = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    median = statistics.median(timed)
    settings = {k: getattr(trainer.args, k) for k in ("bf16", "gradient_checkpointing", "weight_decay",
                                                       "learning_rate", "lr_scheduler_type", "max_grad_norm",
                                                       "adam_beta1", "adam_beta2", "adam_epsilon")}
    settings["lr_scheduler_type"] = str(getattr(settings["lr_scheduler_type"], "value",
                                                settings["lr_scheduler_type"]))
    settings["model_dtype"] = str(next(trainer.model.parameters()).dtype)
    # the model's own state (transformers 5 renamed gradient checkpointing to activation checkpointing)
    state = getattr(trainer.model, "is_activation_checkpointing", None)
    settings["model_checkpointing"] = bool(trainer.model.is_gradient_checkpointing if state is None else state)
    extra = {} if model is None else {"model": model_dir, "prompt_tokens": prompt_tokens,
                                      "ignored_shape_keys": ignored}
    return {
        "peer": "trl", "step_s_median": median, "step_s_min": min(timed), "step_s_max": max(timed),
        "step_s_all": timed, "completion_tokens_per_step": n * T, "completion_tokens_per_s": n * T / median,
        "completion_len_mean": statistics.mean(logged) if logged else None,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, "threads": threads,
        "trl_version": trl.__version__, "torch_version": torch.__version__,
        "transformers_version": transformers.__version__, "load_average": list(os.getloadavg()),
        "ignored_config": sorted(shape.get("config", {})), "trl_settings": settings, **extra, "shape": shape,
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default=str(REPO / "tools" / "bench" / "shapes" / "default.json"),
                    help="a tools/bench/bench.py SHAPE.json (default tools/bench/shapes/default.json)")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2, as tools/bench/bench.py)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a SHAPE.json key (VALUE as JSON), e.g. --set completion_len=128")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="recompute activations in the backward pass (GRPOConfig's default; compare with "
                         "tools/bench/bench.py --config recompute=true)")
    ap.add_argument("--model", metavar="DIR", help="a transformers checkpoint (e.g. tools/models/export_hf.py's "
                                                   "export) instead of a random model: its weights, tokenizer and "
                                                   "chat template; SHAPE.json's model sizes and prompt_len are "
                                                   "ignored")
    args = ap.parse_args(argv)
    shape = load_shape(args.shape, args.set)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)  # before torch loads
    sys.path.insert(0, str(REPO))
    for module in ("torch", "trl"):
        try:
            importlib.import_module(module)
        except ImportError as e:
            print(f"trl_bench: cannot import {module} ({e}): run it in the peer's environment (python -m venv "
                  f".peer-venv && PADDLE_GRPO_PEER_ONLY=1 .peer-venv/bin/pip install -e \".[peer]\")",
                  file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="paddle_grpo_trl_bench_") as workdir:
        result = run(shape, args.threads, workdir, args.seed, model=args.model,
                     checkpointing=args.gradient_checkpointing)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
