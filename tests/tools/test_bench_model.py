"""tools/bench/bench.py --model and tools/bench/trl_bench.py --model: the benchmark on a real model directory (weights,
tokenizer, chat template) instead of a random model, on a tiny stand-in (conftest's tiny Qwen2 with a ChatML chat
template, and its transformers export by tools/models/export_hf.py for TRL's side).

bench.py runs here; TRL's side runs in the `.[peer]` environment (PADDLE_GRPO_PEER_PYTHON) and is skipped with the
reason otherwise. Both print each prompt's token count: they must be equal, and equal to an independent count
(transformers' own tokenizer of the export where it runs; else the rendered text cut at the special tokens).
"""
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys

import pytest
from peer_helpers import peer_python

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "tools" / "bench" / "bench.py"
TINY = REPO / "tools" / "bench" / "shapes" / "tiny.json"
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a tiny test model<|im_end|>\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
            "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
SMOLLM2_SIZES = {"vocab_size": 49152, "hidden_size": 576, "intermediate_size": 1536, "num_layers": 30,
                 "num_heads": 9, "num_kv_heads": 3}


@pytest.fixture(scope="module")
def model_dir(tiny_policy_dir, tmp_path_factory):
    """conftest's tiny Qwen2 (vocabulary 320, 2 layers) with SmolLM2's kind of chat template (a default system) and
    `<|im_start|>` a special token, as in SmolLM2 and Qwen (the tiny tokenizer has it as a plain vocabulary entry,
    which tools/models/export_hf.py's tokenizer.json would leave to the byte-level BPE: 3 tokens in transformers)."""
    dst = tmp_path_factory.mktemp("model") / "tiny"
    shutil.copytree(tiny_policy_dir, dst)
    path = dst / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**config, "chat_template": TEMPLATE, "additional_special_tokens": ["<|im_start|>"]}),
                    encoding="utf-8")
    return str(dst)


def expected_questions(n):
    """The first n questions of data/smollm2_add/train.jsonl, from its a and b fields (not from `src`)."""
    rows = [json.loads(line) for line in (REPO / "data" / "smollm2_add" / "train.jsonl").read_text().splitlines()]
    return [f"What is {r['a']} + {r['b']}? Reply with only the number." for r in rows[:n]]


def test_chat_questions_are_the_user_turns(load_tool):
    bench = load_tool("bench/bench")
    assert bench.chat_questions(5) == expected_questions(5)
    with pytest.raises(SystemExit, match=r"train.jsonl: 300 prompts, the shape needs .* = 301"):
        bench.chat_questions(301)


