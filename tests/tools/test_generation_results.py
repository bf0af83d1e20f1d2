"""The Generation numbers docs/PERFORMANCE.md and README.md quote, recomputed from the committed result files
(docs/results/bench_generation_zen4*.jsonl, generation_*_zen4*.jsonl, gsm8k_eval_speed.json): a number edited by
hand, or a result file replaced without the text, fails here."""
import json

import pytest

RESULTS = "docs/results/bench_generation_zen4.jsonl"


@pytest.fixture(scope="module")
def docs(repo_root):
    return {name: (repo_root / name).read_text(encoding="utf-8") for name in ("docs/PERFORMANCE.md", "README.md")}


def lines(repo_root, name):
    return [json.loads(line) for line in (repo_root / name).read_text(encoding="utf-8").splitlines()]


def test_the_generation_table_is_the_sittings(repo_root, docs):
    rows = lines(repo_root, RESULTS)
    for d in rows:
        if d["tool"] == "ours" and d["precision"] == "float32":
            row = (f"| {d['length']} | {d['rows']} | {d['threads']} | {d['floor_s']:.2f} / {d['floor_s_1thread']:.2f} "
                   f"| {d['seconds']:.2f} | **{d['floor_ratio']:.2f}** ({d['floor_ratio_1thread']:.2f}) |")
            assert row in docs["docs/PERFORMANCE.md"], row
        # every line's floor is its own token count at the FLOPs per token and the rate it names
        floor = (sum(d["prompt_tokens"]) + d["sampled_tokens"]) * d["matmul_mflop_per_token"] / 1e3 / d[
            "gemm_gflop_per_s_best"]
        assert floor == pytest.approx(d["floor_s"], rel=1e-9)
    ours32 = next(d for d in rows if (d["tool"], d["rows"], d["threads"], d["length"], d["precision"])
                  == ("ours", 32, 1, 128, "float32"))
    bf16 = next(d for d in rows if (d["tool"], d["rows"], d["threads"], d["precision"]) == ("ours", 32, 1, "bfloat16"))
    assert f"**10.90 s at one thread, {bf16['floor_ratio']:.2f}x the float32 floor**" in docs["docs/PERFORMANCE.md"]
    assert f"bf16 {bf16['seconds']:.1f} s (1.0x the float32 floor" in docs["README.md"]
    hf = [d["seconds"] / o["seconds"] for d in rows for o in rows
          if d["tool"] == "hf" and o["tool"] == "ours" and o["precision"] == "float32" and d["rows"] >= 8
          and (d["rows"], d["threads"], d["length"]) == (o["rows"], o["threads"], o["length"])]
    assert f"{min(hf):.1f}-{max(hf):.1f}x" in docs["README.md"] and ours32["floor_ratio"] == pytest.approx(1.58, abs=5e-3)


def test_the_step_table_and_the_gsm8k_table(repo_root, docs):
    steps = {d["run"]: d for d in lines(repo_root, "docs/results/bench_generation_zen4_steps.jsonl")}
    before, after = steps["step_128_before_t1"], steps["step_128_after_t1"]
    row = (f"| after (decode engine, oneDNN float32) | {after['rollout_s_median']:.2f} | "
           f"**{after['rollout_floor_ratio']:.2f}** | {after['update_s_median']:.2f} | {after['step_s_median']:.2f} |")
    assert row in docs["docs/PERFORMANCE.md"], row
    assert f"| before (paddle ops, FastDecoder.decode) | {before['rollout_s_median']:.2f} | " in docs["docs/PERFORMANCE.md"]
    # before had no floor field: the same floor (same prompts, tokens and rate) divides its rollout
    assert f"| {before['rollout_s_median'] / after['rollout_floor_s']:.2f} |" in docs["docs/PERFORMANCE.md"]
    assert f"{before['rollout_s_median']:.1f} -> {after['rollout_s_median']:.1f} s" in docs["README.md"]
    runs = json.loads((repo_root / "docs/results/gsm8k_eval_speed.json").read_text(encoding="utf-8"))["runs"]
    t = {(r["code"], r["threads"], r["precision"]): r["generation_s"] for r in runs}
    for key, ref in (("float32", ("before", 1, "float32")), ("bfloat16", ("before", 1, "float32"))):
        speedup = t[ref] / t[("after", 1, key)]
        assert f"{t[('after', 1, key)]:.0f} ({speedup:.2f}x)" in docs["docs/PERFORMANCE.md"]
    for code in ("0a726b6", "2ed5151"):  # the idle rerun before and after the per-row (K q^T)^T
        assert f"| {t[(code, 1, 'float32')]:.0f} | {t[(code, 2, 'float32')]:.0f} |" in docs["docs/PERFORMANCE.md"], code


