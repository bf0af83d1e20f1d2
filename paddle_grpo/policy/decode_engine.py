"""The decode step of fast_decoder.py's models in numpy, on the model's own memory, with pre-packed matrix products.

Why: a decode step multiplies a few rows (the sequences decoded at once) by every weight matrix and runs ~40 small
ops per layer. In paddle's eager mode each op costs 10-20 us of dispatch whatever its size, and paddle's MKL packs
each weight again at every product: a SmolLM2-135M step at 32 rows took 174 ms on one Zen 4 core, where its
products cost ~75 ms at the machine's best GEMM rate (docs/PERFORMANCE.md, "Generation"). Here each weight is packed
once per rollout (kernels/gemm.py, the backend its measured table picks for this CPU) and the rest of a step is a
few numpy calls: the prefill (`prefill`, prompts in chunks) and the decode steps (`step`) share the layer code
(`_layers`) and differ in their attention only.

It computes FastDecoder's function (the same parameters, RoPE tables, and masking with finfo.min, so a hidden key's
probability is exactly 0) with other rounding: other GEMM kernels and summation orders. Its logits agree with
FastDecoder's to float32 rounding (tests/policy/test_decode_engine.py derives the bound); greedy tokens and keyed
samples are FastDecoder's unless a draw falls within that rounding of a boundary (in a long tail of tokens of
probability ~1e-7 that happens: 5 of 32 SmolLM2 rows of 128 tokens took another tail token somewhere). In one
process, with one backend and thread count, results are deterministic: a rerun or a resumed run samples the same.

`precision`: "float32" (default), or "bfloat16" / "weight_only_int8" for the weight products only (kernels/gemm.py:
bf16 weights and activations, or int8 weights with a scale per output column, float32 accumulation); norms, RoPE,
attention, softmax and the KV cache stay float32. Reduced precision changes the samples: the trainer scores them
against its float32 log-probs (rollout correction) and logs the mismatch.

Shared prompt prefix (default where a prompt has several samples): each prompt's keys and values are held once
for its G rows and attended by one product per prompt (kernels/prefix_attention.py), instead of being copied into
every row's cache and read G times a step. The probabilities are the per-row layout's maths; p.v is summed in two
parts, so samples can differ from the per-row layout's in the last bits (docs/PERFORMANCE.md, "Generation").
PADDLE_GRPO_SHARED_PREFIX=0 keeps the per-row layout, which one sample per prompt (G = 1: evaluation) always uses.
kernels/decode_attention.py runs either layout's attention, split over the threads where a step reads many slots.

Switch: `refusal(fast)` says why the engine does not run (then FastDecoder.decode does): not on CPU, gradients
recorded, or PADDLE_GRPO_DECODE_ENGINE=0.
"""
from __future__ import annotations

import contextlib
import os
from typing import Callable, Optional

import numpy as np
import paddle

from ..kernels import gemm, numpy_kernels, onednn
from ..kernels.decode_attention import decode_attention, splits
from ..kernels.prefix_attention import PromptGroups, softmax_
from .fast_decoder import FastDecoder

ENV_SWITCH = "PADDLE_GRPO_DECODE_ENGINE"
SHARED_PREFIX_SWITCH = "PADDLE_GRPO_SHARED_PREFIX"
# Prefill runs prompts in chunks of about this many tokens: the chunk's scores [p, H, L, L] and MLP activations
# [p * L, 2 * intermediate] stay tens of MB (SmolLM2: 25 MB of gate/up at 2,048 tokens) whatever the batch.
PREFILL_TOKENS = 2048
PRECISIONS = gemm.PRECISIONS


def refusal(fast: FastDecoder) -> Optional[str]:
    """None when DecodeEngine can take over `fast` (a FastDecoder), else why not."""
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return f"{ENV_SWITCH}=0"
    if paddle.is_grad_enabled():
        return "gradients are recorded (the engine decodes under no_grad only)"
    if not numpy_kernels.enabled(fast.embed):
        return "the weights are not contiguous float32 CPU tensors (or PADDLE_GRPO_NUMPY_KERNELS=0)"
    return None


