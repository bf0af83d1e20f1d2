"""Newcomer finding 1: `--output_dir X` alone left logging_dir at the config's `output/quickstart/vdl_log`, so a
second run's VisualDL record landed in the first run's folder, where VisualDL (one record per folder) showed only
one of them. Now a logging_dir inside the file's output_dir follows it, and a run never writes its record beside
another run's. Real config files, real VisualDL writer and reader."""
import logging
import os

import pytest

from paddle_grpo.config import parse_args
from paddle_grpo.logging import MetricsLogger

QUICKSTART = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "quickstart.yaml")


def test_a_logging_dir_inside_the_files_output_dir_follows_output_dir(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="paddle_grpo.config")
    assert parse_args([QUICKSTART]).logging_dir == "output/quickstart/vdl_log"
    cfg = parse_args([QUICKSTART, "--output_dir", str(tmp_path / "second")])
    assert cfg.logging_dir == str(tmp_path / "second" / "vdl_log")
    assert any(r.getMessage().startswith(f"logging_dir follows --output_dir: {tmp_path / 'second' / 'vdl_log'} (the "
                                         "file's output/quickstart/vdl_log lies inside its output_dir")
               for r in caplog.records)


def test_a_logging_dir_given_on_the_command_line_or_outside_output_dir_stays(tmp_path):
    given = parse_args([QUICKSTART, "--output_dir", str(tmp_path / "o"), "--logging_dir", str(tmp_path / "v")])
    assert given.logging_dir == str(tmp_path / "v")
    (tmp_path / "shared.yaml").write_text("output_dir: out/a\nlogging_dir: vdl_log\n", encoding="utf-8")
    assert parse_args([str(tmp_path / "shared.yaml"), "--output_dir", "out/b"]).logging_dir == "vdl_log"
    # the default output_dir counts as the file's: a logging_dir inside it follows too
    (tmp_path / "default_out.yaml").write_text("logging_dir: output/vdl\n", encoding="utf-8")
    assert parse_args([str(tmp_path / "default_out.yaml"), "--output_dir", "runs/b"]).logging_dir == "runs/b/vdl"


def runs_shown(logdir):
    """{run folder relative to logdir: [train/reward values]} as VisualDL's own reader lists them."""
    from visualdl import LogReader

    reader = LogReader(logdir=str(logdir))
    shown = {}
    for run, record in reader.logs().items():
        single = LogReader(file_path=os.path.join(run, record))
        shown[os.path.relpath(run, logdir)] = [d.value for d in single.get_data("scalar", "train/reward")]
    return shown


def write_run(out, logdir, rewards):
    """A run's VisualDL record with these train/reward values (started over: as with overwrite_output_dir, the
    history in metrics.jsonl is dropped first, so the record holds exactly `rewards`)."""
    if os.path.exists(out / "metrics.jsonl"):
        os.remove(out / "metrics.jsonl")
    log = MetricsLogger(str(out), str(logdir), report_to="visualdl", disable_tqdm=True)
    for step, reward in enumerate(rewards, start=1):
        log.log(step, {"train/reward": reward})
    log.close()


def test_two_runs_sharing_a_logging_dir_are_both_shown_and_the_second_says_so(tmp_path, caplog):
    vdl = tmp_path / "vdl"
    write_run(tmp_path / "a", vdl, [0.25, 0.5])
    with caplog.at_level(logging.WARNING, logger="paddle_grpo"):
        write_run(tmp_path / "b", vdl, [0.75])
    (warning,) = [r.getMessage() for r in caplog.records if "already holds another run's VisualDL record" in
                  r.getMessage()]
    assert warning.startswith(f"logging_dir {vdl} already holds another run's VisualDL record (vdlrecords.a-")
    shown = runs_shown(vdl)
    (sub,) = [k for k in shown if k != "."]
    assert sub.startswith("b-") and shown == {".": [0.25, 0.5], sub: [0.75]}
    # started again with the same output_dirs (a resume), each run rewrites its own record, in its own place
    caplog.clear()
    write_run(tmp_path / "b", vdl, [0.75, 1.0])
    write_run(tmp_path / "a", vdl, [0.25, 0.5, 0.125])
    assert runs_shown(vdl) == {".": [0.25, 0.5, 0.125], sub: [0.75, 1.0]}
    assert not any("another run's" in r.getMessage() for r in caplog.records)
    assert sorted(os.listdir(vdl / sub)) == [f for f in os.listdir(vdl / sub) if f.startswith("vdlrecords")]


@pytest.mark.parametrize("run_name", ["", "exp1"])
def test_one_run_alone_writes_at_the_top_of_logging_dir(tmp_path, run_name):
    log = MetricsLogger(str(tmp_path / "out"), str(tmp_path / "vdl"), report_to="visualdl", run_name=run_name,
                        disable_tqdm=True)
    log.log(1, {"train/reward": 0.5})
    log.close()
    top = tmp_path / "vdl" / run_name if run_name else tmp_path / "vdl"
    (record,) = [f for f in os.listdir(top) if f.startswith("vdlrecords")]
    assert record.startswith("vdlrecords.out-") and sorted(os.listdir(top)) == [record]  # no subfolder
