"""Rollout speed of the PyTorch peer: Hugging Face `generate` (what TRL's GRPOTrainer samples with on CPU), beside our
sampling (tools/bench/bench_generation.py) on the same weights and prompts, or beside `tools/bench/bench.py`'s rollout
phase on a random Qwen2 of a SHAPE.json's sizes.

Runs in the peer's virtual environment (tools/bench/trl_bench.py's: `python -m venv .peer-venv &&
PADDLE_GRPO_PEER_ONLY=1 .peer-venv/bin/pip install -e ".[peer]"`), not in this project's:

    .peer-venv/bin/python tools/bench/peer_generation.py --model build/models/smollm2-135m-instruct-hf \
        [--rows 1 8 32 100] [--threads 1 2] [--length 128 512] [--repeat 1] [--gemm-rate 1=GFLOPS ...]
    SHAPE_FILE=tools/bench/shapes/qwen2.5-0.5b-2layers.json .peer-venv/bin/python tools/bench/peer_generation.py

`--model DIR` (a transformers checkpoint: `python tools/models/export_hf.py build/models/smollm2-135m-instruct --out
build/models/smollm2-135m-instruct-hf`, the same float32 weights as our model directory): the grid, prompts and
keys of tools/bench/bench_generation.py (its module docstring), one JSON line per configuration. rows = prompts x
samples is formed by `generate(..., num_return_sequences=G)` on the P prompts (G = 4 where rows is a multiple of 4,
else 1): transformers repeats each prompt G times before the prefill, so it computes the prompt once per row where
ours and llama.cpp compute it once per prompt (the floor counts it once per prompt on every side). The prompts are
the same questions rendered by the tokenizer's own chat template (`apply_chat_template`, as TRL does) and
left-padded; `prompt_tokens` must equal bench_generation.py's. The model runs in float32 with transformers' default
attention (`attn_implementation` in the line), sampling with do_sample, temperature 1, top-p 1, top-k 0 (off),
min_new_tokens = max_new_tokens = length (EOS suppressed), the KV cache on; each configuration runs one warm-up of
--warmup-tokens new tokens, then --repeat timed runs, `torch.manual_seed(seed + run)` before each. The floor keys
need `--gemm-rate` (paddle's rate, from `tools/bench/bench.py --gemm`: this environment has no paddle); without it
the line has the token counts and `matmul_mflop_per_token` only.

Without --model: `SHAPE_FILE` (and THREADS, default 2) as before: `group_size` completions of exactly
`completion_len` tokens for each of `prompts_per_step` random prompts of `prompt_len` tokens, `warmup_steps +
timed_steps` times, on a random Qwen2 built as ../shared/peer/trl_peer.py builds it (same config, random weights,
untied head); one JSON line with the median seconds per rollout and completion tokens per second.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import pathlib
import resource
import statistics
import sys
import time
from typing import Any, Dict, Optional, Sequence

REPO = pathlib.Path(__file__).resolve().parents[2]


def generation_module() -> Any:
    """tools/bench/bench_generation.py as a module (the grid, the prompts, the floor; no paddle at import)."""
    name = "_paddle_grpo_bench_generation"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / "bench" / "bench_generation.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def random_shape_rollouts() -> None:
    """The SHAPE_FILE mode (module docstring): HF generate on a random Qwen2 of the shape's sizes."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    shape = json.load(open(os.environ["SHAPE_FILE"]))
    threads = int(os.environ.get("THREADS", "2"))
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    config = Qwen2Config(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                         intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_layers"],
                         num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
                         max_position_embeddings=max(1024, shape["prompt_len"] + shape["completion_len"]),
                         tie_word_embeddings=False, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    model = Qwen2ForCausalLM(config).eval()
    T, G, P = shape["completion_len"], shape["group_size"], shape["prompts_per_step"]
    times = []
    for step in range(shape["warmup_steps"] + shape["timed_steps"]):
        prompts = torch.randint(3, min(100, shape["vocab_size"]), (P, shape["prompt_len"]))
        start = time.perf_counter()
        with torch.no_grad():
            out = model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                                 top_p=1.0, top_k=0, num_return_sequences=G, min_new_tokens=T, max_new_tokens=T,
                                 pad_token_id=0, eos_token_id=1)
        elapsed = time.perf_counter() - start
        assert out.shape == (P * G, shape["prompt_len"] + T), out.shape
        if step >= shape["warmup_steps"]:
            times.append(elapsed)
    median = statistics.median(times)
    print(json.dumps({"peer": "transformers.generate", "torch": torch.__version__,
                      "rollout_s_median": round(median, 3), "rollout_s_all": [round(t, 3) for t in times],
                      "completion_tokens_per_s": round(P * G * T / median, 1),
                      "threads": torch.get_num_threads(), "shape_file": os.path.basename(os.environ["SHAPE_FILE"])}))


