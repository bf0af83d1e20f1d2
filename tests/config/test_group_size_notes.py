"""`rollout_n: 1` under an estimator that compares the samples of a prompt (issue 41 item 4.5): the run trains, on
other advantages than the estimator's name says, so start-up and the dry run say in one line naming the key what the
estimator becomes (grpo: the reward itself; reinforce_plus_plus_baseline: reinforce_plus_plus); estimators without
groups say nothing and rloo is refused."""
import logging

import pytest
from dry_run_helpers import base_args, run_rl_main

from paddle_grpo.config import ConfigError, load_config


def notes(caplog, path, overrides=()):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="paddle_grpo.config"):
        load_config(path, list(overrides), device="cpu")
    return [r.getMessage() for r in caplog.records if "'rollout_n'" in r.getMessage()]


@pytest.mark.parametrize("algorithm, becomes", [
    ("grpo", "each advantage is the sample's own reward R / (1 + 1e-6)"),
    ("reinforce_plus_plus_baseline", "the advantages are those of rl_algorithm 'reinforce_plus_plus'"),
])
def test_a_group_estimator_with_one_sample_per_prompt_says_what_it_becomes(tmp_path, caplog, algorithm, becomes):
    path = tmp_path / "run.yaml"
    path.write_text(f"rl_algorithm: {algorithm}\nrollout_n: 1\n")
    lines = notes(caplog, path)
    assert len(lines) == 1 and "\n" not in lines[0], lines
    assert lines[0].startswith(f"{path}:2: key 'rollout_n' is 1 with rl_algorithm '{algorithm}'"), lines
    assert becomes in lines[0]
    assert "has no effect" not in lines[0]  # a caveat: the run trains
    # set on the command line: the line says so
    path.write_text(f"rl_algorithm: {algorithm}\n")
    lines = notes(caplog, path, ["--rollout_n", "1"])
    assert len(lines) == 1 and lines[0].startswith("command line: key 'rollout_n' is 1"), lines


@pytest.mark.parametrize("algorithm, rollout_n", [("grpo", 2), ("reinforce_plus_plus_baseline", 4),
                                                  ("reinforce_plus_plus", 1)])  # uses_groups False: nothing changes
def test_no_note_with_groups_of_two_or_an_estimator_without_groups(tmp_path, caplog, algorithm, rollout_n):
    path = tmp_path / "run.yaml"
    path.write_text(f"rl_algorithm: {algorithm}\nrollout_n: {rollout_n}\n")
    assert notes(caplog, path) == []


def test_rloo_with_one_sample_is_refused(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("rl_algorithm: rloo\nrollout_n: 1\n")
    with pytest.raises(ConfigError, match="rollout_n"):
        load_config(path, device="cpu", warn=False)


def test_the_dry_run_lists_the_note_as_a_warning(tmp_path, tiny_policy_dir, capsys):
    argv = [a for a in base_args(tmp_path, tiny_policy_dir)]
    argv[argv.index("--rollout_n") + 1] = "1"
    status, out, _ = run_rl_main([*argv, "--dry_run"], capsys)
    assert status == 0, out
    assert "  ! command line: key 'rollout_n' is 1 with rl_algorithm 'grpo'" in out, out
    assert "dry run: ok, with 1 warning(s) above" in out, out
