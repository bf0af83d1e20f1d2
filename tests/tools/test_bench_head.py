"""tools/bench/bench_head.py (what use_fused_head_and_loss_fn's default was measured with): one measurement of each head
mode in this process returns a time and a peak-memory increase (that both modes give the same numbers is
tests/policy/test_head_wiring.py's)."""


def test_measure_both_modes(load_tool):
    bench_head = load_tool("bench/bench_head")
    for chunk in (None, 4):
        out = bench_head.measure(vocab=64, rows=2, tokens=3, hidden=8, chunk=chunk, repeats=2)
        assert out["seconds"] > 0 and out["cpu_seconds"] >= 0 and out["peak_increase_mb"] >= 0

