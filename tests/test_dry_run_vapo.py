"""`run_rl.py CONFIG --dry_run` for a critic run (ppo, vapo): the keys resolved as the run resolves them, each unset
key's value with where it comes from (VAPO's own defaults, the policy's optimizer keys), what counts as a correct
answer for the positive-example LM loss, and VAPO's lam_policy on short completions. Real files, the tiny model,
in-process rewards (kk declares a maximum of 3.0)."""
import pytest

from dry_run_helpers import base_args, run_rl_main


@pytest.fixture
def vapo(tmp_path, tiny_policy_dir):
    """A valid vapo run on the tiny model, its critic started from the policy; max_dec_len 16."""
    return [*base_args(tmp_path, tiny_policy_dir), "--rl_algorithm", "vapo", "--critic_model_name_or_path",
            tiny_policy_dir, "--max_steps", "60", "--learning_rate", "2e-6", "--warmup_steps", "3"]


def lines_of(out):
    return [line.strip() for line in out.splitlines()]


def test_vapo_defaults_and_inherited_critic_keys_are_printed_resolved(vapo, capsys):
    status, out, err = run_rl_main([*vapo, "--dry_run"], capsys)
    assert status == 0, out + err
    lines = lines_of(out)
    assert ("value pretraining: 50 steps update only the critic (pretrain_critic_steps unset: rl_algorithm vapo's "
            "default 50); the policy's schedule spans the 10 steps after them") in lines
    assert ("critic optimizer: critic_learning_rate 2.0e-06 (unset: the policy's learning_rate), "
            "critic_min_learning_rate 0.0 (unset: the policy's min_learning_rate), critic_lr_scheduler_type constant "
            "(unset: the policy's lr_scheduler_type), critic_weight_decay 0.01 (unset: the policy's weight_decay); "
            "warm-up: the policy's warm-up: warmup_steps 3 (critic_warmup_ratio unset)") in lines
    assert "policy clip range: [1 - 0.2, 1 + 0.28] (clip_range_ratio_high unset: rl_algorithm vapo's default 0.28)" \
        in lines
    # kk's maximum is 3.0: correct from 3.0 - 1e-6 on (eval/accuracy's rule), in every group
    assert (f"positive-example LM loss: coefficient 0.1 (positive_example_lm_coeff unset: rl_algorithm vapo's "
            f"default 0.1), on every completion of the batch with a reward >= {3.0 - 1e-6!r} (the maximum the reward "
            "functions declare, 3.0, minus 1e-6), whatever its group scored") in lines
    assert ("lam_policy = max(0, 1 - 1 / (vapo_alpha 0.05 x l)) is 0 for completions of l <= 20 tokens: their "
            "advantages are one-step TD errors, and the policy learns only as fast as the critic's values become "
            "informative") in lines
    # max_dec_len 16 <= 20: every completion is at the clamp
    assert ("! vapo: max_dec_len 16 <= 1 / vapo_alpha = 20: lam_policy is 0 for every completion (one-step TD "
            "advantages only); choose vapo_alpha of the order of 1 / (typical answer length) for short answers") \
        in lines


def test_explicit_values_win_and_are_printed_as_set(vapo, capsys):
    status, out, err = run_rl_main([*vapo, "--pretrain_critic_steps", "0", "--clip_range_ratio_high", "0.2",
                                    "--critic_learning_rate", "1e-5", "--critic_warmup_ratio", "0.1",
                                    "--positive_example_min_reward", "2.5", "--positive_example_lm_coeff", "0.3",
                                    "--vapo_alpha", "0.5", "--dry_run"], capsys)
    assert status == 0, out + err
    lines = lines_of(out)
    assert ("value pretraining: 0 steps update only the critic (pretrain_critic_steps); the policy's schedule spans "
            "the 60 steps after them") in lines
    assert any(x.startswith("critic optimizer: critic_learning_rate 1.0e-05, critic_min_learning_rate 0.0 (unset")
               and x.endswith("; warm-up: critic_warmup_ratio 0.1") for x in lines), out
    assert "policy clip range: [1 - 0.2, 1 + 0.2] (clip_range_ratio_high)" in lines
    assert ("positive-example LM loss: coefficient 0.3 (positive_example_lm_coeff), on every completion of the batch "
            "with a reward >= 2.5 (positive_example_min_reward), whatever its group scored") in lines
    assert not any("max_dec_len 16 <= 1 / vapo_alpha" in x for x in lines)  # 1 / 0.5 = 2 tokens


def test_a_positive_loss_without_a_known_correct_reward_is_a_problem(vapo, tmp_path, capsys):
    module = tmp_path / "plain_reward.py"  # a reward function that declares no maximum
    module.write_text("def plain(prompts, completions, **kwargs):\n    return [0.0 for _ in completions]\n")
    status, out, _ = run_rl_main([*vapo, "--reward_funcs", f"{module}:plain", "--dry_run"], capsys)
    assert status == 2
    assert ("- positive_example_lm_coeff: the positive-example LM loss is on (0.1 (positive_example_lm_coeff unset: "
            "rl_algorithm vapo's default 0.1)) but no reward counts as correct (the reward functions declare none): "
            "set positive_example_min_reward or eval_max_reward, or positive_example_lm_coeff: 0") in lines_of(out)
    # eval_max_reward is what counts as correct then
    status, out, _ = run_rl_main([*vapo, "--reward_funcs", f"{module}:plain", "--eval_max_reward", "1",
                                  "--dry_run"], capsys)
    assert status == 0 and "with a reward >= 0.999999 (eval_max_reward 1.0 minus 1e-6)" in out
