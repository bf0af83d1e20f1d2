"""The tool keys (config/tools.py ToolArguments; docs/tools.md "Config keys"): parsing, range and URL errors that name
the key, the one-line notes when a key has no effect (tools empty; tool_server_token and tool_server_max_unanswered
without tool_server), the key reaching the RemoteToolSet, the refusal of an encoder-decoder policy, and the token
kept secret."""
import pytest

from paddle_grpo.config import ConfigError, config_from_dict, encoder_decoder_refusal, inert_key_messages, load_config

BASE = dict(actor_model_name_or_path="unused", use_rm_server=False, reward_funcs="kk", train_datasets="unused",
            rollout_n=2, global_batch_size=2, max_dec_len=16, min_dec_len=1, max_prompt_len=16, max_length=40,
            kl_coeff=0.0)


def cfg_of(**values):
    return config_from_dict({**BASE, **values})


@pytest.mark.parametrize("given", ["calculator,python", ["calculator", "python"], " calculator , python "])
def test_tools_take_a_list_or_a_comma_separated_string(given):
    assert cfg_of(tools=given).tools == ["calculator", "python"]


def test_defaults_are_single_turn():
    cfg = cfg_of()
    assert cfg.tools == [] and cfg.max_turns == 4 and cfg.tool_timeout_s == 10.0 and cfg.tool_max_workers == 8
    assert cfg.tool_format == "auto" and cfg.max_tool_response_len == 256 and cfg.tool_server == ""
    assert cfg.tool_server_max_unanswered == 3


@pytest.mark.parametrize("key, value, message", [
    ("max_turns", 0, "key 'max_turns' = 0: must be at least 1"),
    ("tool_max_workers", 0, "key 'tool_max_workers' = 0: must be at least 1"),
    ("max_tool_response_len", 0, "key 'max_tool_response_len' = 0: must be at least 1"),
    ("tool_timeout_s", 0, "key 'tool_timeout_s' = 0.0: must be greater than 0"),
    ("tool_server_max_unanswered", -1, "key 'tool_server_max_unanswered' = -1: must be 0 (never stop) or more"),
    ("tool_server", "127.0.0.1:8731", "key 'tool_server' = '127.0.0.1:8731': must be an http:// or https:// URL"),
    ("tool_server", "http://", "key 'tool_server' = 'http://': must be an http:// or https:// URL with a host"),
    ("tool_server", "http://127.0.0.1:port", "key 'tool_server' = 'http://127.0.0.1:port': is not a URL"),
])
def test_bad_values_name_the_key(key, value, message):
    with pytest.raises(ConfigError, match="^<dict>: " + message.replace("(", r"\(").replace(")", r"\)")):
        cfg_of(tools="calculator", **{key: value})


def test_a_file_error_names_the_file_and_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("use_rm_server: false\nreward_funcs: kk\ntools: [calculator]\nmax_turns: -1\n")
    with pytest.raises(ConfigError, match=rf"^{path}:4: key 'max_turns' = -1: must be at least 1"):
        load_config(str(path), [])


def test_tool_keys_without_tools_say_why_in_one_line_each(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("use_rm_server: false\nreward_funcs: kk\nmax_turns: 2\ntool_timeout_s: 3\n")
    cfg = load_config(str(path), ["--tool_server", "http://127.0.0.1:9"])
    lines = [m for m in inert_key_messages(cfg, cfg._given, "cpu") if "tool" in m or "turns" in m]
    why = "has no effect here: tools is empty: rollouts are single-turn (one completion per prompt, no tool calls)"
    assert lines == [f"{path}:3: key 'max_turns' {why}", f"{path}:4: key 'tool_timeout_s' {why}",
                     f"command line: key 'tool_server' {why}"]
    # With tools the same keys act; the token alone has no effect without a server.
    cfg = load_config(str(path), ["--tools", "calculator", "--tool_server_token", "s3cret",
                                  "--tool_server_max_unanswered", "5"])
    assert [m for m in inert_key_messages(cfg, cfg._given, "cpu") if "tool" in m or "turns" in m] == [
        f"command line: key '{key}' has no effect here: tool_server is empty: the tools run in the trainer's "
        "process" for key in ("tool_server_token", "tool_server_max_unanswered")]
    assert cfg.tool_server_max_unanswered == 5


def test_tool_server_max_unanswered_reaches_the_remote_tool_set(serve):
    # build_tools hands the key to the RemoteToolSet the rollout calls (a real server listing the calculator).
    from paddle_grpo.step.collection import build_tools
    from reward_server import create_app

    url = serve(create_app([], tools="calculator")).url
    env = build_tools(cfg_of(tools="calculator", tool_server=url, tool_server_max_unanswered=7), tokenizer=None)
    assert env.tools.url == url and env.tools.max_unanswered == 7


def test_the_tool_server_token_is_never_printed():
    cfg = cfg_of(tools="calculator", tool_server="http://127.0.0.1:9", tool_server_token="s3cret")
    assert "s3cret" not in cfg.format() and "tool_server_token: '***'" in cfg.format()


def test_an_encoder_decoder_policy_is_refused_with_tools():
    message = encoder_decoder_refusal(cfg_of(tools="calculator"), True)
    assert "is an encoder-decoder model, and tools (calculator) make rollouts multi-turn" in message
    assert encoder_decoder_refusal(cfg_of(tools="calculator"), False) is None
    assert encoder_decoder_refusal(cfg_of(), True) is None  # single-turn, no critic: an encoder-decoder is fine
