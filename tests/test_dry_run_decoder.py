"""The dry run names the decoder path the run will take ("decoder: fast path (qwen2)" or "decoder: PaddleNLP's
forward (why)"), found without reading weights, and it is the line the run itself prints after loading the model."""
import pytest

from dry_run_helpers import base_args, run_rl_main
from paddle_grpo.config import config_from_dict
from paddle_grpo.policy import load_policy
from paddle_grpo.policy.causal import decoder_path


@pytest.fixture
def base(tmp_path, tiny_policy_dir):
    return base_args(tmp_path, tiny_policy_dir)


def dry_decoder_line(argv, capsys):
    status, out, _ = run_rl_main([*argv, "--dry_run"], capsys)
    assert status == 0, out
    lines = [line.strip() for line in out.splitlines() if line.strip().startswith("decoder: ")]
    assert len(lines) == 1, out
    return lines[0]


def test_the_dry_run_names_the_decoder_path_the_run_prints(base, tiny_policy_dir, capsys):
    # The second path: the run's own line, from the model loaded with its weights.
    loaded = decoder_path(load_policy(str(tiny_policy_dir)).model)
    assert loaded == "decoder: fast path (qwen2)"
    assert dry_decoder_line(base, capsys) == loaded


def test_with_lora_the_dry_run_names_the_runs_line(base, tiny_policy_dir, capsys):
    """LoRA: sampling on the fast path with the adapters merged, log-probs on PaddleNLP's forward: the dry run's line
    is the one the run prints after loading the model and applying its adapters."""
    policy = load_policy(str(tiny_policy_dir))
    policy.apply_lora(8, 16.0, 0.0, None)
    loaded = decoder_path(policy.model).splitlines()[0]
    assert loaded.startswith("decoder: sampling on the fast path (qwen2) with the LoRA adapters merged"), loaded
    assert dry_decoder_line([*base, "--lora", "true"], capsys) == loaded


def test_the_reasons_for_paddlenlps_forward(base, capsys, monkeypatch):
    monkeypatch.setenv("PADDLE_GRPO_FAST", "0")
    assert dry_decoder_line(base, capsys) == "decoder: PaddleNLP's forward (PADDLE_GRPO_FAST=0)"


def test_tensor_parallel_is_named_without_building_its_layers():
    from paddle_grpo.dry_run import decoder_line

    cfg = config_from_dict({"tensor_parallel_degree": 2})
    assert decoder_line(cfg, object()) == "decoder: PaddleNLP's forward (tensor_parallel_degree is 2)"
