"""AlgorithmArguments: the advantage estimator, losses, KL, clipping, reward shaping (docs/algorithms.md)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .fields import _from_algorithms, arg, nowhere


@dataclass
class AlgorithmArguments:
    rl_algorithm: str = arg("grpo", "Advantage estimator.",
                            choices=_from_algorithms("available_advantage_estimators"))
    norm_adv_by_std: bool = arg(True, "(new) GRPO: divide by the group std; false gives Dr.GRPO.")
    kl_coeff: float = arg(0.001, "KL penalty coefficient inside the reward (REINFORCE++ style). With "
                                 "rl_algorithm grpo (and the other GRPO-family estimators) it has no effect unless "
                                 "use_kl_in_reward, as in PaddleNLP, whose GRPO ignores it.")
    use_kl_in_reward: bool = arg(False, "(new) GRPO-family estimators only: also put kl_coeff's KL into the reward, "
                                        "per sequence (verl's use_kl_in_reward). PaddleNLP's GRPO ignores kl_coeff.")
    kl_estimator: str = arg("k1", "(new) KL estimator for the KL in the reward.",
                            choices=_from_algorithms("KL_ESTIMATORS"))
    kl_loss_coeff: float = arg(0.0, "KL loss coefficient (GRPO style); works for every estimator.")
    kl_loss_estimator: str = arg("k3", "(new) KL estimator for the KL loss.",
                                 choices=_from_algorithms("KL_ESTIMATORS"))
    pg_loss_coeff: float = arg(1.0, "Policy-gradient loss coefficient.")
    entropy_coeff: float = arg(0.0, "Entropy bonus coefficient. With entropy_target: the adaptive coefficient's "
                                    "starting value.")
    entropy_target: Optional[float] = arg(
        None, "(new) Adaptive entropy control (Skywork-OR1, docs/algorithms.md \"Entropy control\"): the token-mean "
              "entropy the entropy bonus steers toward. After each step the coefficient c moves by entropy_coeff_lr "
              "up when the step's entropy (train/entropy) was below the target and down (not below 0) when above; "
              "the next step's bonus is c while the entropy is at or below the target, else 0. Logged as "
              "train/entropy_coeff and kept in checkpoints. Unset (null): the fixed entropy_coeff.")
    entropy_coeff_lr: float = arg(0.005, "(new) entropy_target's step: how much the adaptive entropy coefficient "
                                         "moves per training step (Skywork-OR1's delta, 0.005). >= 0.")
    mask_truncated_completions: bool = arg(
        False, "(new) TRL's mask_truncated_completions: completions that reached max_dec_len without an end token "
               "(response_length/clip_ratio counts them) are left out of the policy's loss (policy, KL, entropy "
               "terms); their rewards still enter the group's advantages, and a critic still learns their values.")
    clip_range_ratio: float = arg(0.2, "PPO clip range of the ratio.")
    clip_range_ratio_low: Optional[float] = arg(None, "Lower clip range (default: clip_range_ratio).")
    clip_range_ratio_high: Optional[float] = arg(None, "Upper clip range (DAPO's clip-higher uses a larger value). "
                                                       "Unset (null): the estimator's default, 0.28 for "
                                                       "rl_algorithm vapo (the paper's), else clip_range_ratio. "
                                                       "policy_loss cispo: its weight's cap is 1 + this value "
                                                       "(TRL's epsilon_high 5.0 for CISPO is 4.0 here).")
    clip_ratio_c: Optional[float] = arg(None, "(new) Dual-clip constant c > 1 for negative advantages (off when "
                                              "unset).")
    importance_sampling_level: str = arg("token", "(new) token: per-token ratio; sequence: GSPO's sequence ratio. "
                                                  "With policy_loss: unset, or the loss's own level.",
                                         choices=_from_algorithms("importance_sampling_levels"))
    policy_loss: Optional[str] = arg(
        None, "(new) The policy loss by name (verl's loss_mode; docs/algorithms.md section 4): vanilla / clip (PPO "
              "clip, clip-higher, dual-clip), gspo, cispo (MiniMax-M1: a truncated stop-gradient weight, bound "
              "1 + clip_range_ratio_high), geo_mean / gmpo (GMPO: geometric mean of the token ratios, clip range in "
              "log space), sapo (SAPO: a sigmoid gate, sapo_temperature_pos/neg), clip_cov / kl_cov (Cui et al.: "
              "the tokens of largest covariance of log-prob and advantage, clip_cov_* / kl_cov_ratio, ppo_kl_coef). "
              "Unset (null): from importance_sampling_level (token: vanilla, sequence: gspo). gspo and gmpo set the "
              "ratio level sequence, gmpo and sapo the loss_agg_mode seq-mean-token-mean (their papers'); an "
              "explicit importance_sampling_level, loss_agg_mode or clip_ratio_c that contradicts the loss is "
              "refused.",
        choices=_from_algorithms("available_policy_losses"))
    sapo_temperature_pos: float = arg(1.0, "(new) policy_loss sapo: the gate's temperature tau where the advantage "
                                           "is positive, f(r) = sigmoid(tau (r - 1)) 4 / tau (TRL's name; verl's "
                                           "tau_pos; the paper's 1.0). > 0.")
    sapo_temperature_neg: float = arg(1.05, "(new) policy_loss sapo: the gate's temperature where the advantage is "
                                            "not positive (TRL's name; verl's tau_neg; the paper's 1.05). > 0.")
    clip_cov_ratio: float = arg(0.0002, "(new) policy_loss clip_cov: the share of a micro-batch's valid tokens "
                                        "(at least 1) drawn among the band's to get no gradient (verl's name and "
                                        "default). In (0, 1].")
    clip_cov_lb: float = arg(1.0, "(new) policy_loss clip_cov: lower bound of the covariance band (verl's).")
    clip_cov_ub: float = arg(5.0, "(new) policy_loss clip_cov: upper bound of the covariance band (verl's); above "
                                  "clip_cov_lb.")
    kl_cov_ratio: float = arg(0.0002, "(new) policy_loss kl_cov: the share of a micro-batch's valid tokens (at "
                                      "least 1), those of largest covariance, that get the KL penalty (verl's name "
                                      "and default; the paper uses 0.002 for Qwen2.5-7B). In (0, 1].")
    ppo_kl_coef: float = arg(1.0, "(new) policy_loss kl_cov: the coefficient of the penalty |log(pi / pi_old)| on "
                                  "the selected tokens (verl's name and default). >= 0.")
    rollout_correction: str = arg(
        "none", "(new) Off-policy correction of the policy-gradient loss by the sampler's own log-probs l^s "
                "(docs/algorithms.md, \"Rollout correction\"): each token's loss is weighted by the ratio "
                "r = exp(l^old - l^s) of the trainer's old log-probs to the sampler's. tis: truncated, "
                "min(r, rollout_correction_cap); mis: masked, r inside [rollout_correction_min, "
                "rollout_correction_cap] and the token dropped outside; clip: no weight, but PPO's ratio is taken "
                "against l^s instead of l^old, so clip_range_ratio bounds the trainer's drift from the policy that "
                "sampled (the choice for async_rollout, docs/async.md); none: no weight (the ratio's mean and max "
                "are logged either way). The ratio is taken per token or per sequence: rollout_correction_level. "
                "Not set in the file or on the command line: clip with async_rollout and rollout_lag >= 1 (a "
                "lagged sampler uncorrected collapsed the quickstart, docs/async.md), else none; an explicit none "
                "is kept.",
        choices=_from_algorithms("ROLLOUT_CORRECTIONS"))
    rollout_correction_level: Optional[str] = arg(
        None, "(new) rollout_correction tis / mis: the level of the ratio (verl's names, docs/algorithms.md). token: "
              "r_t per token; sequence: the product of the row's token ratios, exp(sum_t log r_t), one weight per "
              "row (Seq-TIS / Seq-MIS); geometric: their geometric mean, exp(mean_t log r_t) (GSPO's length "
              "normalisation; as a band keep it tight, verl uses 1.0001-1.001). Unset (null): geometric with "
              "importance_sampling_level sequence (GSPO), else token.",
        choices=_from_algorithms("ROLLOUT_CORRECTION_LEVELS"))
    rollout_correction_cap: float = arg(2.0, "(new) rollout_correction tis: the cap C of the ratio; mis: the upper "
                                             "bound of the band of kept ratios (no effect with clip or none). > 1 "
                                             "(the on-policy ratio, 1, is never capped or dropped).")
    rollout_correction_min: float = arg(0.5, "(new) rollout_correction mis: the lower bound of the band of kept "
                                             "ratios, in [0, 1) (0: no lower bound). No effect with tis or none.")
    loss_agg_mode: str = arg("token-mean", "(new) How per-token losses are averaged.",
                             choices=_from_algorithms("LOSS_AGG_MODES"))
    clip_range_score: float = arg(10.0, "Rewards are clipped to [-c, c] (0: no clipping).")
    clip_range_value: float = arg(5.0, "Critic (ppo, vapo): the value loss's clip range, PaddleNLP's "
                                       "RLHFValueLoss: 0.5 * token-mean of max((V - R)^2, (V_old + clip(V - V_old, "
                                       "-c, c) - R)^2), V_old the critic's values at the rollout.")
    gamma: float = arg(1.0, "Discount factor of GAE (ppo, vapo), in [0, 1]; PaddleNLP hard-codes 1.0.")
    lam: float = arg(0.95, "GAE's lambda of ppo's advantages and returns, in [0, 1]; PaddleNLP hard-codes 0.95.")
    lam_critic: float = arg(1.0, "(new) vapo: GAE's lambda of the critic's returns (decoupled GAE, VAPO arXiv "
                                 "2504.05118), in [0, 1]. The advantages use the length-adaptive lambda of "
                                 "vapo_alpha.")
    vapo_alpha: float = arg(0.05, "(new) vapo: alpha of the length-adaptive GAE lambda of the advantages, "
                                  "lam_policy = max(0, 1 - 1 / (vapo_alpha * l)) per completion of l tokens (the "
                                  "paper's formula is negative below 1 / vapo_alpha tokens, hence the 0). > 0.")
    positive_example_lm_coeff: Optional[float] = arg(
        None, "(new) Coefficient of VAPO's positive-example LM loss: the NLL of the correct completions of the batch "
              "(positive_example_min_reward), added to the policy loss. Unset (null): the estimator's default, 0.1 "
              "for rl_algorithm vapo (the paper's recipe), else 0 (off).")
    positive_example_min_reward: Optional[float] = arg(
        None, "(new) The reward (the combined reward before shaping) from which a completion counts as correct for "
              "the positive-example LM loss. Unset (null): the reward that counts as correct in eval/accuracy "
              "(eval_max_reward, else the maximum the reward functions declare) minus 1e-6; a run with the loss on "
              "and neither known stops at start-up.")
    normalize_reward: bool = arg(False, "Normalise rewards with running statistics. No effect with rl_algorithm "
                                        "grpo, as in PaddleNLP (which forces it off for GRPO).")
    normalize_advantage: bool = arg(False, "Whiten advantages over the global batch. No effect with rl_algorithm "
                                           "grpo, as in PaddleNLP (which forces it off for GRPO).")
    enable_overlong_reward_buffer: bool = arg(False, "DAPO overlong shaping of the reward.")
    overlong_reward_buffer: int = arg(256, "DAPO overlong buffer length L_b.")
    overlong_penalty_factor: float = arg(1.0, "DAPO overlong penalty factor.")
    dynamic_sampling: bool = arg(False, "DAPO dynamic sampling: drop groups with zero reward variance and sample "
                                        "more prompts.")
    max_gen_batches: int = arg(2, "Most generation rounds per step with dynamic sampling.")
    use_fp32_compute: bool = arg(True, "Compute log-probs, rewards, advantages and losses in float32.",
                                 **nowhere("log-probs, rewards, advantages and losses are always float32, "
                                           "whatever the model's dtype"))
    sync_ref_model: bool = arg(False, "(new) Periodically mix the policy into the reference model (TR-DPO).")
    ref_model_mixup_alpha: float = arg(0.9, "(new) ref <- alpha * policy + (1 - alpha) * ref.")
    ref_model_sync_steps: int = arg(64, "(new) Steps between reference-model syncs.")
