"""TRL's side of the SmolLM2 recipe (configs/smollm2_grpo.yaml): TRL's GRPOTrainer on the same task, weights and batch.

    python tools/models/export_hf.py build/models/smollm2-135m-instruct --out build/models/smollm2-hf      # once
    /path/to/peer-venv/bin/python tools/bench/trl_smollm2.py --model build/models/smollm2-hf --seed 42 \
        --out output/trl_smollm2_s42.json

Runs in the peer environment (torch 2.13 + TRL 1.16: setup.py's `peer` extra, docs/PERFORMANCE.md "The TRL side"),
never imports paddle. The same as the recipe, key by key:
- prompts: data/smollm2_add/train.jsonl's `src` (SmolLM2's ChatML with its default system turn, already templated,
  so TRL tokenizes the same text), shuffled by the sampler with `--seed`; held out: data/smollm2_add/eval.jsonl;
- reward: 1.0 when the first integer of the completion is the sum, else 0.0 (recipes/smollm2.py's rule, restated
  here because that module imports paddle);
- GRPO, 4 prompts x 8 samples per step (one optimizer step per rollout, all 32 sequences in one micro-batch),
  temperature 1, no top-k / top-p, at most 12 new tokens, AdamW at a constant 1e-5 (TRL's default schedule decays
  linearly; the recipe's is constant), weight decay 0.01 (PaddleNLP's default, which the recipe keeps; TRL's is 0),
  float32 without gradient checkpointing (GRPOConfig's defaults on CPU are bf16 autocast and recomputation), beta 0 (no KL, no reference model), 60 steps;
- held-out accuracy sampled at temperature 1 (one completion per problem, 12 new tokens) at step 0 and every
  `--eval-steps`, in batches of 100, outside the timed steps (as the trainer's `perf/step_s` excludes evaluation).
TRL's loss keeps its 1.16 defaults (`loss_type` "dapo": token-level sum over the batch; `scale_rewards` "group"),
as the run the recipe was compared with.

Writes one JSON file: per step the training reward (TRL's logged mean), wall seconds and process CPU seconds (all threads), each evaluation's accuracy,
the cumulative training seconds at each evaluation (evaluations excluded) and the process's CPU seconds, threads and
load average, so that `tools/eval/smollm2_seeds.py` can set it beside the recipe's runs.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import sys
import time
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_FIRST_INTEGER = re.compile(r"-?\d+")


def first_number_reward(completions: List[str], tgt: List[str], **_: object) -> List[float]:
    """1.0 when the first integer of the completion equals `tgt`, else 0.0 (recipes/smollm2.py's rule)."""
    out = []
    for text, ref in zip(completions, tgt):
        m = _FIRST_INTEGER.search(text)
        out.append(1.0 if m is not None and int(m.group(0)) == int(str(ref).strip()) else 0.0)
    return out


def read_jsonl(path: str) -> List[Dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a transformers checkpoint of SmolLM2 (tools/models/export_hf.py's)")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--max-steps", type=int, default=60)
    ap.add_argument("--eval-steps", type=int, default=10)
    ap.add_argument("--learning-rate", type=float, default=1e-5)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2: the machine's cores)")
    ap.add_argument("--train", default=os.path.join(REPO, "data", "smollm2_add", "train.jsonl"))
    ap.add_argument("--eval", default=os.path.join(REPO, "data", "smollm2_add", "eval.jsonl"))
    ap.add_argument("--out", required=True, help="the results JSON file to write (refused if it exists)")
    args = ap.parse_args(argv)
    if os.path.exists(args.out):
        sys.exit(f"trl_smollm2: {args.out} exists; choose another --out")

    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model)
    tok.padding_side = "left"
    train = read_jsonl(args.train)
    held_out = read_jsonl(args.eval)
    ds = Dataset.from_dict({"prompt": [r["src"] for r in train], "tgt": [r["tgt"] for r in train]})

    def evaluate(model) -> float:
        """Share of held-out problems whose one sampled completion (T = 1, 12 new tokens) is right."""
        model.eval()
        right = 0
        gen = torch.Generator().manual_seed(args.seed + 1)
        with torch.no_grad():
            for s in range(0, len(held_out), 100):
                rows = held_out[s:s + 100]
                enc = tok([r["src"] for r in rows], return_tensors="pt", padding=True, add_special_tokens=False)
                torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
                out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=12,
                                     pad_token_id=tok.pad_token_id)
                texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
                right += int(sum(first_number_reward(texts, [r["tgt"] for r in rows])))
        model.train()
        return right / len(held_out)

    record: Dict = {"peer": "trl", "trl_version": trl.__version__, "torch_version": torch.__version__,
                    "seed": args.seed, "learning_rate": args.learning_rate, "threads": torch.get_num_threads(), "model": args.model,
                    "steps": [], "evals": []}

    class Clock(TrainerCallback):
        """Step wall times, and evaluations outside them."""

        def __init__(self) -> None:
            self.started = self.cpu_started = 0.0
            self.train_s = 0.0

        def on_train_begin(self, args_, state, control, model=None, **kw):
            record["evals"].append({"step": 0, "accuracy": evaluate(model), "train_s": 0.0})
            print(f"trl_smollm2: step 0 held-out accuracy {record['evals'][-1]['accuracy']:.2f}", flush=True)

        def on_step_begin(self, args_, state, control, **kw):
            self.started, self.cpu_started = time.perf_counter(), time.process_time()

        def on_step_end(self, args_, state, control, model=None, **kw):
            dt, cpu = time.perf_counter() - self.started, time.process_time() - self.cpu_started  # all threads
            self.train_s += dt
            record["steps"].append({"step": state.global_step, "step_s": round(dt, 3), "cpu_s": round(cpu, 3),
                                    "train_s": round(self.train_s, 2)})
            if state.global_step % args.eval_steps == 0 or state.global_step == args.max_steps:
                acc = evaluate(model)
                record["evals"].append({"step": state.global_step, "accuracy": acc, "train_s": round(self.train_s, 2)})
                print(f"trl_smollm2: step {state.global_step} held-out accuracy {acc:.2f}, "
                      f"{self.train_s:.0f} s of training", flush=True)

    out_dir = args.out + ".trainer"
    config = GRPOConfig(output_dir=out_dir, per_device_train_batch_size=32, num_generations=8,
                        max_completion_length=12, max_steps=args.max_steps, learning_rate=args.learning_rate,
                        lr_scheduler_type="constant", weight_decay=0.01, beta=0.0, temperature=1.0, top_k=0, top_p=1.0,
                        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False,
                        gradient_checkpointing=False, seed=args.seed, disable_tqdm=True)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    t0 = time.time()
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=[first_number_reward], args=config,
                          train_dataset=ds, callbacks=[Clock()])
    trainer.train()
    rewards = {h["step"]: h["reward"] for h in trainer.state.log_history if "reward" in h and "step" in h}
    for s in record["steps"]:
        s["reward"] = rewards.get(s["step"])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record.update(wall_s=round(time.time() - t0, 1), cpu_s=round(usage.ru_utime + usage.ru_stime, 1),
                  peak_rss_mb=round(usage.ru_maxrss / 1024.0, 1), load_average=list(os.getloadavg()))
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(record, f, indent=1)
    print(json.dumps({k: v for k, v in record.items() if k not in ("steps",)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
