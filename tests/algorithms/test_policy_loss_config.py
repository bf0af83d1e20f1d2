"""`policy_loss` and its keys from a config (config/policy_loss.py, config/effects.py, dry_run/loss.py): unset, the
loss of importance_sampling_level, as before; what a loss fixes (ratio level, aggregation, dual clip) is applied when
unset and refused when contradicted, naming the keys; a loss's options reach it (PolicyLossSpec.options); keys a
loss does not read are reported without effect; `run_rl.py <yaml> --dry_run` names the loss."""
import pytest
import yaml

from dry_run_helpers import base_args, run_rl_main
from paddle_grpo.algorithms import policy_loss_spec, resolve_policy_loss
from paddle_grpo.config import ConfigError, config_from_dict, load_config, run_key_notes

BASE = dict(actor_model_name_or_path="unused", use_rm_server=False, reward_funcs="kk", train_datasets="unused")


def cfg_of(**values):
    return config_from_dict({**BASE, **values})


def run_loss(cfg):
    return resolve_policy_loss(cfg.policy_loss, cfg.importance_sampling_level).name


def test_unset_policy_loss_keeps_the_level_s_loss():
    assert run_loss(cfg_of()) == "vanilla" and run_loss(cfg_of(importance_sampling_level="sequence")) == "gspo"
    cfg = cfg_of()
    assert (cfg.policy_loss, cfg.importance_sampling_level, cfg.loss_agg_mode) == (None, "token", "token-mean")


@pytest.mark.parametrize("loss, level, agg", [
    ("cispo", "token", "token-mean"), ("gmpo", "sequence", "seq-mean-token-mean"),
    ("geo_mean", "sequence", "seq-mean-token-mean"), ("sapo", "token", "seq-mean-token-mean"),
    ("clip_cov", "token", "token-mean"), ("kl_cov", "token", "token-mean"), ("gspo", "sequence", "token-mean"),
])
def test_a_loss_fixes_its_level_and_aggregation_when_unset(loss, level, agg):
    cfg = cfg_of(policy_loss=loss)
    assert (run_loss(cfg), cfg.importance_sampling_level, cfg.loss_agg_mode) == (loss, level, agg)
    # the unset rollout correction level follows the ratio level, as for GSPO
    assert cfg.correction_level == ("geometric" if level == "sequence" else "token")
    # the resolved configuration says where the values came from, and loads back to the same run
    text = cfg.format()
    if level == "sequence":
        assert f"importance_sampling_level: sequence  # not set: policy_loss {loss}'s ratio level" in text
    again = config_from_dict({**BASE, **{k: getattr(cfg, k) for k in
                                         ("policy_loss", "importance_sampling_level", "loss_agg_mode")}})
    assert (again.importance_sampling_level, again.loss_agg_mode) == (level, agg)


@pytest.mark.parametrize("values, key, words", [
    (dict(policy_loss="gspo", importance_sampling_level="token"), "importance_sampling_level", "per sequence"),
    (dict(policy_loss="cispo", importance_sampling_level="sequence"), "importance_sampling_level", "per token"),
    (dict(policy_loss="sapo", loss_agg_mode="token-mean"), "loss_agg_mode", "seq-mean-token-mean"),
    (dict(policy_loss="gmpo", loss_agg_mode="seq-mean-token-sum-norm"), "loss_agg_mode", "seq-mean-token-mean"),
    (dict(policy_loss="kl_cov", clip_ratio_c=3.0), "clip_ratio_c", "clip, vanilla, gspo"),
    (dict(policy_loss="nope"), "policy_loss", "'cispo'"),
    (dict(sapo_temperature_neg=0.0), "sapo_temperature_neg", "greater than 0"),
    (dict(clip_cov_ratio=0.0), "clip_cov_ratio", "(0, 1]"),
    (dict(kl_cov_ratio=1.5), "kl_cov_ratio", "(0, 1]"),
    (dict(clip_cov_lb=5.0), "clip_cov_lb", "clip_cov_ub"),
    (dict(entropy_target=-1.0), "entropy_target", "negative"),
    (dict(entropy_coeff_lr=-0.1), "entropy_coeff_lr", "negative"),
])
def test_contradictions_and_bad_values_are_refused_naming_the_key(values, key, words):
    with pytest.raises(ConfigError) as e:
        cfg_of(**values)
    assert f"key '{key}'" in str(e.value) and words in str(e.value)


