"""The precision plan on GPUs without bfloat16 / float16 AMP (review defect 4), decided on this CPU as a pure function
of the config and the device's `GpuInfo`. paddle's own check (paddle/amp/auto_cast.py, `_is_gpu_bfloat16_supported`
/ `_is_gpu_float16_supported`): bfloat16 needs compute capability >= 8.0 and CUDA >= 11 (or a ROCm build), float16
compute capability >= 7.0; without it `paddle.amp.auto_cast` turns itself off and `paddle.amp.decorate` returns
without float32 master weights. The plan must then say the run is float32, not claim master weights."""
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
    assert plan.model_flags == (("use_flash_attention", True),)  # the kernel flags are not an AMP matter
    reasons = dict(plan.not_applied)
    assert list(reasons)[:1] == ["bf16"] and gpu.name in reasons["bf16"]
    assert f"compute capability {gpu.capability[0]}.{gpu.capability[1]}" in reasons["bf16"]
    assert "float32" in reasons["bf16"]
    if level == "O2":
        assert set(reasons) == {"bf16", "fp16_opt_level", "amp_master_grad"}
    line = plan.describe()
    assert line.startswith("precision: float32 throughout, no AMP") and "master weights" not in line.split(";")[0]


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
