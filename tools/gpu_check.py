"""A few training steps of every precision mode and GPU kernel, each compared with float32.

    python tools/gpu_check.py [--steps 3] [--seed 0]

For the day a GPU is available: on one GPU, a tiny random Qwen2 (built locally, no download) trains `--steps` steps
through the project's own code (config.config_from_dict -> trainer.Trainer, whose precision.plan_for_run chooses
the dtype, autocast, O2 decoration and loss scale, and whose load_policy applies the kernel flags) in each mode:

    float32 (the baseline) | bf16 O1 | bf16 O2 | fp16 O1 and O2 with the loss scale | bf16 O2 + flash attention |
    float32 + the fused kernels (use_fused_rms_norm, use_fused_rope)

Every mode replays the baseline's batches (step.collect is wrapped to return them), so that the only difference is
precision; per mode it compares with float32:
- rollout: the mode's own first rollout (sampled by the trainer's step.collect: its decode path, KV cache, kernels
  and precision), the sample log-probs it reports against float32 log-probs of the same tokens (a float32 policy
  loaded from the same directory);
- reference: the reference log-probs of every step's batch (step.reference_logprobs; the reference never trains,
  so these differ by precision alone);
- grad norm: the first update's gradient norm (same weights, same batch), relative;
- moved: after the steps, the trained weights moved at least half as far (L1) as float32's and no farther than
  Adam allows (an O2 run without float32 master weights loses updates below its weights' rounding: it moves ~0);
- finite: every step's losses and the final weights are finite (fp16: the loss scale and its skipped steps are
  shown; GradScaler's rule skips an overflowing step, which is not a failure).
Prints one table and exits 0 when every check passes, 1 on a mismatch (or a check that raised), and 77 on a machine
without a GPU (nothing checked). A mode the GPU cannot run (bf16 and flash attention below compute capability 8.0,
fp16 below 7.0) is listed as skipped, with the reason. `--device cpu` runs the float32 baseline against itself on
the CPU: it checks this tool's own plumbing (tests/tools/test_gpu_check.py), not a GPU.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import sys
import tempfile
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

REPO = pathlib.Path(__file__).resolve().parent.parent
EXIT_OK, EXIT_MISMATCH, EXIT_NO_GPU = 0, 1, 77  # 77: "skipped", as automake's test drivers read it

# Unit roundoff u = 2^-p of a format with p significand bits (implicit bit included): float32 24, bfloat16 8, float16
# 11. One rounding changes a value by at most u relative.
UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}
MARGIN = 4.0  # independent roundings add up like a random walk; 4 standard deviations of it

# The model the check trains (small enough for any GPU, big enough for every kernel: head_dim 16).
MODEL = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2)


@dataclasses.dataclass(frozen=True)
class Mode:
    """A precision mode: config keys over the baseline's, the dtype its compute rounds to, the GPU it needs (CUDA
    compute capability (major, minor) and the CUDA version paddle was built with) and why. `reordered`: float32
    kernels that sum in another order."""
    name: str
    config: Dict[str, Any]
    dtype: str
    needs: Tuple[int, int] = (0, 0)
    why: str = ""
    reordered: bool = False
    cuda: Tuple[int, ...] = (0,)


# paddle's own rule for AMP (paddle/amp/auto_cast.py, Paddle 3.x): bfloat16 from compute capability 8.0 and CUDA 11,
# float16 from 7.0; without it auto_cast switches itself off. Flash attention in paddle is FlashAttention-2, built
# only for compute capability 8.0 and up and CUDA 11.4 and up (paddle's nn/functional/sdpa.py, cmake/third_party.cmake),
# and takes bfloat16/float16 inputs only (hence with bf16 O2). The fused RMSNorm and rotary kernels document no limit
# and have float32 versions: they run in float32 here, so that their own effect is what is compared. These are the
# rules the precision plan applies to a GPU too; a mode the plan then does not apply is a mismatch (plan_row).
BF16 = dict(needs=(8, 0), cuda=(11,), why="bfloat16 needs compute capability >= 8.0 and CUDA >= 11")
FP16 = dict(needs=(7, 0), why="float16 AMP needs compute capability >= 7.0")
MODES = (
    Mode("bf16 O1", {"bf16": True, "fp16_opt_level": "O1"}, "bfloat16", **BF16),
    Mode("bf16 O2", {"bf16": True, "fp16_opt_level": "O2"}, "bfloat16", **BF16),
    Mode("fp16 O1 + loss scale", {"fp16": True, "fp16_opt_level": "O1"}, "float16", **FP16),
    Mode("fp16 O2 + loss scale", {"fp16": True, "fp16_opt_level": "O2"}, "float16", **FP16),
    Mode("bf16 O2 + flash attention", {"bf16": True, "fp16_opt_level": "O2", "use_flash_attention": True},
         "bfloat16", needs=(8, 0), cuda=(11, 4),
         why="paddle's flash attention (FlashAttention-2) needs compute capability >= 8.0 and CUDA >= 11.4"),
    Mode("float32 + fused kernels", {"use_fused_rms_norm": True, "use_fused_rope": True}, "float32", reordered=True),
)
BASELINE = Mode("float32", {}, "float32")
# --device cpu: the baseline against itself. `reordered`: the rollout's decode (KV cache, one position at a time) and
# the full forward it is compared with sum in different orders even in float32.
REPEAT = Mode("float32 (again)", {}, "float32", reordered=True)


def applicable(mode: Mode, capability: Tuple[int, int], cuda_version: Optional[str]) -> Optional[str]:
    """None when `mode` runs on a GPU of this compute capability and paddle CUDA version, else why not."""
    parts = (cuda_version or "").split(".")
    cuda = tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else (0,)  # None / 'False': no CUDA
    if tuple(capability) < mode.needs or cuda < mode.cuda:
        return f"{mode.why} (this GPU: compute capability {capability[0]}.{capability[1]}, CUDA {cuda_version})"
    return None


# ------------------------------------------------------------------------------------------------- tolerances
#
# A log-prob is logit_y - logsumexp(logits), so its error is at most twice the largest logit error. The logits of a
# model of L layers pass through about R = 10 L + 2 roundings of the compute dtype (per layer: q, k, v, scores,
# attention weights, attention output, gate, up, activation, down; plus the embedding and the head's input), each
# relative u, adding like a random walk: relative error ~ u sqrt(R), times the logits' magnitude, bounded by
# |logit| <= |h| |w_v| = sqrt(H) max_v |w_v| max|g| (h the final RMSNorm's output: rms 1 times its weight g).
# float32 kernels that sum in another order (the fused kernels) differ per rounding by up to n u over a sum of n
# terms (Higham's gamma_n), n = H: u becomes H u. The gradient norm is relative already and passes each rounding
# twice (forward and backward): relative tolerance MARGIN u sqrt(2 R).

def roundings(num_layers: int) -> int:
    return 10 * num_layers + 2


def per_rounding(mode: Mode, hidden: int) -> float:
    return UNIT_ROUNDOFF[mode.dtype] * (hidden if mode.reordered else 1)


def logprob_tolerance(mode: Mode, num_layers: int, hidden: int, logit_bound: float) -> float:
    """Largest |log-prob - float32 log-prob| allowed (see the comment above)."""
    return MARGIN * 2.0 * per_rounding(mode, hidden) * math.sqrt(roundings(num_layers)) * logit_bound


def grad_norm_tolerance(mode: Mode, num_layers: int, hidden: int) -> float:
    """Largest relative difference of the gradient norm from float32's."""
    return MARGIN * per_rounding(mode, hidden) * math.sqrt(2 * roundings(num_layers))


