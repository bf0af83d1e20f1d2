"""Shared test fixtures.

Real data lives in `../shared/data` beside the repository (GSM8K, Knights-and-Knaves). A user's fresh clone does not
have it, so tests that need it take the `shared_data` fixture and are skipped with the reason when it is absent.
"""
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
# As root, a python-tool snippet without namespaces runs as a user of its own, which must be able to run the
# interpreter: named for the whole session, subprocesses included (tests/sandbox_helpers.py says why).
if hasattr(os, "geteuid") and os.geteuid() == 0:
    from sandbox_helpers import interpreter_for_call_users

    os.environ.setdefault("PADDLE_GRPO_SANDBOX_PYTHON", interpreter_for_call_users())
SHARED_DATA = pathlib.Path(os.environ.get("PADDLE_GRPO_SHARED_DATA", REPO.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data():
    """Path of ../shared/data; skips the test when the directory is not there."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA} (only present beside the project's own checkout; "
                    "set PADDLE_GRPO_SHARED_DATA to point elsewhere)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def repo_root():
    return REPO


TINY_CORPUS = [
    "<|im_start|>user\nA very special island is inhabited only by knights and knaves. Knights always tell the "
    "truth, and knaves always lie. You meet 2 inhabitants: Zoey and Ethan.<|im_end|>\n<|im_start|>assistant\n"
    "<think> Zoey says Ethan is a knave. </think><answer>(1) Zoey is a knight\n(2) Ethan is a knave</answer>"
    "<|im_end|>",
    "What is 12 + 35? The answer is 47. #### 47",
] * 10


@pytest.fixture(scope="session")
def tiny_policy_dir(tmp_path_factory):
    """A tiny random Qwen2 policy + byte-level BPE tokenizer saved with save_pretrained (built once per session)."""
    from paddle_grpo.recipes.tiny import build_tiny_policy

    path = tmp_path_factory.mktemp("tiny_policy")
    build_tiny_policy(str(path), TINY_CORPUS, vocab_size=320, seed=0)
    return str(path)


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory):
    """A tiny random reward model (one-label Qwen2ForSequenceClassification + tokenizer), seeded, built once."""
    from paddle_grpo.recipes.tiny import build_reward_model

    path = tmp_path_factory.mktemp("tiny_reward_model")
    build_reward_model(str(path), TINY_CORPUS, vocab_size=320, seed=0)
    return str(path)


TOOL_CORPUS = [
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 123*45?<|im_end|>\n"
    "<|im_start|>assistant\n<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"expression\": \"123*45\"}}\n"
    "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n5535\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\nThe answer is 5535.<|im_end|>",
    "print the result of the python code; error: unknown tool; output cut",
] * 8


@pytest.fixture(scope="session")
def tool_tokenizer(tmp_path_factory):
    """A tiny Qwen2 BPE tokenizer with Qwen2.5's `<tool_call>` / `</tool_call>` as single added tokens (as in
    Qwen2.5's vocabulary), trained on a tool-call conversation (tests of tools and multi-turn rollouts)."""
    from paddle_grpo.recipes.tiny import build_tokenizer

    return build_tokenizer(TOOL_CORPUS, str(tmp_path_factory.mktemp("tool_tok")), vocab_size=400,
                           added_tokens=("<tool_call>", "</tool_call>"))


@pytest.fixture(scope="session")
def plain_tokenizer(tmp_path_factory):
    """The same without the added tokens: the tool-call markers are then several tokens each."""
    from paddle_grpo.recipes.tiny import build_tokenizer

    return build_tokenizer(TOOL_CORPUS, str(tmp_path_factory.mktemp("plain_tok")), vocab_size=400)


@pytest.fixture
def serve():
    """serve(app, **kw) -> a started BackgroundServer (real waitress on a free loopback port; has .url); all are
    stopped after the test."""
    from reward_server.serving import BackgroundServer

    servers = []

    def start(app, **kwargs):
        server = BackgroundServer(app, **kwargs).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def who_is_files(tmp_path):
    """Four "Who is X?" prompts (train.jsonl) and rewards.py:r, a reward that varies with the completion's length:
    the smallest data and reward a real Trainer step needs."""
    (tmp_path / "train.jsonl").write_text("".join(f'{{"src": "Who is {n}?", "tgt": "{n}"}}\n'
                                                  for n in ("Ann", "Bob", "Cid", "Dan")))
    (tmp_path / "rewards.py").write_text("def r(prompts, completions, **kw):\n"
                                         "    return [0.1 * len(c) for c in completions]\n")
    return tmp_path


@pytest.fixture(scope="session", autouse=True)
def cpu_tuned():
    """The CPU settings run_rl.py applies (paddle_grpo/cpu_tuning.py), before any test's first matmul. MKL fixes its
    code path at its first call: a test that multiplied before some test loaded a model (which applies them) left
    the rest of the session on MKL's generic kernels on AMD (~4x slower GEMMs, and not the kernels users run)."""
    from paddle_grpo import cpu_tuning

    return cpu_tuning.apply()
