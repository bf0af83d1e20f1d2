"""docs/rewards.md and docs/tools.md run as written: every `python -m reward_server ...` block starts a real server
(the CLI, on a free port instead of 8731), every `curl` block after it is run against that server, and the reply
must equal the block that follows it, byte for byte (only `request_id`, random per request, is taken from the
docs), except that the numbers of a server with a reward model are compared to a stated float32 precision
(REWARD_MODEL_TOL).

Each curl runs twice: with the real curl through bash, as a user pastes it, and parsed with shlex and sent with
requests, so the check does not depend on curl being installed. A `python tools/models/build_tiny_reward_model.py DIR`
block builds the reward model the next server serves; it runs as written, with DIR moved into the test's tmp_path.
The block making a token file (MAKE_TOKEN) runs as written in the test's tmp_path; a server's `--token-file
server_token` and a curl's `$(cat server_token)` then read that file.
"""
import json
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import pytest
import requests
from reward_model_helpers import REWARD_MODEL_TOL

from paddle_grpo.rewards import available_rewards, get_reward_fn

REPO = pathlib.Path(__file__).resolve().parents[2]
DOC_PORT = "http://127.0.0.1:8731"
DOC_RM_DIR = "/tmp/tiny_reward_model"  # where the page builds its tiny reward model
BUILD_RM = "python tools/models/build_tiny_reward_model.py"
TOKEN_FILE = "server_token"
MAKE_TOKEN = f'python -c "import secrets; print(secrets.token_urlsafe(24))" > {TOKEN_FILE} && chmod 600 {TOKEN_FILE}'
CAT_TOKEN = f"$(cat {TOKEN_FILE})"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
REQUEST_ID = re.compile(r'"request_id":"([^"]*)"')
# A JSON string (skipped: digits in it are text) or a JSON number (compared as a number).
JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?')
# The tiny reward model's score is a float32 forward pass (tools/models/build_tiny_reward_model.py), and other CPUs'
# kernels sum in other orders (2026-11-25: an AMD EPYC differed from the Intel-written page by 2e-8): numbers of a
# server with --reward-model are compared within reward_model_helpers.REWARD_MODEL_TOL (its derivation is there). The
# rule-based rewards are float64 Python arithmetic, the same everywhere: compared exactly.


PAGES = ("rewards.md", "tools.md")


def doc_text(repo_root, page="rewards.md"):
    return (repo_root / "docs" / page).read_text(encoding="utf-8")


def sections(text):
    """[(server argv, [(curl command, expected reply)])] in the order of the page.

    Every bash block must be a one-line server start, one curl command, or the reward-model build (run by
    test_documented_example_matches_a_real_server before a server with --reward-model), and every curl block must
    be followed by a plain block with the reply, so nothing on the page escapes the check."""
    blocks = FENCE.findall(text)
    out, i = [], 0
    while i < len(blocks):
        lang, body = blocks[i]
        command = body.strip()
        i += 1
        if lang != "bash":
            continue
        if command.startswith("python -m reward_server"):
            assert "\n" not in command, f"docs: a server start must be one line: {command!r}"
            argv = shlex.split(command)[3:]
            assert "--port" not in argv and "&" not in argv, command  # the examples use the default port
            out.append((argv, []))
        elif command.startswith("curl "):
            assert out, f"docs: curl before any server start: {command[:80]!r}"
            assert i < len(blocks) and blocks[i][0] == "", \
                f"docs: curl without a plain reply block after it: {command[:80]!r}"
            out[-1][1].append((command, blocks[i][1].strip()))
            i += 1
        elif command.startswith(BUILD_RM):
            assert command == f"{BUILD_RM} {DOC_RM_DIR}", f"docs: build the model in {DOC_RM_DIR}"
        elif command == MAKE_TOKEN:
            pass  # run by test_documented_example_matches_a_real_server before a server with --token-file
        else:
            raise AssertionError(f"docs: a bash block that is neither a server start nor a curl: "
                                 f"{command[:80]!r}")
    return out


