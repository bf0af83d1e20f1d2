"""`run_rl.py --dry_run` of a multi-turn run (dry_run.check_tools): the tools load (names and schema count printed),
an unknown tool or format is a problem naming its key, the tool server's GET /tools is asked (a real server on
127.0.0.1) and must serve every named tool, an unreachable one is named with its URL; tool keys set without tools are
in the table of keys without effect."""

import pytest

from dry_run_helpers import base_args, closed_port, run_rl_main, write_train_eval


@pytest.fixture
def base(tmp_path, tiny_policy_dir):
    """Arguments of a valid in-process-reward run on the tiny model (no config file)."""
    return base_args(tmp_path, tiny_policy_dir)


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


def test_a_tool_server_that_serves_every_named_tool_passes(base, serve, capsys):
    from reward_server import create_app

    url = serve(create_app([], tools="calculator", token="T0k")).url
    server = ["--tool_server", url, "--tool_server_token", "T0k", "--dry_run"]
    status, out, _ = run_rl_main([*base, "--tools", "calculator", *server], capsys)
    assert status == 0, out
    assert f"  tool_server: {url}/tools: ok (serves calculator)" in out
    # A tool it does not serve, and a wrong token, are problems naming the key.
    status, out, _ = run_rl_main([*base, "--tools", "calculator,python", *server], capsys)
    assert status == 2
    assert f"  - tools: python: not served by tool_server {url} (it serves calculator; start it with --tool " \
           "calculator,python)" in out
    status, out, _ = run_rl_main([*base, "--tools", "calculator", *server[:3], "wrong", "--dry_run"], capsys)
    assert status == 2
    assert f"  - tool_server: {url}/tools answered HTTP 401: wrong token in the Authorization header (check " \
           "tool_server_token)" in out


def test_prompt_lengths_are_those_of_the_prompts_listing_the_tools(tmp_path, base, capsys):
    """The trainer renders a raw prompt with the tools' schemas in its system turn (step.PromptEncoder); the dry
    run's length check must count those tokens, not the prompt without tools (it did: no warning, then every prompt
    left-truncated in training, the tool list cut off)."""
    train, _ = write_train_eval(tmp_path, lambda i: {"src": f"What is {i}*7?", "tgt": str(7 * i)}, n=4, prefix="raw_")
    args = list(base)
    args[args.index("--train_datasets") + 1] = train
    status, out, _ = run_rl_main([*args, "--dry_run"], capsys)
    assert status == 0 and "none longer than max_prompt_len (64)" in out, out
    status, out, _ = run_rl_main([*args, "--tools", "calculator", "--dry_run"], capsys)
    assert "train_datasets: 4 of 4 prompts are longer than max_prompt_len (64)" in out, out


def test_a_misspelt_tool_gets_the_closest_name_and_every_bad_tool_is_named(base, capsys):
    status, out, _ = run_rl_main([*base, "--tools", "calculater,pyhton", "--dry_run"], capsys)
    assert status == 2
    assert "  - tools: unknown tool 'calculater'; registered tools: calculator, python; or give 'module:function' / " \
           "'path/to/file.py:function' (did you mean 'calculator'?)" in out
    assert "  - tools: unknown tool 'pyhton'; registered tools: calculator, python; or give 'module:function' / " \
           "'path/to/file.py:function' (did you mean 'python'?)" in out


def test_a_real_run_names_a_misspelt_tool_before_loading_the_model(tmp_path, base, capsys):
    # the model directory is emptied of its weights: a run that got as far as loading it would fail there, with
    # another message; the tool is named first, at start-up, as --dry_run names it
    import shutil

    args = list(base)
    policy = tmp_path / "policy"
    shutil.copytree(args[args.index("--actor_model_name_or_path") + 1], policy)
    for weights in policy.glob("*.safetensors"):
        weights.unlink()
    for weights in policy.glob("*.pdparams"):
        weights.unlink()
    args[args.index("--actor_model_name_or_path") + 1] = policy
    status, _, err = run_rl_main([*args, "--tools", "calculater"], capsys)
    assert status == 2
    assert "run_rl.py: error: tools: unknown tool 'calculater'; registered tools: calculator, python; or give " \
           "'module:function' / 'path/to/file.py:function' (did you mean 'calculator'?)" in err
    assert not (tmp_path / "out").exists()  # nothing started
