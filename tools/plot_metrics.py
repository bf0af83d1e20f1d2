"""Plot metrics from one or more `metrics.jsonl` files (written by the trainer) into a PNG.

    python tools/plot_metrics.py output/quickstart/metrics.jsonl --metrics eval/accuracy,train/reward --out output/quickstart/plot.png
    python tools/plot_metrics.py runA/metrics.jsonl runB/metrics.jsonl --labels "lr 3e-4,lr 0" \
        --metrics eval/accuracy --out compare.png

One panel per metric (x: step), one line per file; a metric logged only on some steps (eval/*) is drawn with
markers. `--smooth N` adds a trailing moving average over N logged points to noisy per-step metrics (the raw line
stays, faint). Non-numeric values ("nan" strings) are skipped. Uses matplotlib's Agg backend: no display needed.
Left out on purpose: VisualDL logs (use `visualdl --logdir`), interactive plots, and several metrics in one panel.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys


def read_metrics(path):
    """{metric: ([steps], [values])} from a metrics.jsonl; lines that are not JSON objects are an error."""
    series = {}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not JSON ({e.msg})") from None
            if not isinstance(row, dict) or "step" not in row:
                raise ValueError(f"{path}:{lineno}: expected a JSON object with a 'step' key")
            for key, value in row.items():
                if key == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                if math.isfinite(value):
                    steps, values = series.setdefault(key, ([], []))
                    steps.append(row["step"])
                    values.append(float(value))
    return series


def moving_average(values, n):
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= n:
            total -= values[i - n]
        out.append(total / min(i + 1, n))
    return out


def plot(paths, metrics, out, labels=None, smooth=0, title=None):
    """Write the PNG `out`; returns the number of lines drawn. Raises ValueError when no metric has data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = labels or [os.path.basename(os.path.dirname(os.path.abspath(p))) or p for p in paths]
    if len(labels) != len(paths):
        raise ValueError(f"{len(labels)} labels for {len(paths)} metrics files")
    runs = [read_metrics(p) for p in paths]
    fig, axes = plt.subplots(len(metrics), 1, figsize=(7, 2.8 * len(metrics)), sharex=True, squeeze=False)
    drawn = 0
    for ax, metric in zip(axes[:, 0], metrics):
        for i, (run, label) in enumerate(zip(runs, labels)):
            if metric not in run:
                continue
            steps, values = run[metric]
            color = f"C{i}"
            sparse = len(steps) < 30
            if smooth > 1 and not sparse:
                ax.plot(steps, values, color=color, alpha=0.25, linewidth=0.8)
                ax.plot(steps, moving_average(values, smooth), color=color, label=label)
            else:
                ax.plot(steps, values, color=color, marker="o" if sparse else None, markersize=4, label=label)
            drawn += 1
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if len(paths) > 1:
            ax.legend(fontsize=8)
    if not drawn:
        plt.close(fig)
        raise ValueError(f"none of the metrics {', '.join(metrics)} occurs in {', '.join(paths)}")
    axes[-1, 0].set_xlabel("step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return drawn


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="metrics.jsonl files (one line per file in each panel)")
    parser.add_argument("--metrics", default="eval/accuracy,train/reward", help="comma-separated metric names")
    parser.add_argument("--labels", default=None, help="comma-separated legend labels, one per file")
    parser.add_argument("--out", default="metrics.png", help="PNG to write")
    parser.add_argument("--smooth", type=int, default=0, help="moving average over N points for dense metrics")
    parser.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    labels = [s.strip() for s in args.labels.split(",")] if args.labels else None
    try:
        plot(args.paths, metrics, args.out, labels=labels, smooth=args.smooth, title=args.title)
    except (OSError, ValueError) as e:
        print(f"plot_metrics.py: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