def test_consistent_explicit_keys_are_accepted():
    cfg = cfg_of(policy_loss="gspo", importance_sampling_level="sequence", clip_ratio_c=3.0)
    assert run_loss(cfg) == "gspo"
    assert cfg_of(policy_loss="sapo", loss_agg_mode="seq-mean-token-mean").loss_agg_mode == "seq-mean-token-mean"


def test_options_reach_the_loss_by_their_config_keys():
    cfg = cfg_of(policy_loss="sapo", sapo_temperature_pos=0.7, sapo_temperature_neg=2.0)
    assert policy_loss_spec("sapo").options(cfg) == {"temperature_pos": 0.7, "temperature_neg": 2.0}
    cfg = cfg_of(policy_loss="clip_cov", clip_cov_ratio=0.01, clip_cov_lb=0.5, clip_cov_ub=2.0)
    assert policy_loss_spec("clip_cov").options(cfg) == {"clip_cov_ratio": 0.01, "clip_cov_lb": 0.5,
                                                         "clip_cov_ub": 2.0}


def test_keys_a_loss_does_not_read_are_without_effect():
    notes = run_key_notes(cfg_of(policy_loss="cispo"))
    assert "clip_range_ratio_low" in notes and "clip_range_ratio_high" not in notes
    assert "an option of policy_loss sapo" in notes["sapo_temperature_pos"]
    assert "an option of policy_loss kl_cov" in notes["ppo_kl_coef"]
    notes = run_key_notes(cfg_of(policy_loss="sapo"))
    assert {"clip_range_ratio", "clip_range_ratio_low", "clip_range_ratio_high"} <= set(notes)
    assert "sapo_temperature_pos" not in notes
    assert "entropy_coeff_lr" in notes and "entropy_coeff_lr" not in run_key_notes(cfg_of(entropy_target=0.2))
    assert not {"clip_range_ratio", "clip_range_ratio_low", "clip_range_ratio_high"} & set(run_key_notes(cfg_of()))


def test_the_dry_run_names_the_loss(tmp_path, tiny_policy_dir, capsys):
    path = tmp_path / "sapo.yaml"
    path.write_text(yaml.safe_dump({"policy_loss": "sapo", "sapo_temperature_neg": 2.0, "entropy_target": 0.3,
                                    "mask_truncated_completions": True}))
    args = [str(path), *base_args(tmp_path, tiny_policy_dir), "--dry_run"]
    assert load_config(str(path), [str(a) for a in args[1:-1]]).policy_loss == "sapo"
    status, out, err = run_rl_main(args, capsys)
    assert status == 0, out + err
    lines = [line.strip() for line in out.splitlines()]
    assert ("policy loss: sapo (policy_loss): SAPO (Soft Adaptive Policy Optimization, Qwen, arXiv 2511.20347); "
            "ratio per token, loss_agg_mode seq-mean-token-mean (not set: policy_loss sapo's own aggregation); no "
            "clip range; sapo_temperature_pos 1.0, sapo_temperature_neg 2.0") in lines
    assert ("entropy bonus: adaptive, from entropy_coeff 0.0 toward entropy_target 0.3 by entropy_coeff_lr 0.005 per "
            "step, applied while the entropy is at or below the target (train/entropy_coeff)") in lines
    assert any(line.startswith("mask_truncated_completions: completions that reach max_dec_len 16") for line in lines)
    status, out, err = run_rl_main([*base_args(tmp_path, tiny_policy_dir), "--dry_run"], capsys)
    assert ("policy loss: vanilla (policy_loss unset: importance_sampling_level token's loss): Token-level PPO-clip "
            "surrogate (GRPO, arXiv 2402.03300); ratio per token, loss_agg_mode token-mean; clip_range_ratio_low 0.2, "
            "clip_range_ratio_high 0.2") in [line.strip() for line in out.splitlines()]
    status, out, err = run_rl_main([*base_args(tmp_path, tiny_policy_dir), "--policy_loss", "gspo",
                                    "--importance_sampling_level", "token", "--dry_run"], capsys)
    assert status != 0 and "contradicts policy_loss gspo" in out + err
