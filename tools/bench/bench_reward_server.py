"""Load test of the reward server: N concurrent clients send batches to a real `python -m reward_server`.

    python tools/bench/bench_reward_server.py --reward kk --clients 16 --requests 400 --batch 64

Starts the server as a subprocess on a free loopback port (access log off), builds K&K batches from the real
puzzles in ../shared/data/kk when present (else from generated ones), sends `--requests` requests from `--clients`
threads (each with its own RewardClient, no retries, so every failure counts), checks every reply against the same
reward computed in-process, and prints one JSON line: throughput, latency percentiles, errors.
Measures the server and loopback HTTP on this host; it leaves out network latency and the trainer.
"""
import argparse
import json
import math
import os
import pathlib
import random
import socket
import subprocess
import sys
import threading
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from paddle_grpo.rewards.client import InProcessRewarder, RewardClient  # noqa: E402

NAMES = ["Michael", "Zoey", "Ethan", "Aurora", "Noah", "Aria", "Abigail", "Liam", "Mia", "Owen"]


def kk_samples(count, seed=0, shared_data=None):
    """`count` (src, tgt, response) K&K triples: correct, flipped and badly formatted answers, mixed."""
    rng = random.Random(seed)
    puzzles = []
    kk_dir = pathlib.Path(shared_data or REPO.parent / "shared" / "data") / "kk"
    if kk_dir.is_dir():
        import pandas as pd
        for n in (3, 4, 5):
            frame = pd.read_parquet(kk_dir / f"{n}ppl" / "train.parquet", columns=["quiz", "names", "solution"])
            puzzles += [(r.quiz, list(r.names), list(r.solution)) for r in frame.itertuples()]
    else:
        for _ in range(500):
            names = rng.sample(NAMES, rng.randint(3, 5))
            puzzles.append(("A generated puzzle.", names, [rng.random() < 0.5 for _ in names]))
    samples = []
    for _ in range(count):
        quiz, names, solution = rng.choice(puzzles)
        truth = [(n, "knight" if k else "knave") for n, k in zip(names, solution)]
        tgt = "\n".join(f"({i}) {n} is a {r}" for i, (n, r) in enumerate(truth, 1))
        kind = rng.random()
        if kind < 0.5:
            answer = tgt
        elif kind < 0.8:
            answer = tgt.replace("knight", "KNAVE", 1) if "knight" in tgt else tgt.replace("knave", "knight", 1)
        else:
            answer = tgt + "</answer>"  # broken format
        think = " ".join(f"Suppose {n} is a knight; checking the statements." for n, _ in truth) * 16
        samples.append((f"<|im_start|>user\n{quiz}<|im_end|>\n<|im_start|>assistant\n<think>", tgt,
                        f"{think}</think>\n<answer>{answer}</answer>"))
    return samples


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(reward, threads, port=None):
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, "-m", "reward_server", "--port", str(port), "--reward", reward,
                             "--threads", str(threads), "--log-level", "WARNING"], cwd=str(REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"reward server exited with code {proc.returncode}")
        try:
            if requests.get(url + "/health", timeout=1).ok:
                return proc, url
        except requests.RequestException:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("reward server did not become healthy within 60 s")


def percentile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    # nearest-rank: the smallest value with at least q % of the values at or below it
    return sorted_values[max(0, math.ceil(q / 100 * len(sorted_values)) - 1)]


def run_load(url, batches, expected, clients, requests_total, read_timeout=60):
    """Send `requests_total` requests (cycling through `batches`) from `clients` threads; returns the stats dict.
    An error is any exception or any reply that differs from `expected` for its batch."""
    latencies, errors, lock = [], [], threading.Lock()
    counter = iter(range(requests_total))

    def worker():
        client = RewardClient(url, max_retries=0, read_timeout=read_timeout)
        while True:
            with lock:
                k = next(counter, None)
            if k is None:
                return
            src, tgt, response = batches[k % len(batches)]
            started = time.perf_counter()
            try:
                scores = client.score(src, tgt, response)
                if scores != expected[k % len(batches)]:
                    raise AssertionError(f"request {k}: scores differ from the in-process reward")
            except Exception as exc:  # noqa: BLE001 - counted and reported
                with lock:
                    errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                continue
            with lock:
                latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - started
    lat_ms = sorted(x * 1000 for x in latencies)
    batch = len(batches[0][2])
    return {
        "requests": requests_total, "batch": batch, "clients": clients, "errors": len(errors),
        "first_errors": errors[:3], "wall_s": round(wall, 3),
        "requests_per_s": round(len(latencies) / wall, 1), "samples_per_s": round(len(latencies) * batch / wall, 1),
        "latency_ms_p50": round(percentile(lat_ms, 50), 2), "latency_ms_p90": round(percentile(lat_ms, 90), 2),
        "latency_ms_p99": round(percentile(lat_ms, 99), 2), "latency_ms_max": round(lat_ms[-1], 2) if lat_ms else None,
    }


def make_batches(reward, batch, n_batches, seed=0, shared_data=None):
    """K&K batches and the in-process scores the server must reproduce."""
    samples = kk_samples(batch * n_batches, seed, shared_data)
    batches = [tuple(map(list, zip(*samples[i * batch:(i + 1) * batch]))) for i in range(n_batches)]
    local = InProcessRewarder(reward)
    return batches, [local.score(*b) for b in batches]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reward", default="kk", help="reward(s) the server loads (K&K batches are sent)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=400, help="total requests")
    parser.add_argument("--batch", type=int, default=64, help="samples per request")
    parser.add_argument("--threads", type=int, default=8, help="server threads")
    parser.add_argument("--url", default=None, help="use a running server instead of starting one")
    parser.add_argument("--shared-data", default=None, help="directory holding kk/{3,4,5}ppl (default ../shared/data)")
    args = parser.parse_args(argv)
    batches, expected = make_batches(args.reward, args.batch, 32, shared_data=args.shared_data)
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args.reward, args.threads)
    try:
        run_load(url, batches, expected, args.clients, 2 * args.clients)  # warm-up: connections, caches
        stats = run_load(url, batches, expected, args.clients, args.requests)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
    stats.update(reward=args.reward, server_threads=args.threads, cpus=os.cpu_count())
    print(json.dumps(stats))
    return 0 if stats["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
