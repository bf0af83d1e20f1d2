"""VisualDL as a user sees it: the README's `visualdl` command serving the project's logs over real HTTP, and the
sample cards on its text page.

The server is the real `visualdl` console script (a subprocess on a free loopback port), asked without an
Accept-Language header, as curl asks: VisualDL 2.5.3 answered those requests with HTTP 500 unless started with
`--language`. The logs are written by MetricsLogger; sample rows go through the trainer's own path (whole-sequence
decoding of a real byte-level BPE's token ids, per-prompt groups, sample_rows).
"""
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

import numpy as np
import paddle
import pytest

from paddle_grpo.step import Batch, completion_texts
from paddle_grpo.logging import MetricsLogger, format_sample, visualdl_command
from paddle_grpo.rewards.combine import RewardSet
from paddle_grpo.rollout import Rollout
from paddle_grpo.recipes.tiny import IM_END, build_tokenizer

# Exact in float32 (VisualDL stores scalars as float32), so the server must give back these very numbers.
SCALARS = {1: {"train/reward": 0.25, "train/kl": 0.125}, 2: {"train/reward": 0.5, "train/kl": 0.0625},
           3: {"train/reward": 0.75, "train/kl": 0.03125}}

RECORDS = [{"src": "Quelle est la capitale du Japon ? Réponds en japonais."},
           {"src": "Wie viel ist 3 × 4? Antworte mit „Zahl“."}]
# Two samples per prompt; multi-byte characters that the byte-level BPE splits over several tokens.
COMPLETIONS = ["東京です 🗼", "Kyōto? non, 東京", "12 — zwölf ✓", "Größe: 12 €"]
CORPUS = ["What is 12 + 35? The answer is 47.", "plain ascii text for merges"] * 5


def has_kanji(prompts, completions, **kwargs):
    return [float("東京" in c) for c in completions]


def length_bonus(prompts, completions, **kwargs):
    return [len(c) / 10 for c in completions]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return build_tokenizer(CORPUS, str(tmp_path_factory.mktemp("bpe")), vocab_size=300)


def rollout_of(tokenizer, completions, G):
    """A Rollout holding `completions` as token ids ending with EOS (prompts are not needed to log samples)."""
    ids = [tokenizer.encode(c, add_special_tokens=False)["input_ids"] + [tokenizer.convert_tokens_to_ids(IM_END)]
           for c in completions]
    T = max(map(len, ids))
    pad = tokenizer.pad_token_id
    n = len(ids)
    return Rollout(prompt_ids=paddle.full([n, 2], pad, dtype="int64"), prompt_mask=paddle.ones([n, 2], "int64"),
                   completion_ids=paddle.to_tensor([row + [pad] * (T - len(row)) for row in ids], dtype="int64"),
                   completion_mask=paddle.to_tensor([[1] * len(row) + [0] * (T - len(row)) for row in ids],
                                                    dtype="int64"),
                   lengths=np.array([len(row) for row in ids]), truncated=np.zeros(n, dtype=bool),
                   sample_logprobs=paddle.zeros([n, T]))


def rollout_samples(tokenizer, reward_fns):
    """The rows the trainer logs for one step of RECORDS x 2 samples, through the trainer's own functions."""
    G = 2
    rollout = rollout_of(tokenizer, COMPLETIONS, G)
    texts = completion_texts(tokenizer, rollout)  # the trainer's decoding
    result = RewardSet(reward_fns)([r["src"] for r in RECORDS for _ in range(G)], texts)
    return Batch.from_rollout(rollout, texts, result, [0, 1], G).sample_rows(RECORDS, k=4)


def test_byte_level_bpe_splits_the_characters_of_these_completions(tokenizer):
    """Otherwise the tests below would not show that completions are decoded whole: decoding these token by
    token gives replacement characters."""
    ids = tokenizer.encode(COMPLETIONS[0], add_special_tokens=False)["input_ids"]
    assert "\ufffd" in "".join(tokenizer.decode([i]) for i in ids)


def test_sample_rows_carry_prompt_whole_completion_reward_and_every_score(tokenizer):
    rows = rollout_samples(tokenizer, [has_kanji, length_bonus])
    assert [r["prompt"] for r in rows] == [RECORDS[0]["src"]] * 2 + [RECORDS[1]["src"]] * 2
    assert [r["completion"] for r in rows] == COMPLETIONS
    for row, c in zip(rows, COMPLETIONS):
        kanji, bonus = float("東京" in c), len(c) / 10
        # float64 Python arithmetic in both: approx's default rel 1e-6 is far above a few u64 = 1.1e-16 roundings
        assert row["scores"] == {"has_kanji": kanji, "length_bonus": pytest.approx(bonus)}
        assert row["reward"] == pytest.approx(kanji + bonus)
    assert format_sample(rows[1]) == ("reward: 2.4 (has_kanji = 1, length_bonus = 1.4)\n"
                                      f"prompt: {RECORDS[0]['src']}\ncompletion: Kyōto? non, 東京")
    assert format_sample({"prompt": "p", "completion": "c", "reward": None, "scores": {}}) == \
        "reward: None\nprompt: p\ncompletion: c"


