"""The dry run and the launch it prints: the thread counts the user set stay on the launch line, and a dry run under
paddle.distributed.launch checks the layout on the launch's own number of processes (as the run would), async
included. A real launch of two processes, real files."""
import os
import subprocess
import sys

import pytest

from dry_run_helpers import REPO, base_args, run_rl_main
from paddle_grpo.config import config_from_dict
from paddle_grpo.dry_run import check_layout, launch_command, launched_processes, started_environment


# 3 prompts x 2 samples: one process takes them, two cannot split 3 prompts.
GEOMETRY = {"global_batch_size": 3, "rollout_n": 2, "per_device_train_batch_size": 6,
            "per_device_logprob_batch_size": 6}


@pytest.fixture
def base(tmp_path, tiny_policy_dir):
    return base_args(tmp_path, tiny_policy_dir)


def test_the_launch_line_keeps_the_thread_counts_the_user_set():
    argv = ["cfg.yaml"]
    one, tp2 = config_from_dict({}), config_from_dict({"tensor_parallel_degree": 2})
    assert launch_command(one, argv, "cpu", environ={"OMP_NUM_THREADS": "2"}) == \
        "OMP_NUM_THREADS=2 python run_rl.py cfg.yaml"
    assert launch_command(tp2, argv, "cpu", environ={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}) == \
        'OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 python -m paddle.distributed.launch --devices "" --nproc_per_node 2 ' \
        "run_rl.py cfg.yaml"
    assert launch_command(one, argv, "cpu", environ={"PATH": "/bin"}) == "python run_rl.py cfg.yaml"


def test_the_environment_is_the_one_the_process_started_with(tmp_path):
    # paddle's import sets OMP_NUM_THREADS=1 in os.environ; the launch line must show what the user set, or nothing.
    script = ("import os, paddle\nfrom paddle_grpo.dry_run import started_environment\n"
              "print(os.environ.get('OMP_NUM_THREADS'), started_environment().get('OMP_NUM_THREADS'))")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = str(REPO)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["1", "None"], out.stderr[-2000:]
    assert started_environment().get("PATH") == os.environ.get("PATH")


def test_the_layout_is_checked_on_the_launchs_processes():
    assert launched_processes({"PADDLE_TRAINERS_NUM": "2"}) == 2 and launched_processes({}) is None
    cfg = config_from_dict(GEOMETRY)
    assert check_layout(cfg) == ([], 1)  # started on its own: one process fits
    problems, n = check_layout(cfg, launched=2)
    assert n == 2 and len(problems) == 1
    assert problems[0].startswith("this dry run runs under paddle.distributed.launch with 2 processes, where the run "
                                  "would stop: global_batch_size (3) must be divisible by the data-parallel degree 2")


def test_a_dry_run_under_a_two_process_launch_reports_what_the_run_would(base, tmp_path):
    # Before: both ranks printed "processes: 1" and "dry run: ok", and the real 2-rank run stopped on the batch
    # geometry; async with 2 ranks passed too. Now each rank's dry run checks 2 processes and exits 2.
    overrides = [x for key, value in {**GEOMETRY, "async_rollout": "true"}.items() for x in (f"--{key}", str(value))]
    logs = tmp_path / "logs"
    done = subprocess.run([sys.executable, "-m", "paddle.distributed.launch", "--devices", "", "--nproc_per_node", "2",
                           "--log_dir", str(logs), "run_rl.py", *map(str, base), *overrides, "--dry_run"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode != 0
    for rank in (0, 1):
        log = (logs / f"workerlog.{rank}").read_text()
        assert "processes: 2 = tensor_parallel_degree 1 x pipeline_parallel_degree 1 x data/sharding ranks 2 (this " \
               "dry run's own paddle.distributed.launch)" in log, log[-3000:]
        assert "with 2 processes, where the run would stop: global_batch_size (3) must be divisible by the " \
               "data-parallel degree 2" in log
        assert "key 'async_rollout' = True: this layout takes 2 processes" in log
        assert "dry run: 2 problem(s)" in log


def test_a_dry_run_on_its_own_is_unchanged(base, capsys, monkeypatch):
    monkeypatch.delenv("PADDLE_TRAINERS_NUM", raising=False)
    status, out, _ = run_rl_main([*base, "--dry_run"], capsys)
    assert status == 0 and "processes: 1 = " in out and "own paddle.distributed.launch" not in out, out