def send_like_curl(command, token=None):
    """The reply body to `command` (curl -s [-H H]... [-d DATA] URL), sent with requests (`token`: the value of the
    command's $(cat server_token))."""
    if token is not None:
        command = command.replace(CAT_TOKEN, token)
    args = shlex.split(command)
    assert args[0] == "curl", command
    headers, data, url = {}, None, None
    rest = iter(args[1:])
    for arg in rest:
        if arg == "-s":
            continue
        if arg == "-H":
            name, value = next(rest).split(":", 1)
            headers[name.strip()] = value.strip()
        elif arg == "-d":
            data = next(rest).encode()
        elif arg.startswith("http://"):
            url = arg
        else:
            raise AssertionError(f"curl option {arg!r} in the docs is not understood by this test")
    if data is None:
        return requests.get(url, headers=headers, timeout=60).text
    return requests.post(url, data=data, headers=headers, timeout=60).text


def assert_same_reply(documented, actual, command, tol=0.0):
    """`actual` is the `documented` reply: byte for byte, or with every number within `tol` when tol > 0."""
    got = actual.strip()
    ids = REQUEST_ID.findall(got)
    if ids:  # random per request: it must be there and look like one; its value is the docs'
        assert len(ids) == 1 and re.fullmatch(r"[0-9a-f]{16}", ids[0]), got
        wanted = REQUEST_ID.findall(documented)
        assert len(wanted) == 1, f"the docs show no request_id for {command[:80]!r}"
        got = got.replace(f'"request_id":"{ids[0]}"', f'"request_id":"{wanted[0]}"')
    json.loads(documented)  # the docs show valid JSON
    message = f"\ncommand:\n{command}\ndocumented:\n{documented}\nreal:\n{got}"
    if tol == 0:
        assert got == documented, message
        return

    def numbers_apart(text):  # the text with each number replaced by "#", and the numbers
        numbers = []

        def take(match):
            if match.group(0).startswith('"'):
                return match.group(0)
            numbers.append(float(match.group(0)))
            return "#"
        return JSON_TOKEN.sub(take, text), numbers

    (got_skeleton, got_numbers), (doc_skeleton, doc_numbers) = numbers_apart(got), numbers_apart(documented)
    assert got_skeleton == doc_skeleton and len(got_numbers) == len(doc_numbers), message
    for real, shown in zip(got_numbers, doc_numbers):
        assert abs(real - shown) <= tol, f"{real} differs from the documented {shown} by more than {tol:.1e}{message}"


def pytest_generate_tests(metafunc):
    if "section" in metafunc.fixturenames:  # one test per server start on the page
        found = [s for page in PAGES for s in sections(doc_text(REPO, page))]
        # the reward model's numbers are float32 results: rerun on other kernels with the `numerics` tests
        params = [pytest.param(s, marks=pytest.mark.numerics) if "--reward-model" in s[0] else s for s in found]
        metafunc.parametrize("section", params, ids=[" ".join(argv) for argv, _ in found])


def test_page_has_an_example_for_every_builtin_reward(repo_root):
    found = sections(doc_text(repo_root))
    shown = {name for argv, examples in found if examples
             for name in argv[argv.index("--reward") + 1].split(",")}
    # The rewards package's own (other modules, e.g. paddle_grpo.recipes.quickstart, may register theirs when imported).
    builtin = {name for name in available_rewards()
               if get_reward_fn(name).__module__.startswith("paddle_grpo.rewards.")}
    assert {"kk", "gsm8k", "gsm8k_format", "tag_format", "tag_format_strict", "rouge_l",
            "length_similarity"} <= builtin
    assert builtin <= shown, builtin - shown
    assert sum(len(examples) for _, examples in found) >= 12


