"""Shared by the policy tests (tests/policy/test_fast_qwen2.py, tests/policy/test_recompute.py): a grouped batch."""
import numpy as np
import paddle


def grouped_batch(vocab: int, P: int = 3, G: int = 4, L: int = 7, T: int = 6, seed: int = 0) -> list:
    """[prompt_ids, prompt_mask, completion_ids, completion_mask] paddle tensors: G consecutive rows per prompt,
    prompts with different left padding, completions of random length (row 0 full length), ids in [3, vocab)."""
    rng = np.random.default_rng(seed)
    pm = np.ones((P, L), dtype="int64")
    pm[0, :3] = 0
    pm[-1, :1] = 0
    pid = np.where(pm == 1, rng.integers(3, vocab, size=(P, L)), 0)
    pid, pm = np.repeat(pid, G, 0), np.repeat(pm, G, 0)
    lens = rng.integers(1, T + 1, size=P * G)
    lens[0] = T
    cm = (np.arange(T)[None] < lens[:, None]).astype("int64")
    cid = np.where(cm == 1, rng.integers(3, vocab, size=(P * G, T)), 0)
    return [paddle.to_tensor(x) for x in (pid, pm, cid, cm)]
