"""The precision plan on GPUs without bfloat16 / float16 AMP (review defect 4), decided on this CPU as a pure function
of the config and the device's `GpuInfo`. paddle's own check (paddle/amp/auto_cast.py, `_is_gpu_bfloat16_supported`
/ `_is_gpu_float16_supported`): bfloat16 needs compute capability >= 8.0 and CUDA >= 11 (or a ROCm build), float16
compute capability >= 7.0; without it `paddle.amp.auto_cast` turns itself off and `paddle.amp.decorate` returns
without float32 master weights. The plan must then say the run is float32, not claim master weights."""
import logging

import pytest

from paddle_grpo.config import Config
from paddle_grpo.precision import GpuInfo, plan_for_run, precision_plan

V100 = GpuInfo("Tesla V100-SXM2-16GB", (7, 0), "11.8")
T4 = GpuInfo("Tesla T4", (7, 5), "12.0")
P100 = GpuInfo("Tesla P100-PCIE-16GB", (6, 0), "11.2")
A100 = GpuInfo("NVIDIA A100-SXM4-40GB", (8, 0), "12.3")
A100_CUDA10 = GpuInfo("NVIDIA A100-SXM4-40GB", (8, 0), "10.2")
MI250 = GpuInfo("AMD Instinct MI250X", (9, 0), None, rocm=True)


@pytest.mark.parametrize("gpu, bf16, fp16", [(V100, False, True), (T4, False, True), (P100, False, False),
                                             (A100, True, True), (A100_CUDA10, False, True), (MI250, True, True)])
def test_what_each_gpu_supports_follows_paddles_check(gpu, bf16, fp16):
    assert (gpu.amp_unsupported("bfloat16") is None) is bf16
    assert (gpu.amp_unsupported("float16") is None) is fp16


@pytest.mark.parametrize("level", ["O1", "O2"])
@pytest.mark.parametrize("gpu", [V100, T4, A100_CUDA10], ids=["V100", "T4", "A100-CUDA10"])
def test_bf16_on_a_gpu_without_it_runs_float32_and_the_startup_line_says_so(gpu, level):
    cfg = Config(bf16=True, fp16_opt_level=level, amp_master_grad=level == "O2", use_flash_attention=True)
    plan = precision_plan(cfg, "gpu:0", gpu=gpu)
    assert plan.load_dtype == "float32" and not plan.uses_amp and not plan.decorate_o2 and not plan.master_grad
    assert plan.runtime() is None  # no autocast, no loss scale: what paddle would silently do, said out loud
    # None of these GPUs runs FlashAttention-2 (V100 and T4 below compute capability 8.0; the A100's CUDA 10.2 build
    # below 11.4): the flag is turned off, not passed to a model that would fail or silently fall back.
    assert plan.model_flags == ()
    reasons = dict(plan.not_applied)
    assert list(reasons)[:1] == ["bf16"] and gpu.name in reasons["bf16"]
    assert f"compute capability {gpu.capability[0]}.{gpu.capability[1]}" in reasons["bf16"]
    assert "float32" in reasons["bf16"]
    assert gpu.name in reasons["use_flash_attention"] and "FlashAttention-2" in reasons["use_flash_attention"]
    assert set(reasons) == {"bf16", "use_flash_attention"} | ({"fp16_opt_level", "amp_master_grad"} if level == "O2"
                                                              else set())
    line = plan.describe()
    assert line.startswith("precision: float32 throughout, no AMP, kernels: PaddleNLP defaults (gpu); not applied:")
    assert "master weights" not in line.split(";")[0] and f"use_flash_attention: {gpu.name}" in line


def test_fp16_on_a_v100_keeps_its_plan_and_on_a_p100_runs_float32():
    cfg = Config(fp16=True, fp16_opt_level="O2")
    v100 = precision_plan(cfg, "gpu", gpu=V100)
    assert v100 == precision_plan(cfg, "gpu")  # supported: the same plan as a GPU taken as capable
    assert v100.decorate_o2 and v100.loss_scaling and "float32 master weights" in v100.describe()
    p100 = precision_plan(cfg, "gpu", gpu=P100)
    assert not p100.uses_amp and not p100.loss_scaling and "compute capability 6.0" in dict(p100.not_applied)["fp16"]


def test_bf16_on_a_capable_gpu_is_unchanged():
    cfg = Config(bf16=True, fp16_opt_level="O2", amp_master_grad=True)
    assert precision_plan(cfg, "gpu", gpu=A100) == precision_plan(cfg, "gpu")
    assert precision_plan(cfg, "gpu", gpu=MI250).decorate_o2