def encode_prompts(tokenizer: Any, prompts: int) -> Dict[str, Any]:
    """The first `prompts` questions as TRL renders them (the tokenizer's chat template, a generation prompt), left-
    padded: {"input_ids", "attention_mask"} tensors and each prompt's token count."""
    conversations = [[{"role": "user", "content": q}] for q in generation_module().questions(prompts)]
    ids = tokenizer.apply_chat_template(conversation=conversations, add_generation_prompt=True, tokenize=True,
                                        return_dict=True)["input_ids"]
    tokenizer.padding_side = "left"
    batch = tokenizer.pad({"input_ids": ids}, return_tensors="pt")
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
            "prompt_tokens": [len(i) for i in ids]}


def run(model: Any, tokenizer: Any, rows: int, threads: int, length: int, args: argparse.Namespace,
        rates: Dict[int, float]) -> Dict[str, Any]:
    """One configuration: its JSON line as a dict (bench_generation.py's keys)."""
    import torch
    import transformers

    gen = generation_module()
    torch.set_num_threads(threads)
    P, G = gen.layout(rows, args.samples)
    batch = encode_prompts(tokenizer, P)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])

    def sample(run_index: int, new_tokens: int) -> Any:
        torch.manual_seed(args.seed + run_index)
        with torch.inference_mode():
            return model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                  do_sample=True, temperature=1.0, top_p=1.0, top_k=0, num_return_sequences=G,
                                  min_new_tokens=new_tokens, max_new_tokens=new_tokens,
                                  pad_token_id=tokenizer.pad_token_id, use_cache=True)

    if args.warmup_tokens:
        sample(0, args.warmup_tokens)
    seconds, cpu, lengths = [], [], []
    width = batch["input_ids"].shape[1]
    for i in range(args.repeat):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        out = sample(1 + i, length)
        seconds.append(time.perf_counter() - wall0)
        cpu.append(time.process_time() - cpu0)
        if tuple(out.shape) != (rows, width + length):
            raise RuntimeError(f"generate returned {tuple(out.shape)}, expected ({rows}, {width + length})")
        for row in out[:, width:].tolist():  # the new tokens before the first EOS: all of them when forced
            lengths.append(next((j for j, t in enumerate(row) if t in eos), len(row)))
    median = statistics.median(seconds)
    shape = gen.bench_module().model_shape({}, args.model)[0]
    return {
        "tool": "transformers.generate", "model": os.path.abspath(args.model), "rows": rows, "prompts": P,
        "samples_per_prompt": G, "threads": threads, "length": length, "prompt_tokens": batch["prompt_tokens"],
        "seconds": median, "seconds_all": seconds, "cpu_s_all": cpu, "completion_tokens_per_s": rows * length / median,
        **gen.floor_keys(gen.bench_module().matmul_flop_per_token(shape), batch["prompt_tokens"], rows, length,
                         median, threads, rates, {t: False for t in rates}),
        "completion_len_min": min(lengths), "completion_len_max": max(lengths),
        "warmup_tokens": args.warmup_tokens, "seed": args.seed, "model_dtype": str(model.dtype),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
        "load_average": list(os.getloadavg()),
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv and os.environ.get("SHAPE_FILE"):
        random_shape_rollouts()
        return 0
    gen = generation_module()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, metavar="DIR",
                    help="a transformers checkpoint with a chat template (tools/models/export_hf.py's export)")
    gen.add_grid_args(ap)
    args = ap.parse_args(argv)
    gen.check_grid(args)
    rates = gen.bench_module().parse_gemm_rates(args.gemm_rate, sorted(set(args.threads)))
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(max(args.threads))  # before torch loads
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as e:
        print(f"peer_generation: cannot import torch / transformers ({e}): run it in the peer's environment "
              "(python -m venv .peer-venv && PADDLE_GRPO_PEER_ONLY=1 .peer-venv/bin/pip install -e \".[peer]\")",
              file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if not getattr(tokenizer, "chat_template", None):
        raise SystemExit(f"--model {args.model}: its tokenizer has no chat template")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    for threads, rows, length in gen.configurations(args):
        line = run(model, tokenizer, rows, threads, length, args, rates)
        print(gen.summary(line), file=sys.stderr, flush=True)
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
