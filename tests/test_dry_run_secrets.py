"""The dry run's `launch:` line never prints a token given on the command line (reward_server_token,
tool_server_token: config.SECRET_KEYS), in either spelling (`--key value`, `--key=value`)."""
import pytest

from dry_run_helpers import base_args, run_rl_main

from paddle_grpo.config import SECRET_KEYS, config_from_dict
from paddle_grpo.dry_run import launch_command, redact_secrets


@pytest.fixture
def base(tmp_path, tiny_policy_dir):
    """Arguments of a valid in-process-reward run on the tiny model (no config file)."""
    return base_args(tmp_path, tiny_policy_dir)


def test_redact_secrets():
    assert set(SECRET_KEYS) == {"reward_server_token", "tool_server_token"}
    argv = ["cfg.yaml", "--tool_server_token", "T0k-1", "--reward_server_token=T0k-2", "--seed", "3",
            "--tool_server", "http://h:1"]
    assert redact_secrets(argv) == ["cfg.yaml", "--tool_server_token", "***", "--reward_server_token=***", "--seed",
                                    "3", "--tool_server", "http://h:1"]
    line = launch_command(config_from_dict({}), argv, "cpu", environ={})  # no thread variables in front
    assert "T0k" not in line and line == ("python run_rl.py cfg.yaml --tool_server_token '***' "
                                          "'--reward_server_token=***' --seed 3 --tool_server http://h:1")


def test_the_dry_runs_launch_line_hides_the_tool_server_token(base, serve, capsys):
    # Before: the launch line ended `--tool_server_token T0k-secret` (the command-line arguments as given).
    from reward_server import create_app

    url = serve(create_app([], tools="calculator", token="T0k-secret")).url
    status, out, _ = run_rl_main([*base, "--tools", "calculator", "--tool_server", url, "--tool_server_token",
                                  "T0k-secret", "--dry_run"], capsys)
    assert status == 0, out
    launch = next(line for line in out.splitlines() if line.startswith("launch: "))
    assert "--tool_server_token '***'" in launch
    assert "T0k-secret" not in out


def test_the_dry_run_shows_where_an_environment_token_came_from_not_its_value(base, monkeypatch, capsys):
    monkeypatch.setenv("REWARD_SERVER_TOKEN", "T0k-from-env")
    status, out, _ = run_rl_main([*base, "--dry_run"], capsys)
    assert status == 0, out
    assert "reward_server_token: '***'  # from $REWARD_SERVER_TOKEN" in out.splitlines()
    resolved = next(line for line in out.splitlines() if line.startswith("configuration: ")).split("resolved: ")[1]
    with open(resolved.split(";")[0], encoding="utf-8") as f:
        assert "reward_server_token: '***'  # from $REWARD_SERVER_TOKEN" in f.read().splitlines()
    assert "T0k-from-env" not in out


def test_a_token_without_effect_is_listed_with_its_source_not_its_value(base, monkeypatch, capsys):
    # Before: the table of keys without effect printed the value (`tool_server_token  T0k-unused  $TOOL_...`).
    monkeypatch.setenv("TOOL_SERVER_TOKEN", "T0k-unused")
    status, out, _ = run_rl_main([*base, "--dry_run"], capsys)
    assert status == 0, out
    table = out.split("keys set here that have no effect on this device")[1]
    row = next(line.split() for line in table.splitlines() if line.strip().startswith("tool_server_token"))
    assert row[:3] == ["tool_server_token", "'***'", "$TOOL_SERVER_TOKEN"]
    assert "T0k-unused" not in out
