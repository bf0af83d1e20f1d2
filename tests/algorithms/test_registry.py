"""The estimator and policy-loss registries: each built-in's spec, checked against a table written here and against
what the function actually does; registering, re-registering and unregistering.

Every test leaves the registries as it found them (`restore_registries`).
"""
import inspect

import numpy as np
import paddle
import pytest

from paddle_grpo.algorithms import (
    EstimatorSpec,
    UnknownNameError,
    advantage_estimator_spec,
    available_advantage_estimators,
    available_policy_losses,
    compute_policy_loss,
    get_advantage_estimator,
    get_policy_loss,
    importance_sampling_levels,
    policy_loss_spec,
    register_advantage_estimator,
    register_policy_loss,
    unregister_advantage_estimator,
    unregister_policy_loss,
)

# name: (kl_in_reward, config_options, min_group_size, uses_groups), from docs/algorithms.md sections 2 and 8.
BUILT_IN_ESTIMATORS = {
    "grpo": ("sequence", ("norm_adv_by_std",), 1, True),
    "reinforce_plus_plus": ("token", (), 1, False),
    "reinforce_plus_plus_baseline": ("token", (), 1, True),
    "rloo": ("sequence", (), 2, True),
    "ppo": ("token_rewards", ("gamma", "lam"), 1, False),
    "vapo": ("token_rewards", ("gamma", "lam_critic", ("vapo_alpha", "alpha")), 1, False),
}
CRITIC_ESTIMATORS = {"ppo", "vapo"}  # needs_values
KL_OPTIONS = ("kl_coeff", "old_log_probs", "ref_log_probs", "kl_estimator")


@pytest.fixture(autouse=True)
def restore_registries():
    estimators, losses = set(available_advantage_estimators()), set(available_policy_losses())
    yield
    for name in set(available_advantage_estimators()) - estimators:
        unregister_advantage_estimator(name)
    for name in set(available_policy_losses()) - losses:
        unregister_policy_loss(name)


def random_batch(seed, bs=8, T=5):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, size=bs)
    mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
    rewards = np.zeros((bs, T), dtype=np.float32)
    rewards[np.arange(bs), lengths - 1] = rng.normal(size=bs)
    return paddle.to_tensor(rewards), paddle.to_tensor(mask)


# ---- advantage estimators -------------------------------------------------------------------------------------------

def test_built_in_estimator_specs():
    assert available_advantage_estimators() == tuple(BUILT_IN_ESTIMATORS)  # the order the config lists
    for name, (kl_in_reward, options, min_group, uses_groups) in BUILT_IN_ESTIMATORS.items():
        spec = advantage_estimator_spec(name)
        assert (spec.name, spec.kl_in_reward, spec.config_options, spec.min_group_size, spec.uses_groups) == \
            (name, kl_in_reward, options, min_group, uses_groups)
        assert spec.needs_values == (name in CRITIC_ESTIMATORS)
        assert spec.fn is get_advantage_estimator(name)
    assert advantage_estimator_spec("vapo").key_defaults == (
        ("positive_example_lm_coeff", 0.1), ("pretrain_critic_steps", 50), ("clip_range_ratio_high", 0.28))
    assert all(advantage_estimator_spec(n).key_defaults == () for n in BUILT_IN_ESTIMATORS if n != "vapo")


def test_options_resolve_config_keys_to_option_names():
    class Cfg:
        gamma, lam, lam_critic, vapo_alpha, norm_adv_by_std = 0.9, 0.8, 0.7, 0.25, False

    vapo = advantage_estimator_spec("vapo")
    assert vapo.config_keys == ("gamma", "lam_critic", "vapo_alpha")
    assert vapo.option_names == ("gamma", "lam_critic", "alpha")
    assert vapo.options(Cfg()) == {"gamma": 0.9, "lam_critic": 0.7, "alpha": 0.25}
    assert advantage_estimator_spec("ppo").options(Cfg()) == {"gamma": 0.9, "lam": 0.8}
    assert advantage_estimator_spec("grpo").options(Cfg()) == {"norm_adv_by_std": False}
    assert vapo.key_default("positive_example_lm_coeff", 0.0) == 0.1
    assert advantage_estimator_spec("ppo").key_default("positive_example_lm_coeff", 0.0) == 0.0


@pytest.mark.parametrize("name", list(BUILT_IN_ESTIMATORS))
def test_estimator_signature_matches_its_spec(name):
    spec = advantage_estimator_spec(name)
    params = inspect.signature(spec.fn).parameters
    for option in spec.option_names:
        assert option in params, option
    # "token": the estimator takes the KL itself; "sequence" / "token_rewards": it must refuse the KL options (the
    # caller shapes R).
    takes_kl = [option in params for option in KL_OPTIONS]
    assert takes_kl == [spec.kl_in_reward == "token"] * len(KL_OPTIONS)
    assert ("values" in params) == spec.needs_values


@pytest.mark.parametrize("name", list(BUILT_IN_ESTIMATORS))
def test_uses_groups_says_whether_index_matters(name):
    rewards, mask = random_batch(0)
    extra = {"values": paddle.to_tensor(np.random.default_rng(1).normal(size=mask.shape).astype(np.float32))} \
        if advantage_estimator_spec(name).needs_values else {}
    by_pairs, _ = get_advantage_estimator(name)(rewards, mask, np.repeat(np.arange(4), 2), **extra)
    by_quads, _ = get_advantage_estimator(name)(rewards, mask, np.repeat(np.arange(2), 4), **extra)
    assert (not np.array_equal(by_pairs.numpy(), by_quads.numpy())) == advantage_estimator_spec(name).uses_groups