def test_the_gpu_is_only_asked_about_on_a_gpu():
    # On the CPU the GPU description plays no part (and plan_for_run does not query paddle for one).
    assert precision_plan(Config(bf16=True), "cpu", gpu=A100) == precision_plan(Config(bf16=True), "cpu")
    assert plan_for_run(Config(bf16=True), "cpu", announce=False) == precision_plan(Config(bf16=True), "cpu")
    assert plan_for_run(Config(bf16=True), "gpu:0", gpu=V100, announce=False) == precision_plan(
        Config(bf16=True), "gpu", gpu=V100)


# The kernel flags' decision table, one row per (GPU, flag): which flags reach the model config. Written out by hand
# from Paddle's documented requirements (precision.KERNEL_NEEDS): flash attention needs compute capability >= 8.0 and
# a CUDA >= 11.4 build; fused_linear a CUDA >= 11.6 build; fused RMSNorm and fused RoPE document no limit; a ROCm
# build has its own flash attention.
H100 = GpuInfo("NVIDIA H100 80GB HBM3", (9, 0), "12.3")
A10_CUDA11_2 = GpuInfo("NVIDIA A10", (8, 6), "11.2")
NO_CUDA = GpuInfo("unknown", (8, 0), None)
KERNEL_TABLE = [
    # gpu,          flash, fused_linear, rms_norm, rope
    (V100,          False, True,         True,     True),
    (T4,            False, True,         True,     True),
    (P100,          False, False,        True,     True),  # its CUDA 11.2 build: below 11.6 too
    (A100,          True,  True,         True,     True),
    (H100,          True,  True,         True,     True),
    (A100_CUDA10,   False, False,        True,     True),
    (A10_CUDA11_2,  False, False,        True,     True),
    (NO_CUDA,       False, False,        True,     True),
    (MI250,         True,  True,         True,     True),
]
FLAG_ORDER = ("use_flash_attention", "use_fused_linear", "use_fused_rms_norm", "use_fused_rope")


@pytest.mark.parametrize("amp", [{}, {"bf16": True}, {"fp16": True, "fp16_opt_level": "O2"}], ids=["fp32", "bf16",
                                                                                                    "fp16-O2"])
@pytest.mark.parametrize("row", KERNEL_TABLE, ids=[r[0].name + "-" + str(r[0].cuda_version) for r in KERNEL_TABLE])
def test_the_kernel_flags_follow_what_each_gpu_can_run(row, amp):
    gpu, *runs = row
    plan = precision_plan(Config(**amp, **{k: True for k in FLAG_ORDER}), "gpu", gpu=gpu)
    want_on = [k for k, ok in zip(FLAG_ORDER, runs) if ok]
    assert plan.model_flags == tuple((k, True) for k in ("use_flash_attention", "use_fused_rms_norm", "use_fused_rope",
                                                         "use_fused_linear") if k in want_on)
    reasons = dict(plan.not_applied)
    for key in set(FLAG_ORDER) - set(want_on):  # every flag turned off says so, naming the GPU
        assert gpu.name in reasons[key] and "turned off" in reasons[key], key
    assert not set(want_on) & set(reasons)
    # The AMP decision is independent of the kernels: the same as for a plan without any flag.
    bare = precision_plan(Config(**amp), "gpu", gpu=gpu)
    assert (plan.amp_dtype, plan.load_dtype, plan.decorate_o2, plan.loss_scaling) == (
        bare.amp_dtype, bare.load_dtype, bare.decorate_o2, bare.loss_scaling)


def test_a_flag_turned_off_is_named_in_the_warning_line(caplog):
    with caplog.at_level(logging.INFO, logger="paddle_grpo.precision"):
        plan = plan_for_run(Config(fp16=True, use_flash_attention=True), "gpu:0", gpu=T4)
    assert plan.uses_amp and plan.model_flags == ()  # T4 runs float16 AMP, not FlashAttention-2
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert "not applied: use_flash_attention: Tesla T4 (compute capability 7.5, CUDA 12.0)" in record.getMessage()
    assert "compute capability >= 8.0" in record.getMessage()


def test_a_gpu_taken_as_capable_keeps_every_flag():
    # gpu=None is what the plan assumes without a GpuInfo (tests, dry runs): a GPU that runs everything.
    plan = precision_plan(Config(**{k: True for k in FLAG_ORDER}), "gpu")
    assert {k for k, _ in plan.model_flags} == set(FLAG_ORDER) and plan.not_applied == ()
