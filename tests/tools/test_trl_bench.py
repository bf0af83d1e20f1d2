"""tools/bench/trl_bench.py, the TRL peer of tools/bench/bench.py: its --help without torch, its shape checks, the
tokenizer and prompts it shares with bench.py, and one tiny TRL step where TRL is installed.

TRL and torch live in the peer's own environment (setup.py's `peer` extra with PADDLE_GRPO_PEER_ONLY=1: TRL's
transformers and paddlenlp need different tokenizers). The step test runs with the python named by
PADDLE_GRPO_PEER_PYTHON (e.g. .peer-venv/bin/python), else with this one when it has torch and trl, else it skips.
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest
from peer_helpers import peer_python

REPO = pathlib.Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "bench" / "trl_bench.py"
TINY = REPO / "tools" / "bench" / "shapes" / "tiny.json"


def blocked_env(tmp_path):
    """An environment in which `import torch` and `import trl` fail (stand-in packages that raise)."""
    for name in ("torch", "trl"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f"raise ImportError('{name} blocked by the test')\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO)])}


def test_help_works_without_torch(tmp_path):
    out = subprocess.run([sys.executable, str(TOOL), "--help"], capture_output=True, text=True, timeout=120,
                         env=blocked_env(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "TRL's GRPOTrainer" in out.stdout and "--shape" in out.stdout and "--set" in out.stdout


def test_without_torch_it_says_where_to_run(tmp_path):
    out = subprocess.run([sys.executable, str(TOOL), "--shape", str(TINY)], capture_output=True, text=True,
                         timeout=120, env=blocked_env(tmp_path))
    assert out.returncode == 2 and out.stdout == ""
    assert "cannot import torch (torch blocked by the test)" in out.stderr
    assert 'PADDLE_GRPO_PEER_ONLY=1 .peer-venv/bin/pip install -e ".[peer]"' in out.stderr


def test_shape_checks(load_tool, tmp_path):
    trl_bench = load_tool("bench/trl_bench")
    shape = json.loads(TINY.read_text())
    assert trl_bench.load_shape(str(TINY), ["completion_len=7"]) == {**shape, "completion_len": 7}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({k: v for k, v in shape.items() if k != "beta"}))
    with pytest.raises(SystemExit, match=r"bad.json: missing keys \['beta'\]"):
        trl_bench.load_shape(str(bad))
    bad.write_text(json.dumps({**shape, "lengths": "uniform:2"}))
    with pytest.raises(SystemExit, match="lengths 'uniform:2': this harness forces every completion"):
        trl_bench.load_shape(str(bad))
    with pytest.raises(SystemExit, match="--set: expected KEY=VALUE"):
        trl_bench.load_shape(str(TINY), ["completion_len"])
    bad.write_text(json.dumps({**shape, "micro_batch_size": 4}))  # 2 x 3 = 6 sequences
    with pytest.raises(SystemExit, match="micro_batch_size 4 must divide prompts_per_step x group_size = 6"):
        trl_bench.load_shape(str(bad))


def test_same_prompts_and_vocabulary_as_bench(load_tool, tmp_path):
    """The prompts equal the ones tools/bench/bench.py writes, and the vocabulary file equals build_char_tokenizer's."""
    pytest.importorskip("paddle", reason="bench.py's side of the comparison needs paddle")
    trl_bench, bench = load_tool("bench/trl_bench"), load_tool("bench/bench")
    shape = {**json.loads(TINY.read_text()), "vocab_size": 200}  # past 131 tokens: synthetic words too
    _, data = bench.build(shape, str(tmp_path))
    with open(data) as f:
        assert [json.loads(line)["src"] for line in f] == trl_bench.prompts(shape)
    from paddle_grpo.recipes.tiny import write_char_vocab

    (tmp_path / "peer").mkdir()
    vocab_file, _ = write_char_vocab(str(tmp_path / "peer"), 200)
    assert json.loads(pathlib.Path(vocab_file).read_text()) == \
        json.loads((tmp_path / "model" / "vocab.json").read_text())


def test_one_tiny_step(tmp_path):
    python = peer_python(("torch", "trl"))
    if python is None:
        pytest.skip("trl and torch are not installed here (the peer has its own environment: python -m venv "
                    ".peer-venv && PADDLE_GRPO_PEER_ONLY=1 .peer-venv/bin/pip install -e '.[peer]'; then set "
                    "PADDLE_GRPO_PEER_PYTHON=.peer-venv/bin/python)")
    out = subprocess.run([python, str(TOOL), "--shape", str(TINY), "--threads", "1", "--set", "warmup_steps=0",
                          "--set", "timed_steps=1"], capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout  # one JSON line, as tools/bench/bench.py
    result = json.loads(lines[0])
    shape = json.loads(TINY.read_text())
    assert result["peer"] == "trl" and result["trl_version"] == "1.16.0" and result["torch_version"].startswith("2.13")
    assert len(result["step_s_all"]) == 1 and result["step_s_median"] == result["step_s_all"][0] > 0
    n_tokens = shape["prompts_per_step"] * shape["group_size"] * shape["completion_len"]
    assert result["completion_tokens_per_step"] == n_tokens
    assert result["completion_tokens_per_s"] == pytest.approx(n_tokens / result["step_s_median"], rel=1e-12)
    assert result["completion_len_mean"] == shape["completion_len"]  # TRL's own log: lengths were forced
    assert result["peak_rss_mb"] > 100 and result["threads"] == 1
    assert result["shape"] == {**shape, "warmup_steps": 0, "timed_steps": 1}
    # bench.py's arithmetic, not GRPOConfig's defaults (bf16 autocast and gradient checkpointing on, weight decay 0)
    settings = result["trl_settings"]
    assert (settings["bf16"], settings["model_checkpointing"], settings["model_dtype"], settings["weight_decay"]) == \
        (False, False, "torch.float32", 0.01)
