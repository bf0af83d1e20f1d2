"""The fp16 dynamic loss scale (review defect 7): its defaults are PaddleNLP's trainer's (paddle.amp.GradScaler with
init_loss_scaling = PaddleNLP's `scale_loss` default, GradScaler's own defaults otherwise), read from the installed
paddle and PaddleNLP rather than copied; and its state goes into checkpoints, so a resumed fp16 run continues with
the scale and counters it had (no GPU: the trainer's update hooks run on CPU with an explicit Amp, as in
tests/test_precision.py)."""
import dataclasses
import inspect
import json

import paddle
import pytest

from paddle_grpo.precision import Amp, LossScale, PrecisionPlan
from paddle_grpo.run import state as run_state


def test_the_defaults_are_paddlenlps_trainer_scaler():
    from paddlenlp.trainer import TrainingArguments

    grad_scaler = {k: p.default for k, p in inspect.signature(paddle.amp.GradScaler.__init__).parameters.items()}
    scale_loss = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}["scale_loss"]
    ours = LossScale()
    assert ours.scale == scale_loss == 2.0 ** 15  # PaddleNLP: GradScaler(init_loss_scaling=args.scale_loss)
    assert (ours.incr_ratio, ours.decr_ratio, ours.incr_every_n_steps, ours.decr_every_n_nan_or_inf) == (
        grad_scaler["incr_ratio"], grad_scaler["decr_ratio"], grad_scaler["incr_every_n_steps"],
        grad_scaler["decr_every_n_nan_or_inf"])


PATTERN = [True] * 5 + [False, True, False, False, True, True, True]


def scales(loss_scale, pattern):
    out = []
    for finite in pattern:
        loss_scale.update(finite)
        out.append(loss_scale.scale)
    return out


def test_a_restored_scale_continues_as_the_uninterrupted_one():
    make = lambda: LossScale(init_loss_scaling=64.0, incr_every_n_steps=3, decr_every_n_nan_or_inf=2)  # noqa: E731
    whole = scales(make(), PATTERN)
    first = make()
    head = scales(first, PATTERN[:6])
    state = json.loads(json.dumps(first.state_dict()))  # what trainer_state.json holds
    second = make()
    second.load_state_dict(state)
    assert head + scales(second, PATTERN[6:]) == whole
    amp = Amp(PrecisionPlan(device="gpu", loss_scaling=True), make())
    amp.load_state_dict(state)
    assert amp.state_dict() == state
    assert Amp(PrecisionPlan()).state_dict() is None  # bf16 / no loss scale: nothing to keep
    Amp(PrecisionPlan()).load_state_dict(state)  # a checkpoint of an fp16 run resumed without fp16: ignored


def make_trainer(files, policy_dir, out):
    from paddle_grpo.config import config_from_dict
    from paddle_grpo.trainer import Trainer

    return Trainer(config_from_dict(dict(
        actor_model_name_or_path=policy_dir, use_rm_server=False, reward_funcs=f"{files / 'rewards.py'}:r",
        train_datasets=str(files / "train.jsonl"), output_dir=str(out), logging_dir=str(out / "vdl"),
        max_prompt_len=16, max_dec_len=6, min_dec_len=1, max_length=24, global_batch_size=2, rollout_n=4,
        per_device_train_batch_size=4, learning_rate=2e-3, max_steps=2, kl_coeff=0.0, save_strategy="steps",
        save_steps=1, disable_tqdm=True, seed=3, report_to="none")))


def test_checkpoints_carry_the_loss_scale_and_resume_restores_it(who_is_files, tiny_policy_dir, tmp_path):
    from paddle_grpo.run.checkpoint import load_trainer_state

    plan = PrecisionPlan(device="gpu", loss_scaling=True)  # the update's hooks; autocast stays a no-op on CPU
    trainer = make_trainer(who_is_files, tiny_policy_dir, tmp_path / "run")
    # A scale that overflows float32 on the first update: the step is skipped and the scale halved. Whether 3e38
    # overflows depends on the backward's arithmetic (kernels/norm.py's RMSNorm backward keeps such gradients
    # finite where autograd's overflowed), so the embedding's gradient is scaled once more, to infinity: the
    # overflow an fp16 backward produces, made certain.
    trainer.learner.amp = Amp(plan, LossScale(init_loss_scaling=3e38, decr_every_n_nan_or_inf=1))
    embedding = trainer.policy.model.get_input_embeddings().weight
    embedding.register_hook(lambda grad: grad * trainer.learner.amp.loss_scale.scale)
    trainer.train_step()
    trainer.save()
    saved = trainer.learner.amp.state_dict()
    assert saved["scale"] == 1.5e38
    state = load_trainer_state(trainer.last_checkpoint)
    assert state["loss_scale"] == saved
    resumed = make_trainer(who_is_files, tiny_policy_dir, tmp_path / "run")  # output_dir with a checkpoint: resumes
    resumed.learner.amp = Amp(plan, LossScale())
    run_state.restore(resumed, trainer.last_checkpoint)  # the CPU plan built no loss scale; resume into the GPU one
    assert resumed.learner.amp.state_dict() == saved and resumed.step == 1
