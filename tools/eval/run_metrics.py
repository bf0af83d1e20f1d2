"""A run's metrics.jsonl as the result tools read it (tools/eval/smollm2_*.py): its held-out evaluations and its
training steps, each a list of the logged rows."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Tuple


def metric_rows(directory: str) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """(evaluation rows, training-step rows) of `directory`/metrics.jsonl in the file's order: the rows that log
    `eval/accuracy`, and those that log `train/reward` (a step that also evaluated is in both)."""
    evals, steps = [], []
    with open(os.path.join(directory, "metrics.jsonl"), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{f.name}, line {number}: not a JSON object ({e})") from None
            if "eval/accuracy" in row:
                evals.append(row)
            if "train/reward" in row:
                steps.append(row)
    return evals, steps
