"""tools/gpu_check.py on a machine without a GPU: it imports without paddle and refuses with exit 77 and a clear
message; its decision logic (which modes a GPU can run), tolerance table, comparison and exit code, against values
worked out by hand; the precision plan's refusal as a mismatch row; and its plumbing end to end on the CPU
(`--device cpu`: the float32 baseline against itself through the real Trainer)."""
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check(load_tool):
    return load_tool("gpu_check")


def test_import_does_not_load_paddle():
    code = f"import sys; sys.path.insert(0, {str(REPO / 'tools')!r}); import gpu_check; print('paddle' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr


def test_refuses_cleanly_without_a_gpu(gpu_check):
    import paddle

    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0:
        pytest.skip("this machine has a GPU: the refusal does not apply")
    out = subprocess.run([sys.executable, str(TOOL)], capture_output=True, text=True, timeout=300)
    assert out.returncode == gpu_check.EXIT_NO_GPU == 77
    assert out.stdout == ""  # no table: nothing was checked
    assert "gpu_check: no GPU to check: paddle" in out.stderr and "Nothing was run (exit 77)" in out.stderr


def test_which_modes_apply(gpu_check):
    by_name = {m.name: m for m in gpu_check.MODES}

    def skipped(capability, cuda):
        return {name for name, m in by_name.items() if gpu_check.applicable(m, capability, cuda)}

    bf16 = {"bf16 O1", "bf16 O2", "bf16 O2 + flash attention"}
    fp16 = {"fp16 O1 + loss scale", "fp16 O2 + loss scale"}
    assert skipped((8, 0), "11.8") == set()               # A100
    assert skipped((9, 0), "12.4") == set()               # H100
    assert skipped((7, 5), "12.0") == bf16                # T4: float16 only
    assert skipped((7, 0), "11.2") == bf16                # V100
    assert skipped((6, 1), "11.2") == bf16 | fp16         # P40: neither AMP dtype; the fused kernels still run
    assert skipped((8, 6), "10.2") == bf16                # bfloat16 also needs CUDA 11
    assert skipped((8, 0), "11.2") == {"bf16 O2 + flash attention"}  # flash attention: CUDA 11.4
    assert skipped((8, 0), "11.4") == set()
    assert skipped((8, 0), None) == bf16
    why = gpu_check.applicable(by_name["bf16 O2 + flash attention"], (7, 5), "12.0")
    assert why == ("paddle's flash attention (FlashAttention-2) needs compute capability >= 8.0 and CUDA >= 11.4 "
                   "(this GPU: compute capability 7.5, CUDA 12.0)")
    assert gpu_check.applicable(by_name["bf16 O1"], (8, 6), "10.2") == \
        "bfloat16 needs compute capability >= 8.0 and CUDA >= 11 (this GPU: compute capability 8.6, CUDA 10.2)"


def test_the_same_rules_as_the_precision_plan(gpu_check):
    """Where precision.py describes the GPU (GpuInfo: the plan's own rules, issue 22), a mode runs exactly when the
    plan would apply all of its keys on that GPU."""
    from paddle_grpo import precision

    gpu_info = getattr(precision, "GpuInfo", None)
    if gpu_info is None:
        pytest.skip("this precision.py has no GpuInfo: the plan does not look at the GPU's capability")
    dtypes = {"bf16": "bfloat16", "fp16": "float16"}
    for capability in ((6, 1), (7, 0), (7, 5), (8, 0), (8, 6), (9, 0)):
        for cuda in ("10.2", "11.2", "11.4", "12.4", None):
            gpu = gpu_info("test GPU", capability, cuda)
            for mode in gpu_check.MODES:
                refused = [k for k in mode.config if k in dtypes and gpu.amp_unsupported(dtypes[k])] + \
                    [k for k in mode.config if k.startswith("use_") and gpu.kernel_unsupported(k)]
                assert (gpu_check.applicable(mode, capability, cuda) is None) == (not refused), \
                    (mode.name, capability, cuda, refused)


