"""Newcomer finding 5: start-up printed `BatchGeometry(data_parallel_degree=1, ...)` and a `CPU tuning applied:
{...}` dict, and with output to a file the progress bar wrote 300 carriage-return updates onto one line. Each is
now one readable line, and without a terminal progress comes as plain lines."""
import re

from paddle_grpo.config import config_from_dict
from paddle_grpo.cpu_tuning import describe
from paddle_grpo.logging import MetricsLogger, PlainProgress


def test_batch_geometry_is_one_readable_line():
    # quickstart's numbers: 64 prompts x 8 samples on one rank, one mini-batch of 512 rows in micro-batches of 256
    cfg = config_from_dict({"global_batch_size": 64, "rollout_n": 8, "per_device_train_batch_size": 256})
    assert str(cfg.batch_geometry(1)) == (
        "1 data-parallel rank x 64 prompts x 8 samples = 512 sequences per rank per step; 1 optimizer step per step "
        "(1 mini-batch of 512 sequences per rank, 2 micro-batches each)")
    cfg = config_from_dict({"global_batch_size": 8, "global_mini_batch_size": 2, "rollout_n": 4, "update_iters": 2,
                            "per_device_train_batch_size": 4})
    assert str(cfg.batch_geometry(2)) == (
        "2 data-parallel ranks x 4 prompts x 4 samples = 16 sequences per rank per step; 8 optimizer steps per step "
        "(4 mini-batches of 4 sequences per rank, 1 micro-batch each)")


def test_cpu_tuning_is_one_readable_line():
    applied = {"MKL_DEBUG_CPU_TYPE": "5", "mallopt": {"mmap_threshold": 32 << 20, "trim_threshold": 1 << 30},
               "FLAGS_use_stride_kernel": False}
    assert describe(applied) == ("CPU tuning: MKL's AVX2 kernels on this AMD CPU (MKL_DEBUG_CPU_TYPE=5), malloc keeps "
                                 "blocks up to 32 MiB in the heap, paddle's stride kernels off "
                                 "(PADDLE_GRPO_CPU_TUNING=0 disables it)")
    assert describe({"MKL_DEBUG_CPU_TYPE": "7"}) == \
        "CPU tuning: MKL's AVX-512 kernels on this AMD CPU (MKL_DEBUG_CPU_TYPE=7) (PADDLE_GRPO_CPU_TUNING=0 disables it)"
    assert describe({"FLAGS_use_stride_kernel": False}) == \
        "CPU tuning: paddle's stride kernels off (PADDLE_GRPO_CPU_TUNING=0 disables it)"


def test_without_a_terminal_progress_is_plain_lines(tmp_path, capsys):
    # pytest's captured stderr is not a terminal, as a log file is not
    log = MetricsLogger(str(tmp_path / "out"), None, report_to="none", total_steps=90, initial_step=0)
    for step in range(1, 91):
        log.advance(step, {"train/reward": 0.5, "perf/step_s": 0.01})
    log.close()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert [int(re.match(r"train: step (\d+)/90 ", line).group(1)) for line in lines] == list(range(3, 91, 3))
    assert re.fullmatch(r"train: step 30/90 \(33%\), 0:00:\d\d elapsed, about 0:00:\d\d left: reward 0\.5, "
                        r"step_s 0\.01", lines[9]), lines[9]
    assert re.fullmatch(r"train: step 90/90 \(100%\), 0:00:\d\d elapsed: reward 0\.5, step_s 0\.01", lines[-1])


def test_plain_progress_prints_at_least_once_a_minute(capsys):
    now = [0.0]
    bar = PlainProgress(total=1000, initial=100, clock=lambda: now[0])  # a resumed run: 900 steps left
    for step in range(101, 106):
        now[0] += 30.0  # 30 s per step: lines at 60 s intervals although 33 steps would be the count
        bar.update_to(step, {"reward": "0.1"})
    lines = capsys.readouterr().err.splitlines()
    # steps 102 and 104 (60 s and 120 s after the last line); time left from this run's own pace: 30 s per step
    assert lines == ["train: step 102/1000 (10%), 0:01:00 elapsed, about 7:29:00 left: reward 0.1",
                     "train: step 104/1000 (10%), 0:02:00 elapsed, about 7:28:00 left: reward 0.1"]
