"""A smaller student from a decoder-only model: some of its decoder layers, with the embeddings, final norm and LM
head kept (so it shares the model's tokenizer), for on-policy distillation from the whole model.

    python tools/models/cut_layers.py --src build/models/smollm2-135m-instruct --keep 0-19,28-29 \
        --out build/models/smollm2-135m-instruct-22l

--src: a model directory (or a run's checkpoint-N) that PaddleNLP's AutoModelForCausalLM loads; --out must not exist
or be empty (never overwritten); it gets the weights in `save_pretrained` format, the tokenizer of --src and
`cut_info.json` (source, layers kept, parameters). --keep lists the source's layers to keep, in order (ranges and
single indices, comma-separated); the kept layers are copied unchanged and renumbered 0, 1, ... The cut model is not
trained to stand alone, so expect it to start worse than the source (on SmolLM2-135M, keeping only the first 15, 20
or 24 of the 30 layers gave no coherent answers; dropping a block of late-middle layers and keeping the last ones,
as ShortGPT (arXiv 2403.03853) finds cheapest, keeps more); distillation (docs/algorithms.md, "On-policy
distillation") is what then trains it.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import List, Optional

_LAYER = re.compile(r"\.layers\.(\d+)\.")


def parse_keep(spec: str, total: int) -> List[int]:
    """'0-19,28-29' -> [0, ..., 19, 28, 29]: increasing, distinct, each in 0..total-1, fewer than `total`."""
    layers: List[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        try:
            layers.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise ValueError(f"--keep {spec!r}: expected comma-separated layer indices or ranges like 0-19") from None
    if not layers or layers != sorted(set(layers)) or layers[0] < 0 or layers[-1] >= total or len(layers) == total:
        raise ValueError(f"--keep {spec!r}: the layers must increase, be distinct, lie in 0..{total - 1} and leave "
                         "out at least one layer")
    return layers


def renamed(name: str, layers: List[int]) -> Optional[str]:
    """Parameter `name` of the source under its name in the cut model, or None when its layer is not kept;
    parameters of no layer (embeddings, norm, head) keep their names."""
    m = _LAYER.search(name)
    if m is None:
        return name
    i = int(m.group(1))
    return f"{name[:m.start()]}.layers.{layers.index(i)}.{name[m.end():]}" if i in layers else None


def cut(src: str, keep: str, out: str) -> dict:
    """Write the layers `keep` (parse_keep) of `src` to `out`; returns what cut_info.json holds."""
    from paddlenlp.transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise ValueError(f"--out {out} exists and is not empty: it is kept as it is; remove it or give another --out")
    config = AutoConfig.from_pretrained(src)
    total = config.num_hidden_layers
    layers = parse_keep(keep, total)
    source = AutoModelForCausalLM.from_pretrained(src, dtype=config.dtype or "float32")
    state = {new: v for k, v in source.state_dict().items() if (new := renamed(k, layers)) is not None}
    config.num_hidden_layers = len(layers)
    model = AutoModelForCausalLM.from_config(config, dtype=config.dtype or "float32")
    missing, unexpected = model.set_state_dict(state)
    if missing or unexpected:
        raise ValueError(f"the cut model's parameters do not match the source's: missing {missing}, "
                         f"unexpected {unexpected}")
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    info = {"source": os.path.abspath(src), "layers_kept": layers, "layers_in_source": total,
            "parameters": int(sum(int(p.size) for p in model.parameters())),
            "source_parameters": int(sum(int(p.size) for p in source.parameters()))}
    with open(os.path.join(out, "cut_info.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=1)
    return info


def main(argv: list[str] | None = None) -> int:
    """Command line: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", required=True, help="model directory or checkpoint-N")
    parser.add_argument("--keep", required=True, help="the source's decoder layers to keep, e.g. 0-19,28-29")
    parser.add_argument("--out", required=True, help="directory to write (must not exist or be empty)")
    args = parser.parse_args(argv)
    try:
        info = cut(args.src, args.keep, args.out)
    except (ValueError, OSError) as e:
        print(f"cut_layers: error: {e}", file=sys.stderr)
        return 2
    print(f"cut_layers: {len(info['layers_kept'])} of {info['layers_in_source']} layers, {info['parameters']:,} of "
          f"{info['source_parameters']:,} parameters -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
