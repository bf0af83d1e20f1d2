"""Every log-prob pass that is compared runs at the update's precision (review defect 1): under AMP the rollout that
samples (its sample log-probs), the old log-probs, the reference log-probs and the update all run the model inside
the plan's autocast context; otherwise (O1) the ratio is not 1 on policy and the k3 KL is above 0 at step 0.

No GPU here, and paddle's autocast does nothing on a CPU: the test runs a real trainer step with a real GPU plan's
`Amp` whose autocast context also counts how deep it is entered, and a forward hook on each model's decoder records
whether it ran inside (PADDLE_GRPO_FAST=0: the PaddleNLP forward that a GPU autocast selects anyway). What autocast
then computes on a GPU is not checked (docs/precision.md)."""
import contextlib

import pytest

from paddle_grpo.config import config_from_dict
from paddle_grpo.precision import Amp, PrecisionPlan


class CountingAmp(Amp):
    """The real Amp of a bf16 O1 GPU plan (its autocast calls paddle.amp.auto_cast), counting how deep it is in."""
    depth = 0

    @contextlib.contextmanager
    def autocast(self):
        with super().autocast():
            self.depth += 1
            try:
                yield
            finally:
                self.depth -= 1


def test_rollout_old_reference_and_update_passes_all_run_under_the_plans_autocast(who_is_files, tiny_policy_dir,
                                                                                  tmp_path, monkeypatch):
    from paddle_grpo.trainer import Trainer

    files = who_is_files

    monkeypatch.setenv("PADDLE_GRPO_FAST", "0")
    cfg = config_from_dict(dict(
        actor_model_name_or_path=tiny_policy_dir, use_rm_server=False, reward_funcs=f"{files / 'rewards.py'}:r",
        train_datasets=str(files / "train.jsonl"), eval_datasets=str(files / "train.jsonl"), do_eval=True,
        output_dir=str(tmp_path / "out"), max_prompt_len=16, max_dec_len=5, min_dec_len=1, max_length=24,
        global_batch_size=2, global_mini_batch_size=1, rollout_n=4, per_device_train_batch_size=4,
        kl_coeff=0.0, kl_loss_coeff=0.1, max_steps=1, save_strategy="no", disable_tqdm=True, report_to="none",
        eval_max_reward=1.0))
    trainer = Trainer(cfg)
    assert trainer.reference is not None and trainer.geometry.optimizer_steps_per_step == 2  # old log-probs too
    amp = CountingAmp(PrecisionPlan(device="gpu", amp_dtype="bfloat16", amp_level="O1"))
    trainer.learner.amp = amp
    calls = []
    for name, model in (("policy", trainer.policy.model), ("reference", trainer.reference.model)):
        model.get_decoder().register_forward_pre_hook(
            lambda layer, inputs, name=name: calls.append((name, amp.depth > 0, layer.training)))
    trainer.train_step()
    trainer.evaluate()
    outside = [c for c in calls if not c[1]]
    assert not outside, f"{len(outside)} of {len(calls)} model passes ran outside the autocast: {outside[:5]}"
    policy_eval = [c for c in calls if c[0] == "policy" and not c[2]]  # rollout (prefill + steps), old, eval
    assert len(policy_eval) > 2 * cfg.max_dec_len and any(c[0] == "reference" for c in calls)
    assert any(c[0] == "policy" and c[2] for c in calls)  # the update's forward (train mode)
