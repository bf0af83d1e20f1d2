"""Load: 16 concurrent clients, 192 requests of 64 K&K samples against a real `python -m reward_server`; zero
errors, and every reply equal to the in-process reward (no cross-talk between concurrent requests).
The full-size measurement is tools/bench/bench_reward_server.py (numbers in docs/PERFORMANCE.md)."""
import importlib.util
import time


def load_bench(repo_root):
    spec = importlib.util.spec_from_file_location("bench_reward_server",
                                                  repo_root / "tools" / "bench" / "bench_reward_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sixteen_clients_zero_errors(repo_root, start_cli, free_port, tmp_path):
    bench = load_bench(repo_root)
    # Generated puzzles (tmp_path has no kk/), so the test runs in a fresh clone too.
    batches, expected = bench.make_batches("kk", batch=64, n_batches=16, shared_data=tmp_path)
    assert {s for scores in expected for s in scores} == {3.0, -0.5, -3.0}
    port = free_port()
    start_cli(port, "--reward", "kk", "--threads", "8", "--log-level", "WARNING")
    started = time.monotonic()
    stats = bench.run_load(f"http://127.0.0.1:{port}", batches, expected, clients=16, requests_total=192)
    print("\nreward server load:", stats)
    assert stats["errors"] == 0, stats["first_errors"]
    assert stats["requests"] == 192 and stats["latency_ms_p99"] > 0
    assert time.monotonic() - started < 60
