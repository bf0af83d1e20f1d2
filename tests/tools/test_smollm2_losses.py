"""tools/eval/smollm2_losses.py on a run directory written here: the row it prints is computed by hand below."""
import importlib.util
import json
import pathlib

import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("_smollm2_losses", REPO / "tools" / "eval" / "smollm2_losses.py")
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


def write_run(directory: pathlib.Path, config: dict, rows: list) -> None:
    directory.mkdir()
    (directory / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_a_run_row_is_its_metrics(tmp_path):
    config = {"policy_loss": "cispo", "clip_range_ratio": 0.2, "clip_range_ratio_high": 4.0, "seed": 42,
              "global_mini_batch_size": 2, "update_iters": 2, "other_key": 1}
    rows = [{"step": 0, "eval/accuracy": 0.03}]
    for step in range(1, 7):  # rewards 0.25 each (8 of 32), 30 s a step, entropy 1..6; step 3 skipped its update
        row = {"step": step, "train/reward": 0.25, "perf/step_s": 30.0, "train/approx_kl_old": 0.01 * step}
        if step != 3:
            row.update({"train/entropy": float(step), "train/clip_frac_low": 0.02, "train/clip_frac_high": 0.04})
        rows.append(row)
    rows.append({"step": 6, "eval/accuracy": 0.5})
    write_run(tmp_path / "loss_cispo", config, rows)
    run = tool.collect_run(str(tmp_path / "loss_cispo"))
    assert run["name"] == "loss_cispo" and "other_key" not in run["config"]
    assert [s[0] for s in run["steps"]] == [1, 2, 3, 4, 5, 6] and run["steps"][2][3] is None
    # entropy of the steps that ran: 1, 2, 4, 5, 6 -> first 5 mean 3.6, last 5 the same; approx_kl mean 0.035;
    # 6 steps x 8 correct = 48 samples; 6 x 30 s = 3.0 minutes
    assert tool.row_cells(run, [0, 6]) == ["0.03 / 0.50", "48", "2.0 / 4.0", "3.60 -> 3.60", "0.035", "3.0"]
    assert tool.label(run) == "`cispo`, weight capped at 5"
    table = tool.tables({"runs": [run]})
    assert "| `cispo`, weight capped at 5 | 42 | 0.03 / 0.50 | 48 | 2.0 / 4.0 | 3.60 -> 3.60 | 0.035 | 3.0 |" in table
    assert "(of 192)" in table


def test_labels_name_the_settings_that_shape_each_loss():
    base = {k: None for k in tool.LOSS_KEYS}
    base.update(clip_range_ratio=0.2, sapo_temperature_pos=1.0, sapo_temperature_neg=1.05, kl_cov_ratio=0.0002,
                ppo_kl_coef=1.0)
    cases = {None: "unset (PPO clip, GRPO's), clip 0.2 / 0.2", "sapo": "`sapo`, temperatures 1 / 1.05",
             "kl_cov": "`kl_cov`, ratio 0.0002, coefficient 1"}
    for loss, expected in cases.items():
        assert tool.label({"config": {**base, "policy_loss": loss}}) == expected
    gspo = {**base, "policy_loss": "gspo", "clip_range_ratio": 0.0003, "clip_range_ratio_high": 0.0004}
    assert tool.label({"config": gspo}) == "`gspo`, clip 0.0003 / 0.0004"


def test_an_existing_results_file_is_never_overwritten(tmp_path, capsys):
    out = tmp_path / "r.json"
    out.write_text("{}", encoding="utf-8")
    write_run(tmp_path / "run", {"policy_loss": None}, [{"step": 0, "eval/accuracy": 0.0}])
    try:
        tool.main(["--collect", str(tmp_path / "run"), "--out", str(out)])
    except SystemExit as stop:
        assert stop.code == 2
    assert out.read_text(encoding="utf-8") == "{}" and "exists" in capsys.readouterr().err


def test_a_metrics_line_that_is_not_json_is_named(tmp_path):
    # tools/eval/run_metrics.py, which the three result tools read runs with: a truncated last line (a run killed
    # while writing) names the file and the line instead of a bare JSONDecodeError.
    write_run(tmp_path / "cut", {"policy_loss": "clip"}, [{"step": 1, "train/reward": 0.5, "perf/step_s": 1.0}])
    with open(tmp_path / "cut" / "metrics.jsonl", "a", encoding="utf-8") as f:
        f.write('{"step": 2, "train/rew')
    with pytest.raises(ValueError) as e:
        tool.collect_run(str(tmp_path / "cut"))
    assert str(e.value).startswith(f"{tmp_path / 'cut' / 'metrics.jsonl'}, line 2: not a JSON object"), e.value
