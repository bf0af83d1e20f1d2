"""A decode step's attention with each prompt's keys and values held once for all of its samples (numpy, float32).

Why: a rollout samples G completions per prompt, and their KV caches begin with the same prompt. Stored per row,
a decode step reads that prefix G times from memory, and at a few rows of a small model the attention of a step is
mostly reading the cache (SmolLM2-135M, 32 rows: the 30 layers' caches are 164 MB a step at 111 slots, read at a
few GB/s by numpy's small batched products). Here the prefix is one copy per prompt: the scores of all the prompt's
rows' query heads against it are one product `[G * g, d] x [d, L]` per prompt and key-value head, and each row's own
suffix (its sampled and tool tokens) is a product of its own. One softmax runs over the concatenation, so the
probabilities are those of the per-row layout; p.v is the prefix part plus the suffix part.

Rounding: the same maths as the per-row layout in another summation order (p.v is two sums added, and the products
are other GEMM calls), so the outputs differ from the per-row layout's by float32 rounding: at most
2 * S * u * max|v| per output for S slots (two evaluations of a sum of S terms p_s v_s with sum p_s = 1; u = 2^-24;
tests/policy/test_decode_engine_prefix.py). In one process the result is deterministic.

Rows: `PromptGroups` says which rows belong to which prompt. Right after prefill every prompt has G consecutive rows
(the products read reshaped views); once the rollout drops finished rows a prompt may keep fewer, and the rows are
placed into a padded [P, width] grid (zero queries for the empty places, whose scores are never read).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

__all__ = ["PromptGroups", "softmax_", "shared_prefix_attention"]

# Scores of m query rows against S keys: q K^T (the keys a transposed view) while m * S <= SMALL_PRODUCT, else
# (K q^T)^T. numpy's OpenBLAS on AVX-512 CPUs (SkylakeX kernels) runs the first through its small-matrix kernel
# only while m * S <= 1,200 and otherwise goes its general way, several times slower here; the second is never
# slow but up to ~0.15 ms a step slower at small sizes. Measured at 30 layers a step, 8 prompts x 4 rows, one Zen 4
# core, keys of 30 layers in turn: prefix of 12 rows x 180 slots 9.2 ms against 3.3; a row's 3 query heads x 512
# slots 77 against 22; 3 x 8 slots 0.27 against 0.43; 12 x 47 0.84 against 0.91. (Not through matmul's `out=` a
# transposed view: numpy then leaves BLAS for its own loop.)
SMALL_PRODUCT = 1200


def softmax_(scores: np.ndarray) -> np.ndarray:
    """softmax over the last axis of scores (any shape, float32), in place; returns scores."""
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


@dataclass(frozen=True)
class PromptGroups:
    """Rows grouped by prompt: row i belongs to prompt `prompt[i]` (index into the held prefixes, non-decreasing)
    at place `place[i]` of its group; `width` is the largest group. `flat` [N] (prompt * width + place) when some
    group is short, None when every prompt has `width` consecutive rows (then the grid is the rows themselves)."""
    prompts: int
    width: int
    prompt: np.ndarray
    place: np.ndarray
    flat: Optional[np.ndarray]

    @staticmethod
    def of(prompt: np.ndarray) -> "PromptGroups":
        """Groups of rows from each row's prompt index [N] (non-decreasing, every index 0..P-1 present)."""
        prompt = np.asarray(prompt, dtype=np.int64)
        N = len(prompt)
        first = np.searchsorted(prompt, prompt)                 # the first row of each row's prompt
        place = np.arange(N, dtype=np.int64) - first
        P = int(prompt[-1]) + 1 if N else 0
        width = int(place.max()) + 1 if N else 0
        full = P * width == N
        return PromptGroups(P, width, prompt, place, None if full else prompt * width + place)

    def part(self, a: int, b: int) -> tuple[int, int, "PromptGroups"]:
        """The prompts a..b-1: (their first row, the row after their last, their groups) at this `width`, so that the
        part's products have the whole's shapes per prompt (decode_attention.py splits a step over threads so)."""
        if (a, b) == (0, self.prompts):
            return 0, len(self.prompt), self
        r0, r1 = (int(r) for r in np.searchsorted(self.prompt, [a, b]))
        prompt, place = self.prompt[r0:r1] - a, self.place[r0:r1]
        full = (b - a) * self.width == r1 - r0
        return r0, r1, PromptGroups(b - a, self.width, prompt, place, None if full else prompt * self.width + place)

    def keep(self, rows: np.ndarray) -> tuple["PromptGroups", np.ndarray]:
        """The groups of the rows `rows` (increasing indices into the current rows) and the prompts they still use
        (increasing indices into the current prefixes)."""
        prompt = self.prompt[np.asarray(rows, dtype=np.int64)]
        used = np.unique(prompt)
        return PromptGroups.of(np.searchsorted(used, prompt)), used


