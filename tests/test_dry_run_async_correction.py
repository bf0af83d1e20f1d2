"""`async_rollout: true` alone gets the rollout correction that kept the quickstart learning (issue 41, items 1.1
and 4.1; docs/async.md): with rollout_lag >= 1 an unset rollout_correction means `clip`, an explicit `none` stays
`none`, and the dry run and the resolved configuration say which correction runs and why."""
import pathlib

import pytest
from dry_run_helpers import base_args, run_rl_main

from paddle_grpo.config import load_config

REPO = pathlib.Path(__file__).resolve().parent.parent


def quickstart_copy(tmp_path, extra):
    """configs/quickstart.yaml with the lines `extra` appended, as a user's copy would be."""
    path = tmp_path / "quickstart_async.yaml"
    path.write_text((REPO / "configs" / "quickstart.yaml").read_text(encoding="utf-8") + extra, encoding="utf-8")
    return path


@pytest.mark.parametrize("extra, overrides, mode", [
    ("async_rollout: true\n", [], "clip"),                                    # the walk: clip, not none
    ("async_rollout: true\nrollout_correction: none\n", [], "none"),          # an explicit none is kept
    ("async_rollout: true\n", ["--rollout_correction", "none"], "none"),      # from the command line too
    ("async_rollout: true\nrollout_correction: tis\n", [], "tis"),
    ("async_rollout: true\nrollout_lag: 0\n", [], "none"),                    # no lag: the synchronous results
    ("", [], "none"),                                                         # synchronous
])
def test_a_lagged_sampler_defaults_to_clip(tmp_path, extra, overrides, mode):
    cfg = load_config(quickstart_copy(tmp_path, extra), overrides, warn=False)
    assert cfg.correction_mode == mode
    resolved = cfg.format()
    if mode == "clip" and "rollout_correction" not in extra:  # the resolved configuration (config.yaml, the
        # start-up summary) says where the value comes from
        assert ("rollout_correction: clip  # not set: the default for async_rollout with rollout_lag 1"
                in resolved)
        assert "the default for async_rollout with rollout_lag 1" in cfg.correction_reason
    else:
        assert f"rollout_correction: {mode}\n" in resolved


@pytest.mark.parametrize("extra, said", [
    ([], "async rollout: rollout_correction clip (the default for async_rollout with rollout_lag 1"),
    (["--rollout_correction", "none"], "async rollout: rollout_correction none (set at command line): the "
                                       "samples are 1 update(s) stale and uncorrected"),
])
def test_the_dry_run_states_the_correction(tmp_path, tiny_policy_dir, capsys, extra, said):
    argv = [*base_args(tmp_path, tiny_policy_dir), "--async_rollout", "true", *extra, "--dry_run"]
    status, out, _ = run_rl_main(argv, capsys)
    assert status == 0, out
    assert said in out, out
    assert "dry run: ok" in out
