"""An output_dir that already holds a run: resumed from its latest checkpoint, replaced with overwrite_output_dir,
or refused; metrics.jsonl never holds two histories and no checkpoint is replaced silently.

Unit tests of paddle_grpo.run.directory on real files, then the real trainer run twice into the same directory.
"""
import json
import os

import pytest

from paddle_grpo.run import directory as run_dir
from paddle_grpo.config import ConfigError, config_from_dict
from paddle_grpo.data import read_json_rows
from paddle_grpo.trainer import Trainer, train


def _jsonl(path, steps):
    with open(path, "w", encoding="utf-8") as f:
        for s in steps:
            f.write(json.dumps({"step": s, "train/reward": s / 10}) + "\n")


def _checkpoint(out, step, full=True):
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps({"step": step, "full": full}))
    return str(d)


def test_empty_or_missing_dir_starts_fresh(tmp_path):
    assert run_dir.plan(str(tmp_path / "nope"), None, False) == run_dir.RunDirPlan()
    (tmp_path / "notes.txt").write_text("the user's own file")  # not a run's file: no reason to refuse
    assert run_dir.plan(str(tmp_path), None, False).resume is None


def test_a_run_without_checkpoint_is_refused_naming_overwrite_output_dir(tmp_path):
    _jsonl(tmp_path / "metrics.jsonl", [0, 1, 2])
    with pytest.raises(ConfigError, match=r"already holds a run \(metrics.jsonl\).*overwrite_output_dir: true"):
        run_dir.plan(str(tmp_path), None, False)
    with pytest.raises(ConfigError, match="resume_from_checkpoint is false"):
        run_dir.plan(str(tmp_path), False, False)


def test_latest_checkpoint_is_resumed_and_later_rows_dropped(tmp_path):
    _checkpoint(tmp_path, 2)
    latest = _checkpoint(tmp_path, 4)
    _jsonl(tmp_path / "metrics.jsonl", [0, 1, 2, 3, 4, 5, 6])   # crashed after step 6, last save at 4
    _jsonl(tmp_path / "rollouts.jsonl", [1, 5])
    p = run_dir.plan(str(tmp_path), None, False)
    assert p.resume == latest and p.remove == [] and "resuming from" in p.reason
    run_dir.apply(p, str(tmp_path))
    assert [r["step"] for r in read_json_rows(str(tmp_path / "metrics.jsonl"))] == [0, 1, 2, 3, 4]
    assert [r["step"] for r in read_json_rows(str(tmp_path / "rollouts.jsonl"))] == [1]
    assert os.path.isdir(tmp_path / "checkpoint-2")


def test_model_only_checkpoint_cannot_be_resumed(tmp_path):
    _checkpoint(tmp_path, 3, full=False)
    with pytest.raises(ConfigError, match="ignore_save_lr_and_optim: true, so it cannot be resumed"):
        run_dir.plan(str(tmp_path), None, False)


def test_overwrite_deletes_only_the_previous_runs_files(tmp_path):
    _checkpoint(tmp_path, 2)
    (tmp_path / ".tmp-checkpoint-3").mkdir()
    _jsonl(tmp_path / "metrics.jsonl", [0, 1, 2])
    (tmp_path / "config.yaml").write_text("seed: 1\n")
    (tmp_path / "notes.txt").write_text("kept")
    p = run_dir.plan(str(tmp_path), None, True)
    assert p.resume is None and "overwrite_output_dir: deleting" in p.reason
    run_dir.apply(p, str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]


def test_explicit_resume_wins_over_overwrite(tmp_path):
    latest = _checkpoint(tmp_path, 2)
    assert run_dir.plan(str(tmp_path), True, True).resume == latest
    assert run_dir.plan(str(tmp_path), latest, False).resume == latest


def test_truncate_after_keeps_a_file_without_later_rows_untouched(tmp_path):
    path = tmp_path / "m.jsonl"
    _jsonl(path, [0, 1])
    before = os.stat(path).st_mtime_ns
    assert run_dir.truncate_after(str(path), 5) == 0 and os.stat(path).st_mtime_ns == before
    assert run_dir.truncate_after(str(tmp_path / "missing.jsonl"), 5) == 0


# ---------------------------------------------------------------------------------------- the real trainer


def _cfg(tiny_policy_dir, data, out, **overrides):
    values = dict(actor_model_name_or_path=tiny_policy_dir, use_rm_server=False, reward_funcs="length_similarity",
                  train_datasets=str(data), output_dir=str(out), logging_dir=str(out / "vdl"), max_prompt_len=24,
                  max_dec_len=6, min_dec_len=1, max_length=32, global_batch_size=2, rollout_n=2,
                  per_device_train_batch_size=4, per_device_logprob_batch_size=4, learning_rate=1e-3,
                  max_steps=2, save_steps=2, kl_coeff=0.0, disable_tqdm=True, seed=3)
    values.update(overrides)
    return config_from_dict(values)


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "train.jsonl"
    with open(path, "w") as f:
        for i in range(8):
            f.write(json.dumps({"src": f"say something {i}", "tgt": "something short"}) + "\n")
    return path