def shared_prefix_attention(q: np.ndarray, prefix: tuple[np.ndarray, np.ndarray],
                            suffix: tuple[np.ndarray, np.ndarray], mask: np.ndarray, groups: PromptGroups,
                            suffix_unmasked: bool = False) -> np.ndarray:
    """Grouped-query attention of one decode step over each row's prompt prefix and own suffix.

    q [N, KV, g, d] (already scaled by 1/sqrt(d)); prefix keys and values [P, KV, L, d] (P = groups.prompts);
    suffix keys and values [N, KV, T, d] (views of the slots to attend: T >= 1); mask [N, L + T] additive (0 or
    the engine's finfo.min). `suffix_unmasked`: the caller knows mask[:, L:] is all 0, whose addition is skipped
    (x + 0 == x; a -0 score would become +0, which the softmax treats alike). Returns [N, KV, g, d] float32."""
    if groups.flat is not None:
        return _padded_groups_attention(q, prefix, suffix, mask, groups)
    kp, vp = prefix
    ks, vs = suffix
    N, KV, g, d = q.shape
    P, L, T, W = groups.prompts, kp.shape[2], ks.shape[2], groups.width
    S = L + T
    # The scores are held as [P, KV, W * g, S]: a prompt's rows' query heads of one key-value head are consecutive,
    # so the prefix scores are written by their product in place and their probabilities are the left operand of
    # p.v as they lie (strided rows, which BLAS takes): no copy either way. Each row's own slots are a strided
    # [P, W, KV, g, T] view of the same array. Every product is the same BLAS call on the same operands as in the
    # [N, KV, g, S] layout (`_padded_groups_attention`), and the softmax runs over the same contiguous rows: the
    # same bits, with two [N, KV, g, L] copies and the mask's pass over the suffix less.
    scores = np.empty((P, KV, W * g, S), np.float32)
    rows5 = scores.reshape(P, KV, W, g, S)
    by_row = rows5.transpose(0, 2, 1, 3, 4)                                              # [P, W, KV, g, S] view
    q5 = q.reshape(P, W, KV, g, d)
    ks5, vs5 = ks.reshape(P, W, KV, T, d), vs.reshape(P, W, KV, T, d)
    if g * T <= SMALL_PRODUCT:  # straight into their columns (a strided output BLAS writes)
        np.matmul(q5, ks5.transpose(0, 1, 2, 4, 3), out=by_row[..., L:])
    else:
        by_row[..., L:] = np.matmul(ks5, q5.transpose(0, 1, 2, 4, 3)).transpose(0, 1, 2, 4, 3)
    if W * g * L <= SMALL_PRODUCT:
        np.matmul(q5.transpose(0, 2, 1, 3, 4).reshape(P, KV, W * g, d), kp.transpose(0, 1, 3, 2),
                  out=scores[..., :L])
    else:
        rows5[..., :L] = np.matmul(kp, q5.transpose(0, 2, 4, 1, 3).reshape(P, KV, d, W * g)
                                   ).reshape(P, KV, L, W, g).transpose(0, 1, 3, 4, 2)
    mask5 = mask.reshape(P, W, S)[:, None, :, None, :]                                   # [P, 1, W, 1, S]
    if suffix_unmasked:
        rows5[..., :L] += mask5[..., :L]
    else:
        rows5 += mask5
    softmax_(scores)
    out = np.matmul(by_row[..., L:], vs5)                                                # [P, W, KV, g, d]
    pv = np.matmul(scores[..., :L], vp)                                                  # [P, KV, W * g, d]
    out += pv.reshape(P, KV, W, g, d).transpose(0, 2, 1, 3, 4)
    return out.reshape(N, KV, g, d)


def _padded_groups_attention(q: np.ndarray, prefix: tuple[np.ndarray, np.ndarray],
                             suffix: tuple[np.ndarray, np.ndarray], mask: np.ndarray, groups: PromptGroups
                             ) -> np.ndarray:
    """shared_prefix_attention where some prompt has fewer rows than `groups.width` (rows were dropped): the rows
    are placed into the padded [P, width] grid for the prefix products. The scores are held per row [N, KV, g, S]."""
    kp, vp = prefix
    ks, vs = suffix
    N, KV, g, d = q.shape
    P, L, T, W = groups.prompts, kp.shape[2], ks.shape[2], groups.width
    scores = np.empty((N, KV, g, L + T), np.float32)
    if g * T <= SMALL_PRODUCT:  # straight into their columns (a strided output BLAS writes)
        np.matmul(q, ks.transpose(0, 1, 3, 2), out=scores[..., L:])
    else:
        scores[..., L:] = np.matmul(ks, q.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)
    grid = _scatter(q, groups.flat, P * W).reshape(P, W, KV, g, d)
    if W * g * L <= SMALL_PRODUCT:
        prefix_scores = np.matmul(grid.transpose(0, 2, 1, 3, 4).reshape(P, KV, W * g, d), kp.transpose(0, 1, 3, 2))
        prefix_scores = prefix_scores.reshape(P, KV, W, g, L).transpose(0, 2, 1, 3, 4)     # [P, W, KV, g, L]
    else:
        prefix_scores = np.matmul(kp, grid.transpose(0, 2, 4, 1, 3).reshape(P, KV, d, W * g))
        prefix_scores = prefix_scores.reshape(P, KV, L, W, g).transpose(0, 3, 1, 4, 2)
    scores[..., :L] = prefix_scores.reshape(P * W, KV, g, L)[groups.flat]
    scores += mask[:, None, None, :]
    softmax_(scores)
    out = np.matmul(scores[..., L:], vs)                                                  # [N, KV, g, d]
    p = _scatter(scores[..., :L], groups.flat, P * W).reshape(P, W, KV, g, L)
    pv = np.matmul(np.ascontiguousarray(p.transpose(0, 2, 1, 3, 4)).reshape(P, KV, W * g, L), vp)
    out += pv.reshape(P, KV, W, g, d).transpose(0, 2, 1, 3, 4).reshape(P * W, KV, g, d)[groups.flat]
    return out


def _scatter(x: np.ndarray, flat: np.ndarray, places: int) -> np.ndarray:
    """x [N, ...] placed at rows `flat` of a zero array [places, ...] (the padded grid of prompts x width)."""
    grid = np.zeros((places,) + x.shape[1:], np.float32)
    grid[flat] = x
    return grid
