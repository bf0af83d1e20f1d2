"""tools/eval/regression_snapshot.py: the comparison of two snapshots (the runs themselves take minutes: opt-in)."""
import json


def test_compare_reports_identical_runs_and_the_first_difference(load_tool, tmp_path):
    tool = load_tool("eval/regression_snapshot")
    rows = [{"step": 1, "train/reward": 0.5, "train/kl": 0.01}, {"step": 2, "train/reward": 0.625}]
    changed = [dict(rows[0]), {"step": 2, "train/reward": 0.6250001}]
    before = {"runs": {"quickstart": rows, "dp2": rows}}
    after = {"runs": {"quickstart": rows, "dp2": changed, "reinforce_pp": rows}}
    assert tool.compare(before, after) == [
        "dp2: DIFFERENT: step 2, train/reward: 0.625 vs 0.6250001",
        "quickstart: identical (2 rows, 3 values)",
        "reinforce_pp: only in the second snapshot",
    ]
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(before))
    b.write_text(json.dumps({"runs": {"quickstart": rows, "dp2": rows}}))
    assert tool.main(["compare", str(a), str(b)]) == 0
    b.write_text(json.dumps(after))
    assert tool.main(["compare", str(a), str(b)]) == 1
