"""tools/bench/bench_ops.py: every decode and update op is timed and reported in the table and the JSON line; the old
sampler it times for comparison agrees with the new one."""
import json

import numpy as np
import paddle
import pytest


@pytest.fixture(scope="module")
def bench_ops(load_tool):
    return load_tool("bench/bench_ops")


def test_table_and_json_list_every_op(bench_ops, capsys):
    bench_ops.main(["--vocab", "3000", "--rows", "2", "--hidden", "16", "--tokens", "4", "--chunks", "3,8",
                    "--repeats", "2"])
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])
    table = [line for line in out[:-1] if line.startswith("| decode") or line.startswith("| update")]
    names = [r["op"] for r in result["ops"]]
    assert len(table) == len(names) == len(set(names))
    for line, r in zip(table, result["ops"]):
        cells = [c.strip() for c in line.strip("|").split("|")]
        # the table prints the JSON's float64 median to enough digits for approx's default rel 1e-6
        assert cells[:3] == [r["phase"], r["op"], r["shape"]] and float(cells[3]) == pytest.approx(r["median_ms"])
        assert r["median_ms"] > 0 and r["runs"] == 2
    for expected in ("old: F.log_softmax", "new: max / exp / sum (exp and logsumexp)", "new: sampler (two-level, "
                     "block 512)", "new: candidates top_p 0.9", "lm-head matmul", "chunked head forward + backward, "
                     "chunk 8, numpy kernels", "chunked head forward + backward, chunk 8, paddle ops",
                     "one chunk: GEMM + statistics, chunk 3, paddle ops", "one chunk: GEMM alone, chunk 8"):
        assert expected in names
    assert result["vocab"] == 3000 and result["rows"] == 2 and "[2, 3000]" in result["ops"][1]["shape"]


def test_phases_are_checked(bench_ops):
    with pytest.raises(SystemExit, match="--phases"):
        bench_ops.main(["--vocab", "64", "--phases", "decode,rollout"])


def test_the_old_sampler_it_times_agrees_with_the_new_one(bench_ops):
    from paddle_grpo.rollout.sampling import sample_with_uniforms

    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.full(5000, 0.05), size=32).astype(np.float32)
    u = rng.random(32)
    old = bench_ops._old_inverse_cdf(paddle.to_tensor(p), u).numpy()
    assert (old != sample_with_uniforms(paddle.to_tensor(p), u).numpy()).sum() <= 1  # rounding only