def describe(precision: str = "float32") -> str:
    """The start-up line: 'decode engine: numpy steps, GEMM: ...' (kernels/gemm.py's choice for `precision`)."""
    return f"decode engine: numpy steps, {gemm.describe(precision)}"


def compact_rows(cache: np.ndarray, rows: np.ndarray, filled: int) -> np.ndarray:
    """cache [N, KV, S, d] with row rows[i] moved to row i for each i (rows increasing), slots [0, filled) only;
    returns the view cache[:len(rows)]. In place, row by row: a copy into new arrays (fancy indexing) spent most of
    its time faulting in fresh pages, 1.2-3.8 s for the GSM8K evaluation's 30 layers of [100, 3, 436, 64] against
    0.03-0.23 s here (one Zen 4 core). Increasing rows never overwrite a row before it is read (rows[i] >= i)."""
    for i, r in enumerate(rows.tolist()):
        if r != i:
            cache[i, :, :filled] = cache[r, :, :filled]
    return cache[:len(rows)]


class DecodeEngine:
    """Decode steps after FastDecoder.start_decoding: `step(token [N], keep [N] | None)` -> logits [N, V] float32.

    Packs each weight at construction (values copied: the model may change after the rollout, not during it)."""

    def __init__(self, fast: FastDecoder, precision: str = "float32"):
        if precision not in PRECISIONS:
            raise ValueError(f"decode precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        view = numpy_kernels.writable_view
        self.fast, self.precision = fast, precision
        self.H, self.KV, self.g, self.d, self.D = fast.H, fast.KV, fast.g, fast.d, fast.D
        self.eps = np.float32(fast.eps)
        self.inv_D = np.float32(1.0 / self.D)
        self.scale = np.float32(1.0 / np.sqrt(self.d))
        self.embed = view(fast.embed)
        self.final_norm = view(fast.final_norm)

        def packed(w: paddle.Tensor, transposed: bool = False) -> gemm.Packed:
            return gemm.pack(view(w), precision, transposed=transposed)

        # gate and up as one product of their concatenation (FastDecoder's "wgu"): 2.5 % faster than two at 32 rows
        # with oneDNN on one Zen 4 core, and one call fewer.
        self.layers = [dict(ln1=view(lw["ln1"]), ln2=view(lw["ln2"]), qkv=packed(lw["wqkv"]),
                            bqkv=None if lw["bqkv"] is None else view(lw["bqkv"]), o=packed(lw["wo"]),
                            gate_up=packed(lw["wgu"]), down=packed(lw["wd"]))
                       for lw in fast.layers]
        self.head = packed(fast.head, transposed=bool(fast.head_t))
        self.V = self.head.N
        self.nbytes = self.head.nbytes + sum(lw[k].nbytes for lw in self.layers
                                                  for k in ("qkv", "o", "gate_up", "down"))
        self.neg = np.float32(fast.neg)  # PaddleNLP's additive mask value (finfo.min): exp(neg - max) == 0
        self._tables = (-1, None, None)
        self.attached = False

    def prefill(self, prompt_ids: np.ndarray, prompt_mask: np.ndarray, G: int, max_new_tokens: int) -> np.ndarray:
        """Run prompts [P, L] (left-padded int64 ids and mask) through the model once, fill the KV cache of their
        P * G rows (each prompt's G rows consecutive), and return the next-token logits [P * G, V] float32.

        The caches are allocated here, per layer: with a shared prefix (G > 1, module docstring) the prompts' keys
        and values `prefix` [P, KV, L, d] and the rows' own slots `cache` [P * G, KV, max_new_tokens, d]; else every
        row's slots `cache` [P * G, KV, L + max_new_tokens, d]. Prompts run in chunks of about PREFILL_TOKENS
        tokens, so that the attention scores and the MLP's activations stay small whatever P."""
        P, L = prompt_ids.shape
        N, S, KV, d = P * G, L + max_new_tokens, self.KV, self.d

        def zeros(rows: int, slots: int) -> tuple[np.ndarray, np.ndarray]:
            return np.zeros((rows, KV, slots, d), np.float32), np.zeros((rows, KV, slots, d), np.float32)

        shared = G > 1 and os.environ.get(SHARED_PREFIX_SWITCH, "1") != "0"
        self.prefix = [zeros(P, L) for _ in self.layers] if shared else None
        self.groups = PromptGroups.of(np.repeat(np.arange(P), G)) if shared else None
        self.cache = [zeros(N, max_new_tokens if shared else S) for _ in self.layers]
        # where prefill writes each layer's prompt keys and values: [P, G or 1, KV, L, d] views
        prompt_slots = ([(kp[:, None], vp[:, None]) for kp, vp in self.prefix] if shared else
                        [(kc.reshape(P, G, KV, S, d)[..., :L, :], vc.reshape(P, G, KV, S, d)[..., :L, :])
                         for kc, vc in self.cache])
        keep = prompt_mask.astype(bool)
        positions = np.maximum(np.cumsum(prompt_mask, axis=-1) - 1, 0)
        causal = np.tril(np.ones((L, L), dtype=bool))
        last = np.empty((P, self.D), np.float32)
        chunk = max(1, PREFILL_TOKENS // L)
        for a in range(0, P, chunk):
            b = min(P, a + chunk)
            bias = np.where(keep[a:b, None, :] & causal[None], np.float32(0.0), self.neg)[:, None, None]
            caches = [(kc[a:b], vc[a:b]) for kc, vc in prompt_slots]
            x = self.embed[prompt_ids[a:b].reshape(-1)]
            x = self._layers(x, positions[a:b].reshape(-1),
                             lambda li, q, k, v: self._prompt_attention(q, k, v, bias, caches[li]))
            last[a:b] = x.reshape(b - a, L, self.D)[:, L - 1]
        self.N, self.S, self.L = N, S, L
        self.mask = np.full((N, S), self.neg, dtype=np.float32)
        self.mask[:, :L] = np.repeat(np.where(keep, np.float32(0.0), self.neg), G, axis=0)
        self.pos = np.repeat(positions[:, -1] + 1, G)
        self.write = np.full(N, L, dtype=np.int64)
        self.rows = np.arange(N)
        self.all_slots = False
        self.attached = True
        return np.repeat(self.head(self._rms(last, self.final_norm)), G, axis=0)

    def _prompt_attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, bias: np.ndarray,
                          cache: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        """Causal attention of p prompts of L tokens: q [p * L, H, d], k and v [p * L, KV, d], bias [p, 1, 1, L, L]
        -> [p * L, H * d]; their keys and values go to the cache views [p, G or 1, KV, L, d] (every sample's rows,
        or the shared prefix)."""
        p, L = bias.shape[0], bias.shape[-1]
        KV, g, d = self.KV, self.g, self.d
        kt = k.reshape(p, L, KV, d).transpose(0, 2, 1, 3)                          # [p, KV, L, d]
        vt = v.reshape(p, L, KV, d).transpose(0, 2, 1, 3)
        cache[0][...] = kt[:, None]
        cache[1][...] = vt[:, None]
        qg = q.reshape(p, L, KV, g, d).transpose(0, 2, 3, 1, 4) * self.scale        # [p, KV, g, L, d]
        scores = np.matmul(qg, kt[:, :, None].transpose(0, 1, 2, 4, 3))           # [p, KV, g, L, L]
        scores += bias
        out = np.matmul(self._softmax(scores), vt[:, :, None])                    # [p, KV, g, L, d]
        return out.transpose(0, 3, 1, 2, 4).reshape(p * L, self.H * d)

    _softmax = staticmethod(softmax_)

    def keep_rows(self, rows: np.ndarray) -> None:
        """Go on with the rows `rows` (indices into the current rows, increasing) only: their caches move to the
        first len(rows) rows of the same arrays (`compact_rows`). The single-turn loop drops finished rows so
        (rollout.decode), which costs the remaining rows nothing but their products' rounding (another row count
        M)."""
        rows = np.asarray(rows, dtype=np.int64)
        if (np.diff(rows) <= 0).any() or (len(rows) and not (rows[0] >= 0 and rows[-1] < self.N)):
            raise ValueError(f"keep_rows takes increasing indices into the {self.N} current rows, got {rows.tolist()}")
        # Every key a row's mask lets through lies before max(write) (an idle row's hidden write lands at its own
        # write position): only those slots move.
        filled = int(self.write.max()) - (self.L if self.prefix is not None else 0)
        self.cache = [(compact_rows(kc, rows, filled), compact_rows(vc, rows, filled)) for kc, vc in self.cache]
        if self.prefix is not None:  # the prompts no kept row uses are let go
            self.groups, used = self.groups.keep(rows)
            if len(used) < len(self.prefix[0][0]):
                self.prefix = [(kp[used], vp[used]) for kp, vp in self.prefix]
        self.mask, self.pos, self.write = self.mask[rows], self.pos[rows], self.write[rows]
        self.N = len(rows)
        self.rows = np.arange(self.N)

    def _rope(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and signed sin [N, 1, d] at `positions` from PaddleNLP's cached tables (FastDecoder.rope_tables's
        values): rotate_half(x) * sin == roll(x, d / 2) * (sin with its first half negated)."""
        rotary = self.fast.rotary
        need = int(positions.max()) + 1
        if need > rotary.max_seq_len_cached:
            rotary._set_cos_sin_cache(need)
        if self._tables[0] != rotary.max_seq_len_cached:
            sign = numpy_kernels.writable_view(self.fast.sign)
            self._tables = (rotary.max_seq_len_cached, rotary.cos_cached[0, :, 0, :].numpy(),
                            rotary.sin_cached[0, :, 0, :].numpy() * sign)
        _, cos, sin = self._tables
        return cos[positions][:, None, :], sin[positions][:, None, :]

    def _rms(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """RMSNorm x [n, D] * w: x * rsqrt(mean(x^2) + eps) * w (PaddleNLP's formula, float32)."""
        r = np.float32(1.0) / np.sqrt(np.einsum("nd,nd->n", x, x) * self.inv_D + self.eps)
        return (x * r[:, None]) * w

    def _layers(self, x: np.ndarray, positions: np.ndarray,
                attend: Callable[[int, np.ndarray, np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
        """The decoder layers on tokens x [n, D] at `positions` [n]: `attend(layer, q [n, H, d], k [n, KV, d],
        v [n, KV, d]) -> [n, H * d]` is the attention (prefill's or a decode step's, each with its cache)."""
        n, H, KV, d = x.shape[0], self.H, self.KV, self.d
        half = d // 2
        cos, sin = self._rope(positions)
        for li, lw in enumerate(self.layers):
            mixed = lw["qkv"](self._rms(x, lw["ln1"]))
            if lw["bqkv"] is not None:
                mixed += lw["bqkv"]
            mixed = mixed.reshape(n, H + 2 * KV, d)
            qk = mixed[:, :H + KV]
            rolled = np.concatenate([qk[..., half:], qk[..., :half]], axis=-1)
            qk = qk * cos + rolled * sin
            x += lw["o"](attend(li, qk[:, :H], qk[:, H:], mixed[:, H + KV:]))
            gate_up = lw["gate_up"](self._rms(x, lw["ln2"]))
            gate = gate_up[:, :gate_up.shape[1] // 2]
            # silu(gate) * up = gate * up / (1 + exp(-gate))
            act = gate * gate_up[:, gate_up.shape[1] // 2:]
            np.negative(gate, out=gate)
            np.exp(gate, out=gate)
            gate += np.float32(1.0)
            act /= gate
            x += lw["down"](act)
        return x

    def step_numpy(self, token: np.ndarray, keep: Optional[np.ndarray] = None,
                   out: Optional[np.ndarray] = None) -> np.ndarray:
        """token int64 [N] -> logits [N, V] float32 (into `out` when given). keep bool [N] (None: every row): as
        FastDecoder.decode, a row not kept writes its next slot hidden and does not advance."""
        N, KV, g, d = self.N, self.KV, self.g, self.d
        # Attention spans the slots filled so far while every row appends every step (single-turn). Once rows move
        # at their own pace (`keep`: multi-turn) it spans every slot, as FastDecoder does: a span that followed
        # the rows' progress would make a row's sums (over more or fewer masked zeros) round by how far the other
        # rows are, i.e. by the tool latencies, and a rollout would not repeat bit for bit.
        self.all_slots = self.all_slots or keep is not None
        keep = np.ones(N, dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
        # A row that filled every slot is finished (the rollout reads its logits no more): it rewrites its last one.
        w = np.minimum(self.write, self.S - 1)
        self.mask[self.rows, w] = np.where(keep, np.float32(0.0), self.neg)
        S = self.S if self.all_slots else int(w.max()) + 1
        # Where this step's keys and values go: one slot for every row while they move together (single-turn: a
        # basic index instead of two index arrays, 60 writes a step), else a slot per row.
        slot = w - (self.L if self.prefix is not None else 0)
        where = (slice(None), slice(None), int(slot[0])) if (slot == slot[0]).all() else (self.rows, slice(None), slot)
        # The suffix's mask is all 0 while no row idles or lags (single-turn): its addition (a no-op) is skipped.
        unmasked = self.prefix is not None and not self.mask[:, self.L:S].any()

        # the slots attended: with a shared prefix the rows' own slots start at L
        T = S - self.L if self.prefix is not None else S

        def attend(li: int, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
            kc, vc = self.cache[li]
            kc[where] = k
            vc[where] = v
            qs = q.reshape(N, KV, g, d) * self.scale
            out = decode_attention(qs, (kc[:, :, :T], vc[:, :, :T]), self.mask[:, :S],
                                   None if self.prefix is None else self.prefix[li], self.groups,
                                   suffix_unmasked=unmasked)
            return out.reshape(N, self.H * d)  # heads in q's order

        # Where the attention splits over the threads, paddle's OpenMP threads sleep after each product so that the
        # split's threads get the cores (kernels/decode_attention.py); every layer reads the same slots.
        k0, v0 = self.cache[0]
        split = splits((k0[:, :, :T], v0[:, :, :T]), None if self.prefix is None else self.prefix[0])
        with onednn.workers_sleep_between_products() if split else contextlib.nullcontext():
            x = self._layers(self.embed[token], self.pos, attend)
            logits = self.head(self._rms(x, self.final_norm), out=out)
        step = keep.astype(np.int64)
        self.write += step
        self.pos += step
        return logits

    def row_caches(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each layer's keys and values per row [N, KV, S, d] (the shared prefix copied to its rows): the per-row
        layout's cache, for comparisons."""
        if self.prefix is None:
            return self.cache
        idx = self.groups.prompt
        return [(np.concatenate([kp[idx], kc], axis=2), np.concatenate([vp[idx], vc], axis=2))
                for (kp, vp), (kc, vc) in zip(self.prefix, self.cache)]

    def step(self, token: paddle.Tensor, keep: Optional[paddle.Tensor] = None) -> paddle.Tensor:
        """The stepper's interface after `prefill`: token int64 [N] (paddle) -> logits [N, V] float32 (a new paddle
        tensor)."""
        logits = paddle.empty([self.N, self.V], dtype="float32")
        self.step_numpy(token.numpy(), None if keep is None else keep.numpy(),
                        out=numpy_kernels.writable_view(logits))
        return logits
