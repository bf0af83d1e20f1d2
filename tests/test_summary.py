"""The end-of-run summary: first, last and best evaluation from metrics.jsonl rows, and where things are."""
from paddle_grpo.summary import eval_key, format_summary, run_summary


ROWS = [{"step": 0, "eval/accuracy": 0.45, "eval/reward": 0.45}, {"step": 1, "train/reward": 0.4},
        {"step": 30, "eval/accuracy": 0.83, "train/reward": 0.7}, {"step": 60, "eval/accuracy": 0.8}]


def test_summary_takes_first_last_and_best_evaluation():
    s = run_summary(ROWS, output_dir="out/q", logging_dir="out/q/vdl", checkpoint="out/q/checkpoint-60",
                    wall_s=183.44, steps_this_run=60, last_step=60)
    assert s["eval"] == {"metric": "eval/accuracy", "first": 0.45, "first_step": 0, "last": 0.8, "last_step": 60,
                         "best": 0.83, "best_step": 30}
    text = format_summary(s)
    assert text.splitlines()[0] == "done: step 60 (60 steps in this run, 3 min 03 s)"
    assert "eval/accuracy: 0.450 at step 0 -> 0.800 at step 60 (+35.0 points; best 0.830 at step 30)" in text
    assert "checkpoint: out/q/checkpoint-60" in text
    assert "visualdl --logdir out/q/vdl --language en" in text
    assert ("python tools/plot_metrics.py out/q/metrics.jsonl --metrics eval/accuracy,train/reward "
            "--out out/q/plot.png") in text


def test_summary_without_eval_or_visualdl():
    assert eval_key([{"step": 1, "train/reward": 0.1}]) is None
    assert eval_key([{"step": 0, "eval/reward": 2.0}]) == "eval/reward"
    s = run_summary([{"step": 1}], output_dir="o", logging_dir="", checkpoint=None, wall_s=5, steps_this_run=1,
                    last_step=1)
    text = format_summary(s)
    assert "eval" not in s and "VisualDL" not in text and "checkpoint:" not in text
    assert "--metrics train/reward --out o/plot.png" in text


def test_summary_names_rollouts_jsonl_only_when_the_run_wrote_it(tmp_path):
    # a short run logs no sample completions: the summary must not send the user to a file that is not there
    args = dict(output_dir=str(tmp_path), logging_dir="", checkpoint=None, wall_s=5, steps_this_run=2, last_step=2)
    s = run_summary([{"step": 2}], **args)
    assert s["samples"] is None and "samples:" not in format_summary(s)
    (tmp_path / "rollouts.jsonl").write_text('{"step": 1, "kind": "rollout"}\n', encoding="utf-8")
    s = run_summary([{"step": 2}], **args)
    assert s["samples"] == str(tmp_path / "rollouts.jsonl")
    assert f"  samples:    {tmp_path / 'rollouts.jsonl'}" in format_summary(s)


def test_summary_states_how_busy_each_process_was():
    """CPU seconds per process over the wall time: 45 s and 20 s of CPU in a 50 s run are 90 % and 40 %."""
    s = run_summary([{"step": 1}], output_dir="o", logging_dir="", checkpoint=None, wall_s=50, steps_this_run=1,
                    last_step=1, cpu_s={"trainer": 45.0, "rollout worker": 20.0, "gone": None})
    assert s["busy"] == {"trainer": 0.9, "rollout worker": 0.4}
    assert "  busy:       trainer 90 %, rollout worker 40 % of the wall time (CPU time / wall)" in format_summary(s)
    assert "busy" not in run_summary([{"step": 1}], output_dir="o", logging_dir="", checkpoint=None, wall_s=5,
                                     steps_this_run=1, last_step=1)
