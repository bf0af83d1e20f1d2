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
    assert (cpu["mkl"] == "5") == ("MKL_DEBUG_CPU_TYPE" in cpu["applied"])  # set on AMD CPUs only