def build_documented_reward_model(argv, out_dir, repo_root):
    """argv with the page's reward-model directory replaced by out_dir, after running the page's build command
    there (when argv serves a reward model)."""
    if DOC_RM_DIR not in argv:
        return argv
    command = shlex.split(f"{BUILD_RM} {out_dir}")
    done = subprocess.run([sys.executable, *command[1:]], cwd=str(repo_root), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return [str(out_dir) if a == DOC_RM_DIR else a for a in argv]


def make_documented_token(argv, tmp_path):
    """(argv with the page's token file in tmp_path, the token) after running MAKE_TOKEN there as written, when argv
    reads the token file; else (argv, None)."""
    if TOKEN_FILE not in argv:
        return argv, None
    done = subprocess.run(["bash", "-c", MAKE_TOKEN], cwd=str(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    path = tmp_path / TOKEN_FILE
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    return [str(path) if a == TOKEN_FILE else a for a in argv], path.read_text().strip()


def test_documented_example_matches_a_real_server(section, start_cli, free_port, repo_root, tmp_path):
    argv, examples = section
    rm_dir = tmp_path / "tiny_reward_model"
    argv = build_documented_reward_model(argv, rm_dir, repo_root)
    argv, token = make_documented_token(argv, tmp_path)
    tol = REWARD_MODEL_TOL if "--reward-model" in argv else 0.0
    port = free_port()
    proc = start_cli(port, *argv)
    url = f"http://127.0.0.1:{port}"
    for command, documented in examples:
        local = command.replace(DOC_PORT, url)
        assert local != command, f"the example does not use {DOC_PORT}: {command[:80]!r}"
        if shutil.which("curl") and shutil.which("bash"):  # (from tmp_path, where the token file is)
            done = subprocess.run(["bash", "-c", local], capture_output=True, text=True, timeout=120,
                                  cwd=str(tmp_path))
            assert done.returncode == 0, done.stderr
            assert_same_reply(documented, done.stdout.replace(str(rm_dir), DOC_RM_DIR), command, tol)
        assert CAT_TOKEN not in local or token is not None, f"a curl reads {TOKEN_FILE}, its server does not"
        assert_same_reply(documented, send_like_curl(local, token).replace(str(rm_dir), DOC_RM_DIR), command, tol)
    if argv == ["--reward", "kk"]:  # the start-up line the page quotes is the one this server logged
        quoted = re.search(r"`(reward server listening on [^`]*)`", doc_text(repo_root)).group(1)
        assert quoted.replace(DOC_PORT, url) in proc.log_path.read_text()


def test_every_server_command_in_readme_and_docs_parses_and_loads(repo_root, tiny_reward_model_dir, tmp_path):
    # A literal `[--token T]` or a misspelt reward in any page fails here, not in a user's terminal; so does a page
    # serving python without a token (InsecureServerError).
    token_file = tmp_path / TOKEN_FILE
    token_file.write_text("doc-token\n")
    from reward_server import create_app
    from reward_server.__main__ import build_rewards, parse_args

    pages = [repo_root / "README.md", *sorted((repo_root / "docs").glob("*.md"))]
    seen = 0
    for page in pages:
        for lang, body in FENCE.findall(page.read_text(encoding="utf-8")):
            for line in body.splitlines():
                if lang != "bash" or not line.strip().startswith("python -m reward_server"):
                    continue
                argv = [tiny_reward_model_dir if a == DOC_RM_DIR else str(token_file) if a == TOKEN_FILE else a
                        for a in shlex.split(line, comments=True)[3:] if a != "&"]
                try:
                    args = parse_args(argv)
                except SystemExit:
                    raise AssertionError(f"{page.name}: `{line.strip()}` is rejected by the CLI") from None
                create_app(build_rewards(args), weights=args.weights, token=args.token,
                           timeout_s=args.timeout_s or None, tools=args.tool, host=args.host,
                           allowed_hosts=args.allowed_hosts, insecure_no_token=args.insecure_no_token)
                seen += 1
    assert seen >= 15, seen
