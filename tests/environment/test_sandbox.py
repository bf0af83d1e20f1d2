"""The `python` tool in a real subprocess: output, failures, and each limit actually hit (CPU, memory, wall time,
file size), an empty environment and its own temporary directory per call."""
import ast
import os
import time
import uuid

import pytest

from paddle_grpo.environment import Tool, get_tool
from paddle_grpo.environment.sandbox import run_python


def limited(**limits):
    def python(code: str) -> str:
        return run_python(code, **limits)

    return Tool("python", python)


def test_output_and_failures():
    tool = get_tool("python")
    assert tool.call({"code": "print(123*45)"}).content == "5535\n"
    result = tool.call({"code": "import sys\nprint('partial')\nraise ValueError('bad input')"})
    assert result.error == "exception"
    assert result.content.startswith("error: the code exited with status 1:\npartial\n[stderr]\nTraceback")
    assert result.content.endswith("ValueError: bad input\n")
    assert tool.call({"code": "import sys; sys.exit(3)"}).content == "error: the code exited with status 3:\n" \
                                                                     "(no output)"


def test_cpu_limit_kills_a_busy_loop():
    start = time.monotonic()
    result = limited(cpu_s=1, wall_s=30).call({"code": "print('start', flush=True)\nwhile True: pass"})
    assert (result.error, result.content) == (
        "timeout", "error: the code used up its CPU-time limit of 1 s (all its processes together); output so far:"
        "\nstart")
    assert time.monotonic() - start < 30  # the CPU limit, not the wall limit, ended it


def test_memory_limit():
    result = limited(memory_mb=300).call({"code": "x = bytearray(400 << 20)"})
    assert result.error == "exception"
    assert result.content.startswith("error: the code hit the memory limit of 300 MB")
    assert "MemoryError" in result.content
    # The same allocation fits under a larger limit: the limit, not the machine, refused it.
    assert limited(memory_mb=1000).call({"code": "x = bytearray(400 << 20); print(len(x) >> 20)"}).content == "400\n"


def test_wall_time_limit_kills_a_sleeper_and_its_children():
    marker = f"sleeper-{uuid.uuid4().hex}"
    start = time.monotonic()
    code = ("import subprocess, sys, time\n"
            f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', {marker!r}])\n"
            "print('started', flush=True)\ntime.sleep(60)")
    result = limited(wall_s=1.5).call({"code": code})
    elapsed = time.monotonic() - start
    assert result.error == "timeout"
    assert result.content == ("error: the code did not finish within the wall-time limit of 1.5 s; output so far:\n"
                              "started")
    # 1.5 s plus interpreter start-ups and the kill, with a loaded machine's margin; far below the 60 s sleep.
    assert elapsed < 10, elapsed
    assert running_with(marker) == []  # the child was killed with the snippet


def running_with(marker):
    """PIDs of live (not zombie) processes whose command line holds `marker` (the host's view of /proc)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{name}/status") as f:
                zombie = "State:\tZ" in f.read()  # a zombie waiting for its reaper is dead
        except OSError:
            continue
        if marker.encode() in cmdline and not zombie:
            found.append(int(name))
    return found


def test_file_size_limit():
    code = "open('big.bin', 'wb').write(b'x' * (3 << 20))"
    result = limited(file_mb=1).call({"code": code})
    assert result.error == "exception"
    assert result.content.startswith("error: the code wrote more than the file-size limit of 1 MB")


def test_output_is_cut():
    content = limited(max_output_chars=100).call({"code": "print('a' * 5000)"}).content
    assert content == "a" * 100 + "\n[... 4901 more bytes not shown]"


def test_empty_environment(monkeypatch):
    monkeypatch.setenv("SECRET_TOKEN_FOR_TEST", "do-not-leak")
    content = get_tool("python").call({"code": "import os; print(sorted(os.environ))"}).content
    # Nothing of the parent's environment; Python itself sets LC_CTYPE when it coerces the C locale (PEP 538).
    assert ast.literal_eval(content) in ([], ["LC_CTYPE"])


def test_own_temporary_directory_per_call():
    code = "import os; open('mine.txt', 'w').write('x'); print(os.getcwd()); print(sorted(os.listdir('.')))"
    first = get_tool("python").call({"code": code}).content.splitlines()
    second = get_tool("python").call({"code": code}).content.splitlines()
    assert first[1] == second[1] == "['mine.txt']"  # each starts empty: the other's file is not there
    assert first[0] != second[0] and first[0] != os.getcwd()
    assert not os.path.exists(first[0]) and not os.path.exists(second[0])  # removed afterwards


@pytest.mark.parametrize("code", ["print(1)", ""])
def test_trivial_snippets(code):
    assert get_tool("python").call({"code": code}).content == ("1\n" if code else "")


def test_python_calls_of_several_rows_run_concurrently(tool_tokenizer):
    # The rollout starts each call in its own thread; the subprocesses run side by side. 4 snippets sleeping 0.5 s
    # take >= 2.0 s one after another; side by side 0.5 s plus 4 interpreter start-ups (~0.1-0.2 s of CPU each)
    # shared by the cores: under 2.0 s even with a loaded machine's start-ups.
    from paddle_grpo.data import tokenize_prompts
    from paddle_grpo.environment import HermesFormat, ToolEnvironment, load_tools

    def call(row):
        code = f"import time; time.sleep(0.5); print({row})"
        text = f'<tool_call>{{"name": "python", "arguments": {{"code": "{code}"}}}}</tool_call>'
        return tokenize_prompts(tool_tokenizer, [text])[0]

    with ToolEnvironment(load_tools("python"), HermesFormat(), tool_tokenizer, timeout_s=30) as env:
        start = time.monotonic()
        turns = [p.result() for p in [env.begin(call(row), True) for row in range(4)]]
        elapsed = time.monotonic() - start
    assert [t.messages[0]["content"] for t in turns] == [f"{row}\n" for row in range(4)]
    assert elapsed < 2.0, elapsed
