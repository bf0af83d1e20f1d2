"""Merge LoRA adapters into their base model: a full model directory that `AutoModelForCausalLM` loads.

    python tools/models/merge_lora.py --adapters DIR --out DIR [--base DIR] [--dtype float32|bfloat16|float16]
        [--tokenizer DIR] [--no-check]

--adapters: a LoRA checkpoint of run_rl.py (`<output_dir>/checkpoint-<step>` of a `lora: true` run) or any
directory in paddlenlp.peft's adapter format (`lora_model_state.pdparams` + `lora_config.json`, e.g. from
PaddleNLP's LoRA fine-tuning). --base: the base model the adapters were trained on; default the
`base_model_name_or_path` recorded in lora_config.json. --out gets the merged weights in `save_pretrained` format,
the tokenizer (from --tokenizer, else the adapter directory when it has one, else the base model) and
`merge_info.json` (what was merged). The result needs no paddlenlp.peft: use it as `actor_model_name_or_path`, with
tools/eval/eval_gsm8k.py --model, or anywhere a PaddleNLP model directory is expected.

Each adapted weight becomes W + (lora_alpha / r) * A @ B, computed in float32 and saved in --dtype (default: the
base model's configured dtype). Unless --no-check, the logits of a few random tokens are compared before and after
the merge (same weights in memory: no second copy of the model) and the tool fails when they differ by more than
1e-4 x the largest logit; the difference is printed (float32: rounding only, ~1e-7 on the tiny test model).
Memory: the base model is loaded once, in float32 (about 4 bytes per parameter: ~30 GB for a 7B model).

Left out: adapters of LoRA variants (rsLoRA, PiSSA, MoRA, LoRA-GA, QAT) and tensor-parallel adapter shards that
were saved without merging (`lora_model_state.tp0N.pdparams`): both are refused with a message.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[2]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description="Merge LoRA adapters into their base model.")
    parser.add_argument("--adapters", required=True, help="adapter directory (a LoRA checkpoint of run_rl.py)")
    parser.add_argument("--out", required=True, help="output directory for the merged model")
    parser.add_argument("--base", default=None, help="base model directory (default: the path recorded with the "
                                                     "adapters)")
    parser.add_argument("--dtype", default=None, choices=("float32", "bfloat16", "float16"),
                        help="dtype of the saved weights (default: the base model's)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory to copy (default: the adapter "
                                                          "directory if it has one, else the base model)")
    parser.add_argument("--no-check", action="store_true", help="skip the before/after logits comparison")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from paddle_grpo.policy.lora import LoRAError, merge_into_base, read_adapter_config

    t0 = time.perf_counter()
    try:
        config = read_adapter_config(args.adapters)
        if os.path.abspath(args.out) in (os.path.abspath(args.adapters), os.path.abspath(args.base or "")):
            raise LoRAError("--out must be a new directory, not the adapter or base directory")
        diff = merge_into_base(args.base, args.adapters, args.out, dtype=args.dtype, tokenizer_dir=args.tokenizer,
                               check=not args.no_check)
    except (LoRAError, OSError) as e:
        print(f"merge_lora: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"out": os.path.abspath(args.out), "base": args.base or config.base_model_name_or_path,
                      "adapters": os.path.abspath(args.adapters), "r": config.r, "lora_alpha": config.lora_alpha,
                      "check_max_abs_logit_diff": diff, "seconds": round(time.perf_counter() - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
