"""Rollout speed of the PyTorch peer: Hugging Face `generate` (what TRL's GRPOTrainer samples with on CPU) on a random
Qwen2 of a SHAPE.json's sizes, beside `tools/bench/bench.py`'s rollout phase on the same shape.

Runs in the peer's virtual environment (tools/bench/trl_bench.py's: `python -m venv .peer-venv &&
PADDLE_GRPO_PEER_ONLY=1 .peer-venv/bin/pip install -e ".[peer]"`), not in this project's:

    SHAPE_FILE=tools/bench/shapes/qwen2.5-0.5b-2layers.json .peer-venv/bin/python tools/bench/peer_generation.py

Samples `group_size` completions of exactly `completion_len` tokens (min_new_tokens = max_new_tokens, temperature 1,
KV cache) for each of `prompts_per_step` random prompts of `prompt_len` tokens, `warmup_steps + timed_steps` times,
and prints one JSON line: the median seconds per rollout and completion tokens per second. The model is built as
../shared/peer/trl_peer.py builds it (same config, random weights, untied head).
"""
import json
import os
import statistics
import time

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
    prompts = torch.randint(3, 100, (P, shape["prompt_len"]))
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
print(json.dumps({"peer": "transformers.generate", "torch": torch.__version__, "rollout_s_median": round(median, 3),
                  "rollout_s_all": [round(t, 3) for t in times],
                  "completion_tokens_per_s": round(P * G * T / median, 1),
                  "threads": torch.get_num_threads(), "shape_file": os.path.basename(os.environ["SHAPE_FILE"])}))
