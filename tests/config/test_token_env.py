"""The server tokens (config.SECRET_KEYS) from the environment: `$REWARD_SERVER_TOKEN` / `$TOOL_SERVER_TOKEN` when
the file and the command line leave the key unset; the source is recorded (given_keys), the value never written."""
import pytest

from paddle_grpo.config import ConfigError, config_from_dict, given_keys, load_config, write_config

ENV = {"reward_server_token": "REWARD_SERVER_TOKEN", "tool_server_token": "TOOL_SERVER_TOKEN"}


def load(tmp_path, text="seed: 1\n", overrides=()):
    path = tmp_path / "cfg.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, overrides, device="cpu", warn=False)


@pytest.mark.parametrize("key, variable", ENV.items())
def test_an_unset_token_comes_from_the_environment(tmp_path, monkeypatch, key, variable):
    monkeypatch.setenv(variable, "env-T0k")
    cfg = load(tmp_path)
    assert getattr(cfg, key) == "env-T0k"
    assert given_keys(cfg)[key] == f"${variable}"


@pytest.mark.parametrize("key, variable", ENV.items())
def test_no_token_when_the_variable_is_unset_or_empty(tmp_path, monkeypatch, key, variable):
    monkeypatch.delenv(variable, raising=False)
    cfg = load(tmp_path)
    assert getattr(cfg, key) == "" and key not in given_keys(cfg)
    monkeypatch.setenv(variable, "")
    cfg = load(tmp_path)
    assert getattr(cfg, key) == "" and key not in given_keys(cfg)


@pytest.mark.parametrize("key, variable", ENV.items())
def test_the_file_and_the_command_line_win_over_the_environment(tmp_path, monkeypatch, key, variable):
    monkeypatch.setenv(variable, "env-T0k")
    path = tmp_path / "cfg.yaml"
    cfg = load(tmp_path, f"seed: 1\n{key}: file-T0k\n")
    assert (getattr(cfg, key), given_keys(cfg)[key]) == ("file-T0k", f"{path}:2")
    cfg = load(tmp_path, overrides=[f"--{key}", "cli-T0k"])
    assert (getattr(cfg, key), given_keys(cfg)[key]) == ("cli-T0k", "command line")
    # an explicit empty value means no token, whatever the environment holds
    cfg = load(tmp_path, f"seed: 1\n{key}: ''\n")
    assert (getattr(cfg, key), given_keys(cfg)[key]) == ("", f"{path}:2")
    cfg = load(tmp_path, overrides=[f"--{key}", ""])
    assert (getattr(cfg, key), given_keys(cfg)[key]) == ("", "command line")


def test_a_config_from_a_dict_does_not_read_the_environment(monkeypatch):
    # tests and tools build configs from dicts: what the shell exports must not change them
    monkeypatch.setenv("REWARD_SERVER_TOKEN", "env-T0k")
    assert config_from_dict({}).reward_server_token == ""


def test_a_token_from_the_environment_is_shown_with_its_source_and_never_written(tmp_path, monkeypatch):
    monkeypatch.setenv("REWARD_SERVER_TOKEN", "env-T0k-1")
    monkeypatch.setenv("TOOL_SERVER_TOKEN", "env-T0k-2")
    cfg = load(tmp_path, "seed: 1\ntool_server_token: file-T0k\n")
    text = cfg.format(only_changed=True)
    assert "reward_server_token: '***'  # from $REWARD_SERVER_TOKEN" in text.splitlines()
    assert "tool_server_token: '***'" in text.splitlines()  # from the file: no note, as for any key set there
    out = tmp_path / "out" / "config.yaml"
    write_config(cfg, out)  # what the trainer writes to output_dir/config.yaml
    written = out.read_text(encoding="utf-8")
    assert "T0k" not in written and "T0k" not in text
    assert "reward_server_token: '***'  # from $REWARD_SERVER_TOKEN" in written.splitlines()


def test_an_exported_token_without_effect_is_not_warned_about_at_every_start(tmp_path, monkeypatch, caplog):
    # The variable belongs to the shell (it may serve the reward server started there), not to this config: a run
    # without tools warns about a tool_server_token set in its file, not about one in the environment.
    monkeypatch.setenv("TOOL_SERVER_TOKEN", "env-T0k")
    path = tmp_path / "cfg.yaml"
    path.write_text("seed: 1\n", encoding="utf-8")
    with caplog.at_level("WARNING"):
        load_config(path, device="cpu")
    assert not [r for r in caplog.records if "tool_server_token" in r.getMessage()]
    path.write_text("seed: 1\ntool_server_token: file-T0k\n", encoding="utf-8")
    with caplog.at_level("WARNING"):
        load_config(path, device="cpu")
    [said] = [r.getMessage() for r in caplog.records if "tool_server_token" in r.getMessage()]
    assert said.startswith(f"{path}:2: key 'tool_server_token' has no effect here: ") and "T0k" not in said


def test_a_token_of_the_wrong_type_is_not_echoed(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("reward_server_token: [s3cret, T0k]\n", encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_config(path, device="cpu", warn=False)
    assert str(e.value) == f"{path}:1: key 'reward_server_token' expects a string, got *** (list)"