# A multi-turn sample (tools): a malformed call's error, a call and its result, the final answer.
TOOL_ROW = {"prompt": "What is 123 * 45?", "completion": "123 * 45 = 5535", "reward": 1.0, "scores": {"exact": 1.0},
            "length": 31, "turns": [
                {"role": "assistant", "content": "Let me compute.", "tool_calls": [
                    {"name": "calculator", "arguments": {"expression": "123*45"}}]},
                {"role": "tool", "name": "calculator", "content": "5535", "error": None, "latency_s": 0.002},
                {"role": "assistant", "content": "I will check.", "tool_calls": [{"name": "calc", "arguments": {}}]},
                {"role": "tool", "name": "calc", "content": "error: unknown tool 'calc'; tools: calculator",
                 "error": "unknown_tool", "latency_s": 0.0},
                {"role": "assistant", "content": "123 * 45 = 5535", "tool_calls": []}]}


def test_a_multi_turn_card_shows_each_turn_then_the_answer():
    assert format_sample(TOOL_ROW) == (
        "reward: 1 (exact = 1)\nprompt: What is 123 * 45?\n"
        'turn 1 assistant: Let me compute. | call calculator({"expression": "123*45"})\n'
        "turn 2 tool calculator: 5535\n"
        "turn 3 assistant: I will check. | call calc({})\n"
        "turn 4 tool calc: error: unknown tool 'calc'; tools: calculator | error: unknown_tool\n"
        "turn 5 assistant: 123 * 45 = 5535\n"
        "answer: 123 * 45 = 5535")


def write_logs(out, tokenizer):
    """metrics.jsonl, rollouts.jsonl and a VisualDL log as a two-step run writes them; returns (logdir, rows)."""
    logdir = out / "vdl_log"
    log = MetricsLogger(str(out), str(logdir), report_to="visualdl", disable_tqdm=True)
    rows = rollout_samples(tokenizer, [has_kanji, length_bonus])
    for step, metrics in SCALARS.items():
        log.log(step, metrics)
    log.log_samples(1, rows)
    log.log_samples(2, rows[::-1])
    log.log_samples(2, [dict(rows[0], reward=None)], tag="eval")
    log.log_samples(2, [TOOL_ROW], tag="tools")
    log.close()
    return logdir, rows


def expected_cards(rows):
    """{tag: [text at step 1, text at step 2, ...]} as written by write_logs."""
    cards = {f"samples/rollout/{i}": [format_sample(rows[i]), format_sample(rows[::-1][i])] for i in range(4)}
    cards["samples/eval/0"] = [format_sample(dict(rows[0], reward=None))]
    cards["samples/tools/0"] = [format_sample(TOOL_ROW)]
    return cards


def test_one_visualdl_text_card_per_sample_and_rollouts_jsonl(tokenizer, tmp_path):
    from visualdl import LogReader

    logdir, rows = write_logs(tmp_path, tokenizer)
    files = [f for f in os.listdir(logdir) if f.startswith("vdlrecords")]
    assert len(files) == 1
    reader = LogReader(file_path=str(logdir / files[0]))
    cards = expected_cards(rows)
    assert sorted(reader.get_tags()["text"]) == sorted(cards)
    for tag, texts in cards.items():
        records = reader.get_data("text", tag)
        assert [r.text.encoded_text_string for r in records] == texts, tag
        assert [r.id for r in records] == ([1, 2] if "rollout" in tag else [2])

    with open(tmp_path / "rollouts.jsonl", encoding="utf-8") as f:
        lines = [json.loads(line) for line in f]
    assert len(lines) == 10
    assert lines[1] == {"step": 1, "kind": "rollout", "prompt": RECORDS[0]["src"], "completion": COMPLETIONS[1],
                        "reward": rows[1]["reward"], "scores": rows[1]["scores"], "length": rows[1]["length"]}
    assert [(line["kind"], line["completion"]) for line in lines] == \
        [("rollout", c) for c in COMPLETIONS + COMPLETIONS[::-1]] + [("eval", COMPLETIONS[0])] + \
        [("tools", TOOL_ROW["completion"])]
    assert lines[-2]["reward"] is None
    assert lines[-1] == {"step": 2, "kind": "tools", **TOOL_ROW}  # every turn in rollouts.jsonl
    assert "\ufffd" not in open(tmp_path / "rollouts.jsonl", encoding="utf-8").read()


# --------------------------------------------------------------------------------------- the real server

