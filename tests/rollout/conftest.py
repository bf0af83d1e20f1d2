"""Fixtures of the rollout tests: a tiny policy that makes real tool calls (tests/tool_policy_helpers.py)."""
import pytest


@pytest.fixture(scope="session")
def tool_policy_dir(tmp_path_factory):
    """A tiny Qwen2 policy + tokenizer (with `<tool_call>` tokens) fine-tuned to call tools; built once (~15 s)."""
    from tool_policy_helpers import build_tool_policy

    path = str(tmp_path_factory.mktemp("tool_policy"))
    build_tool_policy(path)
    return path
