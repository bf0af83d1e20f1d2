"""tools/plot_metrics.py: a PNG with real content from metrics.jsonl files; loud errors on bad input."""
import json

import numpy as np
import pytest


def _write_metrics(path, slope):
    with open(path, "w") as f:
        for step in range(0, 41):
            row = {"step": step, "train/reward": 0.3 + slope * step + 0.05 * np.sin(step)}
            if step % 10 == 0:
                row["eval/accuracy"] = 0.4 + slope * step
                row["eval/note"] = "nan"  # non-numeric values are skipped
            f.write(json.dumps(row) + "\n")


def test_png_is_written_and_non_trivial(load_tool, tmp_path):
    tool = load_tool("plot_metrics")
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write_metrics(a, 0.01)
    _write_metrics(b, 0.0)
    out = tmp_path / "img" / "plot.png"
    assert tool.main([str(a), str(b), "--labels", "learn,flat", "--metrics", "eval/accuracy,train/reward",
                      "--smooth", "5", "--out", str(out)]) == 0
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    import matplotlib.image

    pixels = matplotlib.image.imread(str(out))
    assert pixels.shape[0] > 300 and pixels.shape[1] > 300
    # Lines in two colours on a white background: many distinct colours, not a blank canvas.
    assert len(np.unique(pixels.reshape(-1, pixels.shape[-1]), axis=0)) > 50


def test_read_metrics_keeps_numbers_only(load_tool, tmp_path):
    path = tmp_path / "m.jsonl"
    _write_metrics(path, 0.01)
    series = load_tool("plot_metrics").read_metrics(str(path))
    assert series["eval/accuracy"][0] == [0, 10, 20, 30, 40]
    assert "eval/note" not in series and len(series["train/reward"][0]) == 41


def test_errors_are_reported(load_tool, tmp_path, capsys):
    tool = load_tool("plot_metrics")
    path = tmp_path / "m.jsonl"
    _write_metrics(path, 0.01)
    assert tool.main([str(path), "--metrics", "no/such", "--out", str(tmp_path / "x.png")]) == 2
    assert "none of the metrics no/such" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"step": 1}\nnot json\n')
    assert tool.main([str(bad), "--out", str(tmp_path / "y.png")]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    with pytest.raises(ValueError, match="2 labels for 1"):
        tool.plot([str(path)], ["train/reward"], str(tmp_path / "z.png"), labels=["a", "b"])