def test_model_shape_takes_the_sizes_from_config_json(load_tool, tmp_path):
    bench = load_tool("bench/bench")
    shape = json.loads((REPO / "tools" / "bench" / "shapes" / "smollm2.json").read_text())
    assert {k: shape[k] for k in SMOLLM2_SIZES} == SMOLLM2_SIZES  # the real model's sizes, documented in the file
    assert (shape["prompts_per_step"], shape["group_size"], shape["completion_len"], shape["beta"]) == (8, 4, 128, 0)
    (tmp_path / "config.json").write_text(json.dumps({
        "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2}))
    got, ignored = bench.model_shape(shape, str(tmp_path))
    assert ignored == {**SMOLLM2_SIZES, "prompt_len": 47}
    assert got == {**shape, "vocab_size": 320, "hidden_size": 64, "intermediate_size": 128, "num_layers": 2,
                   "num_heads": 4, "num_kv_heads": 2}
    with pytest.raises(SystemExit, match=r"--model .*: cannot read the model's sizes from .*config.json"):
        bench.model_shape(shape, str(tmp_path / "missing"))


def reference_counts(model_dir, n):
    """Token counts of the rendered prompts, independently of bench.py: the template rendered by jinja2 directly,
    the text cut at the special tokens, each piece encoded by the tokenizer (tokenize_prompts' rule, re-done here)."""
    import re

    import jinja2

    from paddle_grpo.policy import load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    template = jinja2.Template(TEMPLATE)
    counts = []
    for q in expected_questions(n):
        text = template.render(messages=[{"role": "user", "content": q}], add_generation_prompt=True)
        pieces = [p for p in re.split(r"(<\|im_start\|>|<\|im_end\|>)", text) if p]
        counts.append(sum(1 if p in ("<|im_start|>", "<|im_end|>") else
                          len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in pieces))
    return counts


@pytest.fixture(scope="module")
def profiled(model_dir, tmp_path_factory):
    """bench.py --model with --profile (the per-op profile docs/PERFORMANCE.md tells to take on the real model):
    (JSON line, the stdout before it, the trace directory)."""
    trace = tmp_path_factory.mktemp("trace")
    out = subprocess.run([sys.executable, str(BENCH), "--shape", str(TINY), "--threads", "1",
                          "--model", model_dir, "--profile", str(trace)], capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]), "\n".join(lines[:-1]), trace


@pytest.fixture(scope="module")
def ours(profiled):
    return profiled[0]


def test_profile_works_with_a_model(profiled):
    _, summary, trace = profiled
    assert "matmul" in summary  # paddle.profiler's op table, before the JSON line
    assert any(p.suffix == ".json" for p in trace.iterdir())  # the chrome trace


def test_bench_runs_the_model_with_its_chat_template(ours, model_dir):
    shape = json.loads(TINY.read_text())
    n = shape["prompts_per_step"] * (shape["warmup_steps"] + shape["timed_steps"])
    assert ours["model"] == os.path.abspath(model_dir)
    assert ours["prompt_tokens"] == reference_counts(model_dir, n)
    # the model's sizes replace the shape's (tiny.json: vocab 64, hidden 32); the longest prompt is prompt_len
    assert ours["ignored_shape_keys"] == {k: shape[k] for k in ("vocab_size", "hidden_size", "intermediate_size",
                                                                 "num_layers", "num_heads", "num_kv_heads",
                                                                 "prompt_len")}
    assert (ours["shape"]["vocab_size"], ours["shape"]["hidden_size"], ours["shape"]["num_layers"]) == (320, 64, 2)
    assert ours["shape"]["prompt_len"] == max(ours["prompt_tokens"])
    # completions forced to completion_len (EOS suppressed), as the random model's `fixed` lengths
    assert ours["completion_tokens_per_step"] == shape["prompts_per_step"] * shape["group_size"] * \
        shape["completion_len"]
    assert ours["completion_len_min"] == ours["completion_len_max"] == shape["completion_len"]
    assert ours["reference_s_median"] > 0 and ours["update_s_median"] > 0  # tiny.json's beta 0.1: a reference pass
    assert ours["fast_path"] is True


def test_the_rollout_floor_counts_each_prompt_once(ours):
    """--model: the floor's prompt tokens are the median over the timed steps of the step's prompts' tokens (each
    prompt once, not once per sample), its FLOPs per token the tiny Qwen2's, counted by hand: hidden 64, 4 heads of
    16, 2 key-value heads, intermediate 128, 2 layers, vocabulary 320 (untied head)."""
    shape = json.loads(TINY.read_text())
    P, warmup = shape["prompts_per_step"], shape["warmup_steps"]
    counts = ours["prompt_tokens"]
    steps = [sum(counts[s * P:(s + 1) * P]) for s in range(warmup, warmup + shape["timed_steps"])]
    assert ours["rollout_prompt_tokens"] == statistics.median(steps)
    flop = 2 * (2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128) + 320 * 64)
    assert ours["matmul_mflop_per_token"] * 1e6 == pytest.approx(flop, rel=8 * 2.0 ** -53)
    assert ours["rollout_sampled_tokens"] == ours["completion_tokens_per_step"]
    tokens = ours["rollout_prompt_tokens"] + ours["rollout_sampled_tokens"]
    floor = flop * tokens / ours["gemm_gflop_per_s_best"] / 1e9
    assert ours["rollout_floor_s"] == pytest.approx(floor, rel=8 * 2.0 ** -53)


def test_bench_refuses_a_model_without_chat_template(tiny_policy_dir, tmp_path):
    src = shutil.copytree(tiny_policy_dir, tmp_path / "plain")
    path = src / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.pop("chat_template", None)
    path.write_text(json.dumps(config), encoding="utf-8")
    out = subprocess.run([sys.executable, str(BENCH), "--shape", str(TINY), "--threads", "1",
                          "--model", str(src)], capture_output=True, text=True, timeout=600)
    assert out.returncode != 0 and out.stdout == ""
    assert f"--model {src}: its tokenizer has no chat template" in out.stderr


@pytest.fixture(scope="module")
def exported(model_dir, load_tool, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("hf") / "tiny-hf")
    load_tool("models/export_hf").export(model_dir, out)
    return out


def run_trl_bench(*args):
    """tools/bench/trl_bench.py in the peer's environment (skips without one); its JSON line."""
    python = peer_python(("torch", "trl"))
    if python is None:
        pytest.skip("trl and torch are not installed here (the peer has its own environment: python -m venv "
                    ".peer-venv && PADDLE_GRPO_PEER_ONLY=1 .peer-venv/bin/pip install -e '.[peer]'; then set "
                    "PADDLE_GRPO_PEER_PYTHON=.peer-venv/bin/python)")
    out = subprocess.run([python, str(REPO / "tools" / "bench" / "trl_bench.py"), "--threads", "1", *args],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 1, out.stdout
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def trl(exported):
    return run_trl_bench("--shape", str(TINY), "--model", exported)


def test_trl_bench_runs_the_export_with_the_same_prompts(ours, trl, exported):
    shape = json.loads(TINY.read_text())
    assert trl["model"] == os.path.abspath(exported)
    assert trl["prompt_tokens"] == ours["prompt_tokens"]  # the same prompts, token for token in count
    assert trl["ignored_shape_keys"] == ours["ignored_shape_keys"] and trl["shape"] == ours["shape"]
    assert len(trl["step_s_all"]) == shape["timed_steps"]
    assert trl["completion_len_mean"] == shape["completion_len"]  # TRL's own log: lengths were forced
    # like for like with our trainer: float32 weights and maths, no recomputation, our AdamW settings
    assert trl["trl_settings"] == {"bf16": False, "gradient_checkpointing": False, "model_checkpointing": False,
                                   "model_dtype": "torch.float32",
                                   "weight_decay": 0.01, "learning_rate": 1e-5, "lr_scheduler_type": "constant",
                                   "max_grad_norm": 1.0, "adam_beta1": 0.9, "adam_beta2": 0.999,
                                   "adam_epsilon": 1e-8}


def test_trl_bench_gradient_checkpointing_switch(trl, exported):
    """--gradient-checkpointing: TRL's recomputation on (the model's own state says so), the rest unchanged."""
    on = run_trl_bench("--shape", str(TINY), "--model", exported, "--set", "warmup_steps=0", "--set",
                       "timed_steps=1", "--gradient-checkpointing")
    assert on["trl_settings"] == {**trl["trl_settings"], "gradient_checkpointing": True,
                                  "model_checkpointing": True}
    assert on["completion_len_mean"] == trl["completion_len_mean"] == json.loads(TINY.read_text())["completion_len"]