def adam_bound(learning_rate: float, steps: int, beta1: float = 0.9, beta2: float = 0.999) -> float:
    """Largest distance one weight can move in `steps` Adam steps: each step moves it at most lr (1 - b1) /
    sqrt(1 - b2) when 1 - b1 > sqrt(1 - b2), else lr (Kingma & Ba 2015, section 2.1); two runs differ by at most
    twice that."""
    per_step = learning_rate * max(1.0, (1 - beta1) / math.sqrt(1 - beta2))
    return 2.0 * per_step * steps


MOVED_AT_LEAST = 0.5  # a margin, not a rounding bound: Adam moves each weight ~lr whatever the gradient's rounding,
# so a mode moves about as far as float32; one that loses its updates moves ~0.


def max_abs_diff(values: Any, reference: Any, mask: Any = None) -> float:
    """max |values - reference| over `mask` (numpy arrays; non-finite -> inf; empty -> 0)."""
    import numpy as np

    v, r = np.asarray(values, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    d = np.abs(v - r)
    if mask is not None:
        d = d[np.asarray(mask).astype(bool)]
    if d.size == 0:
        return 0.0
    return float("inf") if not np.isfinite(d).all() else float(d.max())


@dataclasses.dataclass
class Row:
    mode: str
    check: str
    value: Optional[float] = None      # the difference measured (None: no number)
    tolerance: Optional[float] = None
    ok: Optional[bool] = None          # None: skipped / not applicable
    note: str = ""

    @property
    def status(self) -> str:
        return "skip" if self.ok is None else "ok" if self.ok else "MISMATCH"


def compare(mode: str, check: str, value: float, tolerance: float, note: str = "") -> Row:
    """A row that passes when value <= tolerance (a non-finite value never passes)."""
    return Row(mode, check, value, tolerance, math.isfinite(value) and value <= tolerance, note)


def table(rows: Sequence[Row]) -> str:
    """The markdown table of all rows."""
    fmt = lambda x: "" if x is None else f"{x:.3g}"  # noqa: E731
    out = ["| mode | check | difference | tolerance | result | note |", "|---|---|---:|---:|---|---|"]
    out += [f"| {r.mode} | {r.check} | {fmt(r.value)} | {fmt(r.tolerance)} | {r.status} | {r.note} |" for r in rows]
    return "\n".join(out)


def exit_code(rows: Sequence[Row]) -> int:
    return EXIT_MISMATCH if any(r.ok is False for r in rows) else EXIT_OK


def no_gpu_reason() -> Optional[str]:
    """None when paddle sees a CUDA GPU, else why not (checked before anything is built)."""
    try:
        import paddle
    except ImportError as e:
        return f"paddle is not installed ({e})"
    if not paddle.device.is_compiled_with_cuda():
        return f"paddle {paddle.__version__} is a CPU build (paddle.device.is_compiled_with_cuda() is False)"
    if paddle.device.cuda.device_count() < 1:
        return "paddle sees no CUDA device (paddle.device.cuda.device_count() == 0)"
    return None


# ------------------------------------------------------------------------------------------------------ running

REWARD = """def vowel_reward(prompts, completions, **kwargs):
    return [sum(c in "aeiou" for c in text) / max(1, len(text)) for text in completions]
"""  # share of vowels: cheap, and varies between samples of a random policy


def build(workdir: str, seed: int) -> Tuple[str, str]:
    """A character tokenizer and a random Qwen2 of MODEL's sizes in workdir/model, 8 prompts in workdir/train.jsonl,
    the reward function in workdir/rewards.py."""
    import random

    from paddle_grpo.recipes.tiny import build_char_tokenizer, build_model

    model_dir = os.path.join(workdir, "model")
    tokenizer = build_char_tokenizer(model_dir, MODEL["vocab_size"])
    build_model(model_dir, tokenizer, hidden_size=MODEL["hidden_size"], intermediate_size=MODEL["intermediate_size"],
                num_layers=MODEL["num_layers"], num_heads=MODEL["num_heads"], num_kv_heads=MODEL["num_kv_heads"],
                max_position_embeddings=64, seed=seed)
    with open(os.path.join(workdir, "rewards.py"), "w") as f:
        f.write(REWARD)
    rng = random.Random(seed)
    data = os.path.join(workdir, "train.jsonl")
    with open(data, "w") as f:
        for _ in range(8):
            f.write(json.dumps({"src": "".join(rng.choice("abcdefghij0123456789") for _ in range(12)), "tgt": ""})
                    + "\n")
    return model_dir, data


LEARNING_RATE = 1e-3  # large enough that a step moves bfloat16 weights of ~0.02 by more than their rounding (~1e-4)


def base_config(model_dir: str, data: str, workdir: str, steps: int, seed: int) -> Dict[str, Any]:
    return dict(actor_model_name_or_path=model_dir, use_rm_server=False,
                reward_funcs=f"{os.path.join(workdir, 'rewards.py')}:vowel_reward", train_datasets=data,
                output_dir=os.path.join(workdir, "out"), logging_dir=os.path.join(workdir, "vdl"), report_to="none",
                save_strategy="no", disable_tqdm=True, chat_template="none", seed=seed, max_prompt_len=16,
                max_dec_len=8, min_dec_len=8, max_length=24, temperature=1.0, top_p=1.0, global_batch_size=2,
                rollout_n=4, rollout_max_num_seqs=8, per_device_train_batch_size=8,
                per_device_logprob_batch_size=8, learning_rate=LEARNING_RATE, max_steps=steps, kl_coeff=0.0,
                weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, lr_scheduler_type="constant",  # adam_bound's
                kl_loss_coeff=0.05, entropy_coeff=0.0, rl_algorithm="grpo", use_fused_head_and_loss_fn=False)


@dataclasses.dataclass
class Record:
    """What one mode's run produced: the batches (baseline), per-step reference log-probs and update metrics, the
    trainable weights before and after (float32 numpy), the rollout, the loss scale."""
    batches: List[Any] = dataclasses.field(default_factory=list)
    reference: List[Any] = dataclasses.field(default_factory=list)
    updates: List[Dict[str, float]] = dataclasses.field(default_factory=list)
    before: Dict[str, Any] = dataclasses.field(default_factory=dict)
    after: Dict[str, Any] = dataclasses.field(default_factory=dict)
    rollout: Any = None
    loss_scale: Optional[float] = None
    plan: str = ""


@contextlib.contextmanager
def hooks(record: Record, replay: Optional[Sequence[Any]]) -> Iterator[None]:
    """Wrap step.collect (record the batch, or return the baseline's instead; the first call also keeps the mode's
    own batch as `record.rollout`), step.reference_logprobs and step.update (record their results) for the
    duration."""
    from paddle_grpo import step

    names = ("collect", "reference_logprobs", "update")
    originals = {n: getattr(step, n) for n in names}

    def collect(*args: Any, **kwargs: Any) -> Any:
        own = None
        if replay is None or record.rollout is None:
            own = originals["collect"](*args, **kwargs)
            if record.rollout is None:  # the mode's own first rollout, as the trainer samples it
                record.rollout = own[0]
        out = own if replay is None else replay[len(record.batches)]
        record.batches.append(out)
        return out

    def reference_logprobs(*args: Any, **kwargs: Any) -> Any:
        out = originals["reference_logprobs"](*args, **kwargs)
        batch = next(a for a in (*args, *kwargs.values()) if hasattr(a, "completion_mask"))  # the step's batch
        record.reference.append((out.numpy().astype("float64"), batch.completion_mask.numpy()))
        return out

    def update(*args: Any, **kwargs: Any) -> Any:
        out = originals["update"](*args, **kwargs)
        record.updates.append(out.as_dict())
        return out

    try:
        for n, fn in (("collect", collect), ("reference_logprobs", reference_logprobs), ("update", update)):
            setattr(step, n, fn)
        yield
    finally:
        for n, fn in originals.items():
            setattr(step, n, fn)


def weights(model: Any) -> Dict[str, Any]:
    return {n: p.astype("float32").numpy().copy() for n, p in model.named_parameters() if not p.stop_gradient}


def run_mode(cfg_values: Dict[str, Any], steps: int, replay: Optional[Record]) -> Tuple[Record, Any]:
    """Build the Trainer of `cfg_values` and train `steps` steps, replaying `replay`'s batches when given (the
    first step's own rollout is still sampled, by the trainer's step.collect, and kept). Returns (record, trainer)."""
    from paddle_grpo.config import config_from_dict
    from paddle_grpo.trainer import Trainer

    trainer = Trainer(config_from_dict(cfg_values))
    record = Record(plan=trainer.precision.describe())
    record.before = weights(trainer.policy.model)
    with hooks(record, replay.batches if replay is not None else None):
        for _ in range(steps):
            trainer.train_step()
    record.after = weights(trainer.policy.model)
    amp = trainer.learner.amp
    record.loss_scale = amp.loss_scale.scale if amp is not None and amp.loss_scale is not None else None
    return record, trainer


def logit_bound(model: Any) -> float:
    """sqrt(H) max_v |w_v| max|g| for the head weight w and the final norm's weight g (see the tolerances)."""
    import numpy as np

    H = model.config.hidden_size
    w = model.get_output_embeddings().weight.astype("float32").numpy()
    norms = np.sqrt((w.astype(np.float64) ** 2).sum(axis=0 if w.shape[0] == H else 1))
    g = float(np.abs(model.get_decoder().norm.weight.astype("float32").numpy()).max())
    return math.sqrt(H) * float(norms.max()) * g


def check_mode(mode: Mode, rec: Record, base: Record, scorer: Any, bound: float, steps: int) -> List[Row]:
    """The rows of one mode against the baseline (module docstring)."""
    import numpy as np

    L, H = MODEL["num_layers"], MODEL["hidden_size"]
    tol_lp = logprob_tolerance(mode, L, H, bound)
    rows = []
    r = rec.rollout
    lp, _ = scorer.logprobs(r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask, temperature=1.0)
    rows.append(compare(mode.name, "rollout log-probs", max_abs_diff(r.sample_logprobs.numpy(), lp.numpy(),
                                                                      r.completion_mask.numpy()), tol_lp,
                        f"{int(r.completion_mask.numpy().sum())} tokens sampled by the mode"))
    diffs = [max_abs_diff(a, b, mask) for (a, mask), (b, _) in zip(rec.reference, base.reference)]
    rows.append(compare(mode.name, "reference log-probs", max(diffs), tol_lp, f"{len(diffs)} steps"))
    g, g0 = rec.updates[0]["train/grad_norm"], base.updates[0]["train/grad_norm"]
    if mode.dtype == "float16" and not math.isfinite(g):
        rows.append(Row(mode.name, "grad norm (relative)", None, None, None,
                        "first step overflowed at the initial loss scale (skipped, as GradScaler does)"))
    else:
        rows.append(compare(mode.name, "grad norm (relative)", abs(g - g0) / g0, grad_norm_tolerance(mode, L, H)))
    moved = sum(float(np.abs(rec.after[n] - rec.before[n]).sum()) for n in rec.after)
    moved0 = sum(float(np.abs(base.after[n] - base.before[n]).sum()) for n in base.after)
    rows.append(Row(mode.name, "moved (L1, mode / float32)", moved / moved0, MOVED_AT_LEAST,
                    moved / moved0 >= MOVED_AT_LEAST, "at least the tolerance"))
    far = max(max_abs_diff(rec.after[n], base.after[n]) for n in base.after)
    rows.append(compare(mode.name, "weights vs float32 (max abs)", far, adam_bound(LEARNING_RATE, steps) + 2 *
                        UNIT_ROUNDOFF[mode.dtype] * max(float(np.abs(w).max()) for w in base.after.values()),
                        "Adam's bound over the steps, plus the weights' rounding"))
    finite = all(math.isfinite(v) for u in rec.updates for k, v in u.items() if k.endswith("_loss")) and \
        all(np.isfinite(w).all() for w in rec.after.values())
    skipped = sum(not math.isfinite(u["train/grad_norm"]) for u in rec.updates)
    note = f"loss scale {rec.loss_scale:g}, skipped steps: {skipped}" if rec.loss_scale is not None else ""
    rows.append(Row(mode.name, "finite", None, None, finite, note))
    return rows


def plan_row(mode: Mode, plan: Any) -> Optional[Row]:
    """A mismatch row when the trainer's precision plan did not apply a key of the mode (it should, on this GPU)."""
    missing = [(k, why) for k, why in plan.not_applied if k in mode.config]
    if not missing:
        return None
    return Row(mode.name, "precision plan", None, None, False,
               "; ".join(f"{k} not applied: {why}" for k, why in missing))


def run(device: str, steps: int, seed: int) -> List[Row]:
    """Every mode that applies here against float32; the rows of the table."""
    import paddle

    from paddle_grpo.policy import load_policy

    paddle.set_device(device)
    modes: List[Tuple[Mode, Optional[str]]] = []
    if device == "cpu":
        modes = [(REPEAT, None)] + [(m, "--device cpu checks the plumbing only") for m in MODES]
    else:
        capability = tuple(paddle.device.cuda.get_device_capability())
        cuda = paddle.version.cuda()
        modes = [(m, applicable(m, capability, cuda)) for m in MODES]
    rows: List[Row] = []
    with tempfile.TemporaryDirectory(prefix="paddle_grpo_gpu_check_") as workdir:
        model_dir, data = build(workdir, seed)
        scorer = load_policy(model_dir, trainable=False)  # float32, the weights every mode starts from
        bound = logit_bound(scorer.model)
        values = base_config(model_dir, data, workdir, steps, seed)
        base, _ = run_mode({**values, "output_dir": os.path.join(workdir, "float32")}, steps, None)
        for mode, skip in modes:
            if skip:
                rows.append(Row(mode.name, "-", note=f"skipped: {skip}"))
                continue
            try:
                out = os.path.join(workdir, mode.name.replace(" ", "_"))
                cfg_values = {**values, **mode.config, "output_dir": out}
                rec, trainer = run_mode(cfg_values, steps, base)
                plan = plan_row(mode, trainer.precision)
                rows.extend([plan] if plan else check_mode(mode, rec, base, scorer, bound, steps))
                del trainer
            except Exception as e:  # a mode that fails to run is a mismatch, and the others still run
                rows.append(Row(mode.name, "ran", None, None, False, f"{type(e).__name__}: {e}"))
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=3, help="training steps per mode (default 3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                    help="cpu: the float32 baseline against itself, to test this tool (no GPU check)")
    args = ap.parse_args(argv)
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    if args.device == "gpu":
        reason = no_gpu_reason()
        if reason:
            print(f"gpu_check: no GPU to check: {reason}. Nothing was run (exit {EXIT_NO_GPU}).", file=sys.stderr)
            return EXIT_NO_GPU
    sys.path.insert(0, str(REPO))
    rows = run(args.device, args.steps, args.seed)
    print(table(rows))
    code = exit_code(rows)
    print(f"gpu_check: {'all checks passed' if code == EXIT_OK else 'MISMATCH'} ({args.device}, {args.steps} steps)")
    return code


if __name__ == "__main__":
    sys.exit(main())
