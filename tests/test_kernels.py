"""CI's second run of the numerically sensitive tests (`.ci/run`: `SETTINGS python -m pytest -m numerics`,
docs/platform.md "Other kernels on one machine") really runs other float kernels: the settings change a paddle
matmul and a numpy matmul here, and reach the processes the tests start (run_rl.py, paddle.distributed.launch
workers). Each test builds both environments itself, so neither needs to run inside the rerun."""
import json
import os
import re
import subprocess
import sys

import pytest
from launch_helpers import launch, run

RERUN = re.compile(r"^((?:[A-Z_]+=\S+ )+)python -m pytest -m numerics$", re.M)


def rerun_settings(repo_root):
    """{variable: value} of .ci/run's alternate-kernel rerun."""
    found = RERUN.findall((repo_root / ".ci" / "run").read_text(encoding="utf-8"))
    assert len(found) == 1, ".ci/run must rerun `python -m pytest -m numerics` once, with its settings before it"
    return dict(item.split("=", 1) for item in found[0].split())


def digest(repo_root, env):
    out = subprocess.run([sys.executable, str(repo_root / "tests" / "workers" / "kernel_digest.py")], env=env,
                         capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def cpu_flags():
    with open("/proc/cpuinfo") as f:
        text = f.read(1 << 16)
    return "AuthenticAMD" in text, " avx512f " in text


@pytest.fixture(scope="module")
def rerun_digest(repo_root):
    """(settings, digest of a process started with this environment plus the rerun's settings): both tests need it
    (each digest is a process importing paddle)."""
    settings = rerun_settings(repo_root)
    plain = {k: v for k, v in os.environ.items() if k not in settings}  # also when this runs inside the rerun
    return settings, digest(repo_root, {**plain, **settings})


def test_the_rerun_settings_select_other_kernels(repo_root, rerun_digest):
    settings, other = rerun_digest
    assert {"MKL_DEBUG_CPU_TYPE", "MKL_ENABLE_INSTRUCTIONS", "OPENBLAS_CORETYPE"} <= set(settings)
    plain = {k: v for k, v in os.environ.items() if k not in settings}
    default = digest(repo_root, plain)
    assert {k: other["env"][k] for k in settings} == settings
    # numpy's OpenBLAS picks its kernels by CPU at run time; OPENBLAS_CORETYPE forces the AVX (Sandy Bridge) ones.
    assert other["numpy_matmul"] != default["numpy_matmul"], (default, other)
    amd, avx512 = cpu_flags()
    if not (amd or avx512):
        pytest.skip("an Intel CPU without AVX-512: MKL's AVX2 kernels are already the default here")
    # AMD: cpu_tuning's MKL_DEBUG_CPU_TYPE=5 or 7 (AVX2, AVX-512) becomes 4 (AVX).
    # Intel with AVX-512: MKL_ENABLE_INSTRUCTIONS=AVX2.
    changed = [k for k in ("paddle_matmul", "paddle_backward", "paddle_softmax") if other[k] != default[k]]
    assert changed, (default, other)


def test_launched_workers_inherit_the_rerun_settings(repo_root, tmp_path, monkeypatch, rerun_digest):
    settings, expected = rerun_digest  # a process started with this environment and the settings
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    # launch_helpers.run is how the tests start run_rl.py and launches: it passes this process's environment on.
    run(launch(repo_root / "tests" / "workers" / "kernel_digest.py", tmp_path / "digest", log_dir=tmp_path / "log"),
        tmp_path)
    for rank in (0, 1):
        got = json.loads((tmp_path / f"digest.rank{rank}.json").read_text())
        assert got == expected, (rank, got, expected)
