"""cpu_tuning (review defect 8): its process-wide settings (MKL's code path, glibc malloc thresholds, paddle's stride
kernels) are for CPU runs; a GPU process must keep paddle's and the user's settings. The decision is a pure function
of the device and PADDLE_GRPO_CPU_TUNING; `apply()` is checked in fresh processes (it applies once per process)."""
import json
import os
import subprocess
import sys

import pytest

from paddle_grpo import cpu_tuning


@pytest.mark.parametrize("device, choice, expected", [
    ("cpu", "1", {"mkl", "malloc", "stride"}),
    ("cpu", "mkl,stride", {"mkl", "stride"}),
    ("cpu", "0", set()),
    ("gpu", "1", set()),
    ("gpu:0", "1", set()),
    ("gpu:1", "mkl,malloc", set()),
    ("xpu:0", "1", set()),
])
def test_the_settings_apply_on_cpu_only(device, choice, expected):
    assert cpu_tuning.wanted(device, choice) == expected


ZEN5 = {"avx2", "fma", "avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"}


@pytest.mark.parametrize("vendor, flags, expected", [
    ("AuthenticAMD", ZEN5, "7"),                                  # every subset MKL's AVX-512 kernels execute
    ("AuthenticAMD", ZEN5 - {"avx512vl"}, "5"),                   # one missing: they would fault, AVX2 instead
    ("AuthenticAMD", ZEN5 - {"avx512bw"}, "5"),
    ("AuthenticAMD", {"avx2", "fma"}, "5"),                       # the AVX2-only EPYC of earlier records
    ("AuthenticAMD", {"avx", "sse4_2"}, None),                    # no AVX2: MKL_DEBUG_CPU_TYPE=5 would fault
    ("GenuineIntel", ZEN5, None),                                 # MKL picks Intel's kernels by itself
    ("GenuineIntel", {"avx2", "fma"}, None),
    (None, ZEN5, None),                                           # no /proc/cpuinfo
])
def test_mkl_gets_the_widest_kernels_the_cpu_runs(vendor, flags, expected):
    assert cpu_tuning.mkl_cpu_type(vendor, flags) == expected


def this_cpu_mkl_type():
    """The MKL_DEBUG_CPU_TYPE expected on this machine, read from /proc/cpuinfo here, not by cpu_tuning."""
    with open("/proc/cpuinfo") as f:
        first = f.read(1 << 16).split("\n\n")[0]
    flags = set(next(line for line in first.splitlines() if line.startswith("flags")).split(":", 1)[1].split())
    if "AuthenticAMD" not in first or not {"avx2", "fma"} <= flags:
        return None
    return "7" if {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags else "5"


APPLY_ON = """
import json, os, sys
import paddle
paddle.get_device = lambda: sys.argv[1]   # what the process would report on that device
from paddle_grpo import cpu_tuning
applied = cpu_tuning.apply()
stride = paddle.get_flags(["FLAGS_use_stride_kernel"])["FLAGS_use_stride_kernel"]
print(json.dumps({"applied": applied, "stride": stride, "mkl": os.environ.get("MKL_DEBUG_CPU_TYPE")}))
"""


def run_apply(device: str, repo_root) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MKL_DEBUG_CPU_TYPE", "FLAGS_use_stride_kernel", "PADDLE_GRPO_CPU_TUNING")}
    out = subprocess.run([sys.executable, "-c", APPLY_ON, device], capture_output=True, text=True, env=env,
                         cwd=repo_root, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_gpu_process_changes_no_process_wide_setting(repo_root):
    gpu = run_apply("gpu:0", repo_root)
    assert gpu == {"applied": {}, "stride": True, "mkl": None}  # paddle's default stride kernels stay on


def test_a_cpu_process_is_tuned(repo_root):
    cpu = run_apply("cpu", repo_root)
    assert cpu["applied"].get("FLAGS_use_stride_kernel") is False and cpu["stride"] is False
    assert cpu["mkl"] == cpu["applied"].get("MKL_DEBUG_CPU_TYPE") == this_cpu_mkl_type()  # AMD CPUs only


TOO_LATE = """
import json, sys
import paddle
if sys.argv[1] == "matmul first":
    a = paddle.ones([8, 8])
    paddle.matmul(a, a)               # MKL picks its code path here, reading MKL_DEBUG_CPU_TYPE once
from paddle_grpo import cpu_tuning
print(json.dumps({"applied": cpu_tuning.apply("cpu"), "report": cpu_tuning.kernel_report()}))
"""


def run_too_late(order: str, repo_root) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_DEBUG_CPU_TYPE", "PADDLE_GRPO_CPU_TUNING")}
    out = subprocess.run([sys.executable, "-c", TOO_LATE, order], capture_output=True, text=True, env=env,
                         cwd=repo_root, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_mkl_path_is_reported_as_it_is(repo_root):
    """MKL reads MKL_DEBUG_CPU_TYPE at its first call only: after a matmul, apply() cannot change its path any more
    and must not claim it did (it reported MKL_DEBUG_CPU_TYPE=5 while MKL ran its generic kernels, ~4x slower
    GEMMs on the AMD EPYC)."""
    expected = this_cpu_mkl_type()
    if expected is None:
        pytest.skip("MKL_DEBUG_CPU_TYPE is set on AMD CPUs with AVX2 only")
    first = run_too_late("apply first", repo_root)
    assert first["applied"]["MKL_DEBUG_CPU_TYPE"] == expected
    assert first["report"]["mkl_code_path"] == {"5": "AVX2", "7": "AVX-512"}[expected]
    late = run_too_late("matmul first", repo_root)
    assert "MKL_DEBUG_CPU_TYPE" not in late["applied"], late
    assert late["applied"]["mkl_too_late"] == late["report"]["mkl_code_path"] == "generic"
    assert "generic kernels (it was called before the tuning)" in cpu_tuning.describe(late["applied"])


def test_the_kernel_report_names_this_cpu():
    report = cpu_tuning.kernel_report()
    with open("/proc/cpuinfo") as f:
        text = f.read(1 << 16)
    assert report["cpu"]["vendor"] in text and ("avx512f" in report["cpu"]["isa"]) == (" avx512f " in text)
    assert report["mkl_code_path"] in cpu_tuning.MKL_CODE_PATHS.values()
    family = [line.split(":")[1].strip() for line in text.splitlines() if line.startswith("cpu family")][:1]
    assert [report["cpu"]["family"]] == family  # Zen 4 (25) and Zen 5 (26) differ in AVX-512 width