def test_the_third_sittings_table(repo_root, docs):
    """'A third idle sitting': each one-thread cell is the run's seconds and its floor at the mean of the rates
    measured around its round / at the start's rate (the GEMM lines in the order start, after round 1, end)."""
    rows = lines(repo_root, "docs/results/generation_idle_zen4_night.jsonl")
    rates = [d["gemm_gflop_per_s_best"] for d in rows if d["tool"] == "gemm" and d["threads"] == 1]
    start = rates[0]
    around = {1: (rates[0] + rates[1]) / 2, 2: (rates[1] + rates[2]) / 2}
    assert [f"{r:.1f}" for r in rates] == ["104.9", "110.5", "110.9"]

    def cell(seconds, floor_at_start, rate):
        near = floor_at_start * start / rate
        return f"{seconds:.2f} ({seconds / near:.2f} / {seconds / floor_at_start:.2f})"

    table = {}
    for d in rows:
        if d["tool"] in ("gemm", "eval_gsm8k") or d.get("threads") != 1:
            continue
        around_rate = around[d["round"]]
        if d["tool"] == "bench.py trainer step":
            key, text = "trainer", cell(d["rollout_s_median"], d["rollout_floor_s"], around_rate)
        elif d["tool"] == "paddle_grpo":
            key, text = d["precision"], cell(d["seconds"], d["floor_s"], around_rate)
        else:
            key, text = d["tool"], f"{d['seconds']:.2f}"
        table.setdefault(key, []).append(text)
    doc = docs["docs/PERFORMANCE.md"]
    for key, label in (("float32", "| ours, `bench_generation.py --rows 32 --threads 1 --length 128` |"),
                       ("trainer", "| the trainer's rollout (`bench.py --model ... --shape "
                                   "tools/bench/shapes/smollm2.json --threads 1`) |"),
                       ("bfloat16", "| ours, `--precision bfloat16` |"),
                       ("transformers.generate", "| Hugging Face `generate` |"), ("llama.cpp", "| llama.cpp, Q4_1 |")):
        row = f"{label} {table[key][0]} | {table[key][1]} |"
        assert row in doc, row


def test_the_long_context_tables(repo_root, docs):
    """'Long contexts': each cell lists the rounds' seconds of bench_generation.py for that code and configuration
    (docs/results/generation_split_zen4.jsonl), and the GSM8K rows are the runs of gsm8k_eval_speed.json."""
    rows = lines(repo_root, "docs/results/generation_split_zen4.jsonl")
    doc = docs["docs/PERFORMANCE.md"]
    for sitting, codes in (("first", ("before", "after", "after_nosplit")), ("confirmation", ("before", "shipped"))):
        for (n, length), threads in (((32, 512), 2), ((32, 128), 2), ((32, 128), 1)):
            cells = [", ".join(f"{d['seconds']:.2f}" for d in rows if d["tool"] == "paddle_grpo"
                               and d["sitting"] == sitting and d["code"] == code
                               and (d["rows"], d["length"], d["threads"]) == (n, length, threads)) for code in codes]
            if all(cells):
                row = f"| {n} x {length}, {threads} | " + " | ".join(cells) + " |"
                assert row in doc, row
    runs = json.loads((repo_root / "docs/results/gsm8k_eval_speed.json").read_text(encoding="utf-8"))["runs"]
    t = {(r["code"], r["threads"]): r["generation_s"] for r in runs if r["precision"] == "float32"}
    for code, label in (("e85c217", "e85c217"), ("compact_split", "rows moved in place, attention split")):
        assert f"| {label} | {t[(code, 1)]:.0f} | {t[(code, 2)]:.0f} |" in doc, code