def test_one_line_registration_gets_the_defaults_and_unregisters():
    @register_advantage_estimator("test_mask_as_advantage")
    def mask_as_advantage(token_level_rewards, response_mask, index):
        return response_mask, response_mask

    spec = advantage_estimator_spec("test_mask_as_advantage")
    assert spec == EstimatorSpec("test_mask_as_advantage", mask_as_advantage, kl_in_reward="sequence",
                                 config_options=(), min_group_size=1, uses_groups=True, needs_values=False,
                                 key_defaults=())
    assert available_advantage_estimators()[-1] == "test_mask_as_advantage"
    register_advantage_estimator("test_mask_as_advantage")(mask_as_advantage)  # same spec again: harmless
    unregister_advantage_estimator("test_mask_as_advantage")
    assert "test_mask_as_advantage" not in available_advantage_estimators()
    with pytest.raises(UnknownNameError, match="test_mask_as_advantage"):
        advantage_estimator_spec("test_mask_as_advantage")
    with pytest.raises(UnknownNameError, match="grpo"):
        unregister_advantage_estimator("test_mask_as_advantage")


def test_replacing_a_registration_is_rejected():
    grpo = get_advantage_estimator("grpo")
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("grpo")(lambda *a: a)
    with pytest.raises(ValueError, match="already registered"):  # same function, different spec
        register_advantage_estimator("grpo", min_group_size=3)(grpo)
    assert advantage_estimator_spec("grpo").min_group_size == 1


@pytest.mark.parametrize("fields, message", [
    ({"kl_in_reward": "prompt"}, "kl_in_reward must be one of"),
    ({"min_group_size": 0}, "min_group_size must be an int >= 1"),
    ({"config_options": "norm_adv_by_std"}, "config_options must be a tuple"),
    ({"config_options": (("vapo_alpha",),)}, "a key name or a .config_key, option. pair"),
    ({"config_options": (("a", "b", "c"),)}, "a key name or a .config_key, option. pair"),
    ({"key_defaults": (("positive_example_lm_coeff",),)}, "key_defaults must be .config_key, default. pairs"),
])
def test_bad_spec_fields_are_rejected(fields, message):
    with pytest.raises((ValueError, TypeError), match=message):
        register_advantage_estimator("test_bad_spec", **fields)(lambda *a: a)
    assert "test_bad_spec" not in available_advantage_estimators()


# ---- policy losses --------------------------------------------------------------------------------------------------

def test_built_in_policy_loss_specs():
    levels = {name: policy_loss_spec(name).importance_sampling_level for name in available_policy_losses()}
    assert levels == {"vanilla": "token", "clip": None, "gspo": "sequence", "cispo": None, "geo_mean": None,
                      "gmpo": None, "sapo": None, "clip_cov": None, "kl_cov": None}
    # verl's names; what each fixes (docs/algorithms.md section 4): ratio level, aggregation, dual-clip, options
    fixed = {name: (s.ratio_level, s.loss_agg_mode, s.dual_clip, s.advantage_weighted, s.config_keys)
             for name, s in ((n, policy_loss_spec(n)) for n in available_policy_losses())}
    assert fixed["gspo"] == ("sequence", None, True, True, ())
    assert fixed["cispo"] == ("token", None, False, True, ())
    assert fixed["gmpo"] == fixed["geo_mean"] == ("sequence", "seq-mean-token-mean", False, True, ())
    assert fixed["sapo"] == ("token", "seq-mean-token-mean", False, True,
                             ("sapo_temperature_pos", "sapo_temperature_neg"))
    assert fixed["clip_cov"] == ("token", None, False, True, ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub"))
    # KL-Cov's penalty is not a multiple of the advantage: a zero-advantage mini-batch still has a gradient
    assert fixed["kl_cov"] == ("token", None, False, False, ("kl_cov_ratio", "ppo_kl_coef"))
    assert importance_sampling_levels() == {"token": "vanilla", "sequence": "gspo"}
    assert all(policy_loss_spec(name).needs_old_log_probs for name in available_policy_losses())
    assert policy_loss_spec("clip").fn is policy_loss_spec("vanilla").fn is get_policy_loss("vanilla")


def test_a_registered_level_selects_its_loss():
    @register_policy_loss("test_plain_pg", importance_sampling_level="test_none", needs_old_log_probs=False)
    def plain_pg(log_prob, old_log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c):
        no_clip = paddle.zeros_like(advantages).astype("bool")
        return -advantages * log_prob, {"clip_low": no_clip, "clip_high": no_clip, "clip_dual": no_clip}

    assert importance_sampling_levels()["test_none"] == "test_plain_pg"
    assert not policy_loss_spec("test_plain_pg").needs_old_log_probs
    rng = np.random.default_rng(1)
    lp, adv = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=np.float64)
    out = compute_policy_loss(paddle.to_tensor(lp), paddle.to_tensor(lp), paddle.to_tensor(adv),
                              paddle.to_tensor(mask), importance_sampling_level="test_none")
    # float64 throughout: a sum of 7 products, f32_sum_tol's bound in float64 (u64 = 1.1e-16): 2 * 7 * u64 ~ 2e-15
    np.testing.assert_allclose(float(out["pg_loss"]), (-adv * lp * mask).sum() / mask.sum(), rtol=1e-12)


def test_one_level_has_one_loss():
    with pytest.raises(ValueError, match="'token' is already implemented by policy loss 'vanilla'"):
        register_policy_loss("test_token_again", importance_sampling_level="token")(lambda *a: a)
    assert "test_token_again" not in available_policy_losses()