def readme_visualdl_commands(repo_root):
    """Every `visualdl ...` command the README tells a user to type (inline code or a fenced line)."""
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    inline = re.findall(r"`(visualdl [^`]+)`", readme)
    fenced = [line.strip() for block in re.findall(r"```bash\n(.*?)```", readme, re.S)
              for line in block.splitlines() if line.strip().startswith("visualdl ")]
    return inline + fenced


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, headers=None, timeout=30):
    """(status, headers, body) of a GET; error statuses are returned, not raised. No Accept-Language unless
    `headers` has one (urllib sends none), as with curl."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


@pytest.fixture(scope="module")
def server(repo_root, tokenizer, tmp_path_factory):
    """The README's `visualdl` command (its logdir replaced) serving write_logs' logs: (base_url, rows)."""
    commands = readme_visualdl_commands(repo_root)
    assert commands, "README.md names no visualdl command"
    argvs = [shlex.split(c) for c in commands]
    for argv in argvs:  # all the README's commands differ only in their logdir, so running one covers them all
        assert argv[:2] == ["visualdl", "--logdir"] and argv[3:] == argvs[0][3:], commands
    logdir, rows = write_logs(tmp_path_factory.mktemp("vdl_run"), tokenizer)
    port = free_port()
    executable = os.path.join(os.path.dirname(sys.executable), "visualdl")
    argv = [executable, "--logdir", str(logdir), *argvs[0][3:],
            "--host", "127.0.0.1", "--port", str(port), "--disable-telemetry"]
    log_path = tmp_path_factory.mktemp("vdl_server") / "server.log"
    with open(log_path, "wb") as log_file:
        proc = subprocess.Popen(argv, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"visualdl exited with {proc.returncode}:\n{log_path.read_text()}"
            try:
                if http_get(base + "/alive", timeout=5)[0] == 204:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"visualdl did not answer within 120 s:\n{log_path.read_text()}"
            time.sleep(0.3)
        yield base, rows
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)


def api(base, method, **params):
    status, headers, body = http_get(f"{base}/app/api/{method}?{urllib.parse.urlencode(params)}")
    assert status == 200, (method, params, status, body[:300])
    return body


@pytest.mark.parametrize("accept_language", [None, "fr-FR,fr;q=0.9", "en-GB,en;q=0.8", "zh-CN,zh;q=0.9"])
def test_the_readme_visualdl_command_serves_its_pages(server, accept_language):
    base, _ = server
    headers = {"Accept-Language": accept_language} if accept_language else {}
    for page in ("/app/scalar", "/app/text"):
        status, response_headers, body = http_get(base + page, headers=headers)
        assert status == 200, (page, accept_language, body[:300])
        assert response_headers.get_content_type() == "text/html" and b"<title>VisualDL</title>" in body
        # the page's language: the UI reads it from this cookie
        assert "vdl_lng=en;" in response_headers["Set-Cookie"]


def test_the_server_returns_the_logged_scalars(server):
    base, _ = server
    runs = json.loads(api(base, "runs"))["data"]
    assert len(runs) == 1
    for tag in ("train/reward", "train/kl"):
        data = json.loads(api(base, "scalar/list", run=runs[0], tag=tag))["data"]
        assert [(step, value) for _, step, value in data] == [(s, m[tag]) for s, m in SCALARS.items()]


def test_the_server_shows_one_text_card_per_sample(server):
    base, rows = server
    runs = json.loads(api(base, "runs"))["data"]
    tags = json.loads(api(base, "text/tags"))["data"]
    assert tags["runs"] == runs
    cards = expected_cards(rows)
    assert sorted(tags["tags"][0]) == sorted(cards)
    for tag, texts in cards.items():
        steps = json.loads(api(base, "text/list", run=runs[0], tag=tag))["data"]
        assert [s["step"] for s in steps] == ([1, 2] if "rollout" in tag else [2])
        shown = [api(base, "text/text", run=runs[0], tag=tag, index=i).decode("utf-8") for i in range(len(steps))]
        assert shown == texts, tag


def test_the_logger_prints_the_readme_command(repo_root):
    """The command MetricsLogger prints at start-up is the one the server tests above ran."""
    assert visualdl_command("output/quickstart/vdl_log") in readme_visualdl_commands(repo_root)
    assert visualdl_command("my runs/vdl") == "visualdl --logdir 'my runs/vdl' --language en"


def test_every_documented_visualdl_command_sets_the_language(repo_root):
    """Without `--language`, VisualDL answers HTTP 500 to curl and to browsers in other languages (visualdl_command);
    every command README.md and docs/ give must carry it."""
    import re

    found = []
    for path in [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]:
        for line in path.read_text(encoding="utf-8").splitlines():
            for command in re.findall(r"(?:^|`)\s*(visualdl --logdir[^`#]*)", line):
                found.append((path.name, command.strip()))
    assert len(found) >= 5
    assert [f for f in found if "--language en" not in f[1]] == []
