"""A step's experience, grouped by prompt: what the rollout sampled and the rewards it got, split into per-prompt
groups (so DAPO dynamic sampling can keep or drop whole groups) and merged back into one padded batch.

A batch is a dict of paddle tensors (`prompt_ids`/`prompt_mask` [n, L] left-padded, `completion_ids`/
`completion_mask`/`sample_logprobs` [n, T]) and numpy/python per-row data (`lengths`, `truncated`, `texts`,
`rewards`, `valid`, `by_function`, `prompt_index`), rows ordered prompt by prompt, G samples each.
"""
import numpy as np
import paddle


def split_groups(indices, rollout, texts, result, G):
    """Per-prompt groups of this round (so dynamic sampling can keep or drop whole groups)."""
    groups = []
    for i, idx in enumerate(indices):
        rows = slice(i * G, (i + 1) * G)
        scores = result.scores[rows]
        judged = [s for s in scores if s is not None]
        groups.append({
            "index": idx, "prompt_ids": rollout.prompt_ids[rows], "prompt_mask": rollout.prompt_mask[rows],
            "completion_ids": rollout.completion_ids[rows], "completion_mask": rollout.completion_mask[rows],
            "sample_logprobs": rollout.sample_logprobs[rows], "lengths": rollout.lengths[rows],
            "truncated": rollout.truncated[rows], "texts": texts[rows], "scores": scores,
            "by_function": {k: v[rows] for k, v in result.scores_by_function.items()},
            # DAPO: a group whose rewards all agree (variance < 1e-6) gives no gradient under group baselines.
            "informative": len(judged) > 1 and float(np.var(judged)) >= 1e-6,
        })
    return groups


def merge_groups(groups, pad_id):
    """Stack groups into one batch, padding prompts (left) and completions (right) to common lengths."""
    L = max(g["prompt_ids"].shape[1] for g in groups)
    T = max(g["completion_ids"].shape[1] for g in groups)

    def left(x, width, value):
        return x if x.shape[1] == width else paddle.concat(
            [paddle.full([x.shape[0], width - x.shape[1]], value, dtype=x.dtype), x], axis=1)

    def right(x, width, value):
        return x if x.shape[1] == width else paddle.concat(
            [x, paddle.full([x.shape[0], width - x.shape[1]], value, dtype=x.dtype)], axis=1)

    scores = [s for g in groups for s in g["scores"]]
    names = list(groups[0]["by_function"])
    return {
        "prompt_ids": paddle.concat([left(g["prompt_ids"], L, pad_id) for g in groups]),
        "prompt_mask": paddle.concat([left(g["prompt_mask"], L, 0) for g in groups]),
        "completion_ids": paddle.concat([right(g["completion_ids"], T, pad_id) for g in groups]),
        "completion_mask": paddle.concat([right(g["completion_mask"], T, 0) for g in groups]),
        "sample_logprobs": paddle.concat([right(g["sample_logprobs"], T, 0.0) for g in groups]),
        "lengths": np.concatenate([g["lengths"] for g in groups]),
        "truncated": np.concatenate([g["truncated"] for g in groups]),
        "texts": [t for g in groups for t in g["texts"]],
        "rewards": np.array([0.0 if s is None else s for s in scores], dtype=np.float64),
        "valid": np.array([s is not None for s in scores]),
        "by_function": {k: [v for g in groups for v in g["by_function"][k]] for k in names},
        "prompt_index": [g["index"] for g in groups for _ in g["texts"]],  # the dataset row each sample answers
    }


def sample_rows(b: dict, records: list, k: int = 4) -> list:
    """The first `k` samples of batch `b` as logged rows: `prompt` (the record's src), `completion` (the text the
    reward functions scored, decoded from the whole token sequence), `reward` (the weighted total before any
    shaping or normalisation; None when no function could judge it), `scores` (each reward function's own score)
    and `length` (generated tokens, EOS included)."""
    return [{"prompt": records[b["prompt_index"][i]]["src"], "completion": b["texts"][i],
             "reward": float(b["rewards"][i]) if b["valid"][i] else None,
             "scores": {name: values[i] for name, values in b["by_function"].items()},
             "length": int(b["lengths"][i])}
            for i in range(min(k, len(b["texts"])))]