def test_tolerances_by_hand(gpu_check):
    modes = {m.name: m for m in gpu_check.MODES}
    # 4 (margin) x 2 (log-prob = logit - logsumexp) x u x sqrt(10 L + 2) x bound, L = 2 -> sqrt(22) = 4.690415760
    assert gpu_check.logprob_tolerance(modes["bf16 O2"], 2, 64, 1.5) == pytest.approx(
        4 * 2 * 0.00390625 * 4.690415760 * 1.5, rel=1e-9)                          # = 0.2198632...
    assert gpu_check.logprob_tolerance(modes["fp16 O1 + loss scale"], 2, 64, 1.5) == pytest.approx(
        4 * 2 * 0.00048828125 * 4.690415760 * 1.5, rel=1e-9)
    # float32 kernels summing in another order: u x H per rounding
    assert gpu_check.logprob_tolerance(modes["float32 + fused kernels"], 2, 64, 1.5) == pytest.approx(
        4 * 2 * 5.9604644775e-08 * 64 * 4.690415760 * 1.5, rel=1e-9)
    # relative grad norm: 4 x u x sqrt(2 x 22) = 4 x u x 6.633249581
    assert gpu_check.grad_norm_tolerance(modes["bf16 O1"], 2, 64) == pytest.approx(4 * 0.00390625 * 6.633249581,
                                                                                    rel=1e-9)
    # Adam, beta1 0.9, beta2 0.999: per step at most lr x 0.1 / sqrt(0.001) = 3.16227766 lr; two runs, 3 steps
    assert gpu_check.adam_bound(1e-3, 3) == pytest.approx(2 * 3.16227766e-3 * 3, rel=1e-8)
    assert gpu_check.adam_bound(1e-3, 1, beta1=0.99, beta2=0.9) == pytest.approx(2e-3)  # 0.01 / 0.316 < 1: lr


def test_comparison_and_exit_code(gpu_check):
    a, b = np.array([[0.0, 1.0], [2.0, 3.0]]), np.array([[0.5, 1.0], [2.0, 2.0]])
    assert gpu_check.max_abs_diff(a, b) == 1.0
    assert gpu_check.max_abs_diff(a, b, [[1, 1], [1, 0]]) == 0.5     # the masked-out position is not compared
    assert gpu_check.max_abs_diff(a, b, [[0, 0], [0, 0]]) == 0.0
    assert gpu_check.max_abs_diff([np.nan, 1.0], [0.0, 1.0], [0, 1]) == 0.0
    assert gpu_check.max_abs_diff([np.nan, 1.0], [0.0, 1.0]) == math.inf
    ok, bad = gpu_check.compare("m", "c", 0.1, 0.1), gpu_check.compare("m", "c", 0.2, 0.1)
    nan = gpu_check.compare("m", "c", float("nan"), 1.0)
    assert (ok.ok, bad.ok, nan.ok) == (True, False, False)
    skip = gpu_check.Row("m", "-", note="skipped: x")
    assert gpu_check.exit_code([ok, skip]) == 0 and gpu_check.exit_code([ok, skip, bad]) == 1
    text = gpu_check.table([ok, bad, skip])
    assert text.splitlines()[2] == "| m | c | 0.1 | 0.1 | ok |  |"
    assert text.splitlines()[3] == "| m | c | 0.2 | 0.1 | MISMATCH |  |"
    assert text.splitlines()[4] == "| m | - |  |  | skip | skipped: x |"


def test_a_mode_the_plan_does_not_apply_is_a_mismatch(gpu_check):
    """The product's own plan (precision.precision_plan) on a CPU refuses bf16: the row says so and fails."""
    from paddle_grpo.config import config_from_dict
    from paddle_grpo.precision import precision_plan

    mode = next(m for m in gpu_check.MODES if m.name == "bf16 O2")
    row = gpu_check.plan_row(mode, precision_plan(config_from_dict(mode.config), "cpu"))
    assert row.ok is False and row.check == "precision plan"
    assert row.note.startswith("bf16 not applied: paddle has no bfloat16 matmul kernel on CPU")
    assert gpu_check.plan_row(gpu_check.BASELINE, precision_plan(config_from_dict({}), "cpu")) is None


def test_plumbing_on_the_cpu():
    """`--device cpu`: the float32 baseline against itself, through Trainer, replayed batches and the hooks: every
    difference is 0 (same process, same kernels) except the rollout's decode against the full forward, and every
    row passes; the GPU modes are listed as skipped."""
    out = subprocess.run([sys.executable, str(TOOL), "--device", "cpu", "--steps", "2"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr[-3000:]
    rows = [line.split("|")[1:-1] for line in out.stdout.splitlines() if line.startswith("| float32 (again)")]
    values = {r[1].strip(): (r[2].strip(), r[4].strip()) for r in rows}
    assert values["reference log-probs"] == ("0", "ok")
    assert values["grad norm (relative)"] == ("0", "ok")
    assert values["moved (L1, mode / float32)"] == ("1", "ok")
    assert values["weights vs float32 (max abs)"] == ("0", "ok")
    assert values["rollout log-probs"][1] == "ok" and values["finite"] == ("", "ok")
    assert out.stdout.count("skipped: --device cpu checks the plumbing only") == 6
    assert out.stdout.strip().endswith("gpu_check: all checks passed (cpu, 2 steps)")