def test_rerunning_a_command_resumes_and_keeps_one_history(tiny_policy_dir, data, tmp_path, capsys):
    out = tmp_path / "run"
    assert train(_cfg(tiny_policy_dir, data, out)) == 0
    first = read_json_rows(str(out / "metrics.jsonl"))
    assert [r["step"] for r in first] == [1, 2]
    ckpt_files = {f: os.stat(out / "checkpoint-2" / f).st_mtime_ns for f in os.listdir(out / "checkpoint-2")}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["last_step"] == 2 and summary["steps_this_run"] == 2
    assert summary["checkpoint"] == str(out / "checkpoint-2")

    # The same command again: the finished run is resumed at step 2, nothing trains, nothing is rewritten.
    assert train(_cfg(tiny_policy_dir, data, out)) == 0
    assert read_json_rows(str(out / "metrics.jsonl")) == first
    assert {f: os.stat(out / "checkpoint-2" / f).st_mtime_ns for f in os.listdir(out / "checkpoint-2")} == ckpt_files
    assert json.loads((out / "summary.json").read_text()) == summary
    assert "done: step 2 (0 steps in this run" in capsys.readouterr().out

    # More steps: continues from step 2; steps 3-4 are appended once, and the step-2 rows are the first run's.
    assert train(_cfg(tiny_policy_dir, data, out, max_steps=4)) == 0
    rows = read_json_rows(str(out / "metrics.jsonl"))
    assert [r["step"] for r in rows] == [1, 2, 3, 4] and rows[:2] == first
    assert os.path.isdir(out / "checkpoint-4")
    saved = (out / "config.yaml").read_text()
    assert "max_steps: 4" in saved and "overwrite_output_dir: false" in saved


def test_overwrite_output_dir_starts_over_with_one_history(tiny_policy_dir, data, tmp_path):
    out = tmp_path / "run"
    assert train(_cfg(tiny_policy_dir, data, out, max_steps=4)) == 0
    assert train(_cfg(tiny_policy_dir, data, out, overwrite_output_dir=True)) == 0
    assert [r["step"] for r in read_json_rows(str(out / "metrics.jsonl"))] == [1, 2]
    assert sorted(p for p in os.listdir(out) if p.startswith("checkpoint-")) == ["checkpoint-2"]


def test_a_crashed_run_without_checkpoint_is_refused_before_loading_anything(tiny_policy_dir, data, tmp_path):
    out = tmp_path / "run"
    assert train(_cfg(tiny_policy_dir, data, out, save_strategy="no")) == 0
    before = (out / "metrics.jsonl").read_text()
    with pytest.raises(ConfigError, match="overwrite_output_dir"):
        Trainer(_cfg(tiny_policy_dir, data, out, save_strategy="no"))
    assert (out / "metrics.jsonl").read_text() == before


def _vdl_history(out):
    """(record files, [(step, train/reward)], number of sample cards at step 1) of the run's VisualDL record."""
    import glob

    from visualdl import LogReader

    files = glob.glob(str(out / "vdl" / "vdlrecords*"))
    reader = LogReader(file_path=files[0])
    scalars = [(d.id, d.value) for d in reader.get_data("scalar", "train/reward")]
    cards = [t for t in reader.get_tags().get("text", []) if t.startswith("samples/rollout/")]
    return files, scalars, cards


def test_visualdl_record_holds_one_history_after_resume_and_overwrite(tiny_policy_dir, data, tmp_path):
    out = tmp_path / "run"
    common = dict(report_to="visualdl", logging_steps=1)
    assert train(_cfg(tiny_policy_dir, data, out, **common)) == 0
    _, first, cards = _vdl_history(out)
    assert [s for s, _ in first] == [1, 2] and cards
    assert train(_cfg(tiny_policy_dir, data, out, max_steps=4, **common)) == 0
    files, resumed, cards_after = _vdl_history(out)
    rows = read_json_rows(str(out / "metrics.jsonl"))
    assert len(files) == 1  # one record file per output_dir, rewritten from metrics.jsonl at every start
    # VisualDL stores float32: one rounding, u = 6e-8 relative
    assert resumed == [(r["step"], pytest.approx(r["train/reward"], rel=1e-6)) for r in rows]
    assert [s for s, _ in resumed] == [1, 2, 3, 4] and resumed[:2] == first
    assert cards_after == cards
    assert train(_cfg(tiny_policy_dir, data, out, overwrite_output_dir=True, **common)) == 0
    files, fresh, _ = _vdl_history(out)
    assert len(files) == 1 and [s for s, _ in fresh] == [1, 2]
