"""`run_rl.py --dry_run` of a multi-turn run (dry_run.check_tools): the tools load (names and schema count printed),
an unknown tool or format is a problem naming its key, the tool server's GET /tools is asked (a real server on
127.0.0.1) and must serve every named tool, an unreachable one is named with its URL; tool keys set without tools are
in the table of keys without effect."""
import socket

import pytest

from dry_run_helpers import run_rl_main, write_kk_data


@pytest.fixture
def base(tmp_path, tiny_policy_dir):
    train, _ = write_kk_data(tmp_path)
    return ["--actor_model_name_or_path", tiny_policy_dir, "--train_datasets", train, "--use_rm_server", "false",
            "--reward_funcs", "kk", "--global_batch_size", "2", "--rollout_n", "2", "--per_device_train_batch_size",
            "2", "--max_dec_len", "16", "--min_dec_len", "1", "--max_prompt_len", "64", "--max_length", "80",
            "--kl_coeff", "0", "--output_dir", tmp_path / "out"]


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_in_process_tools_load_and_are_listed(base, capsys):
    status, out, _ = run_rl_main([*base, "--tools", "calculator", "--dry_run"], capsys)
    assert status == 0, out
    assert "  tools: calculator (1 schemas)" in out


def test_an_unknown_tool_is_a_problem_listing_the_registered_ones(base, capsys):
    status, out, _ = run_rl_main([*base, "--tools", "calculator,calc", "--dry_run"], capsys)
    assert status == 2
    assert "  - tools: unknown tool 'calc'; registered tools: calculator" in out


def test_an_unknown_format_is_a_problem_naming_tool_format(base, capsys):
    status, out, _ = run_rl_main([*base, "--tools", "calculator", "--tool_format", "xml", "--dry_run"], capsys)
    assert status == 2
    assert "  - tool_format: 'xml': unknown tool_format 'xml'; expected one of auto, hermes, qwen" in out


def test_an_unreachable_tool_server_is_named_with_its_url(base, capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    status, out, _ = run_rl_main([*base, "--tools", "calculator", "--tool_server", url, "--dry_run"], capsys)
    assert status == 2
    assert f"  - tool_server: {url}/tools cannot be reached: ConnectionError" in out


def test_tool_keys_without_tools_are_in_the_table_of_keys_without_effect(base, capsys):
    status, out, _ = run_rl_main([*base, "--max_turns", "2", "--dry_run"], capsys)
    assert status == 0
    table = out.split("keys set here that have no effect on this device")[1]
    line = next(l for l in table.splitlines() if l.strip().startswith("max_turns"))
    assert "command line" in line and "tools is empty: rollouts are single-turn" in line
