"""The precision plan (paddle_grpo/precision.py): its decisions for every combination of device, AMP keys and kernel
flags against an independent table; its conflicts and its start-up line; and, on this CPU, that applying it changes
nothing for a float32 run (the loaded model, the update's contexts, a trainer step) while a GPU plan's loading
options, paddle calls and loss scale do what they say. No GPU here: the GPU plan's paddle calls are checked for
their arguments (paddle's CPU build accepts them and does nothing), not for their numbers."""
import contextlib
import itertools
import logging
import math

import numpy as np
import paddle
import pytest

from paddle_grpo import step
from paddle_grpo.config import FIELDS, Config, config_from_dict
from paddle_grpo.policy import load_policy
from paddle_grpo.precision import (CPU_REASONS, GPU_EFFECT, NOT_IMPLEMENTED, Amp, LossScale, PrecisionPlan,
                                   plan_for_run, precision_plan)
from resume_helpers import params

FLAGS = ("use_flash_attention", "use_fused_rms_norm", "use_fused_rope", "use_fused_linear")


def expected_plan(device, amp, level, master_grad, flags):
    """The plan's fields written out case by case (PaddleNLP's trainer: O2 loads low precision and decorates with
    float32 master weights; fp16 scales the loss; nothing of it on a CPU)."""
    requested_details = (["fp16_opt_level"] if level == "O2" else []) + (["amp_master_grad"] if master_grad else [])
    if device == "cpu":
        not_applied = ([amp] if amp else []) + requested_details + list(flags)
        return dict(load_dtype="float32", amp_dtype=None, decorate_o2=False, master_grad=False, loss_scaling=False,
                    model_flags=(), not_applied_keys=not_applied)
    if amp is None:
        return dict(load_dtype="float32", amp_dtype=None, decorate_o2=False, master_grad=False, loss_scaling=False,
                    model_flags=tuple((f, True) for f in flags), not_applied_keys=requested_details)
    dtype = {"bf16": "bfloat16", "fp16": "float16"}[amp]
    return dict(load_dtype=dtype if level == "O2" else "float32", amp_dtype=dtype, amp_level=level,
                decorate_o2=level == "O2", master_grad=master_grad and level == "O2", loss_scaling=amp == "fp16",
                model_flags=tuple((f, True) for f in flags),
                not_applied_keys=["amp_master_grad"] if master_grad and level == "O1" else [])


@pytest.mark.parametrize("device,amp,level,master_grad,flags", itertools.product(
    ("cpu", "gpu"), (None, "bf16", "fp16"), ("O1", "O2"), (False, True), ((), FLAGS, ("use_fused_rope",))))
def test_the_plan_for_every_combination(device, amp, level, master_grad, flags):
    cfg = Config(bf16=amp == "bf16", fp16=amp == "fp16", fp16_opt_level=level, amp_master_grad=master_grad,
                 **{f: True for f in flags})
    plan = precision_plan(cfg, device)
    want = expected_plan(device, amp, level, master_grad, flags)
    assert [k for k, _ in plan.not_applied] == want.pop("not_applied_keys")
    for key, value in want.items():
        assert getattr(plan, key) == value, key
    assert plan.device == device and plan.uses_amp == (want["amp_dtype"] is not None)
    assert all(reason for _, reason in plan.not_applied)
    if device == "cpu" and amp:
        assert dict(plan.not_applied)[amp] == CPU_REASONS[amp]


def test_the_amp_lists_go_to_autocast_on_gpu_and_are_reported_elsewhere():
    cfg = Config(bf16=True, amp_custom_white_list=["matmul_v2"], amp_custom_black_list=["reduce_sum", "exp"])
    gpu = precision_plan(cfg, "gpu:3")
    assert gpu.custom_white_list == ("matmul_v2",) and gpu.custom_black_list == ("reduce_sum", "exp")
    assert gpu.device == "gpu" and gpu.not_applied == ()
    cpu = precision_plan(cfg, "cpu")
    assert [k for k, _ in cpu.not_applied] == ["bf16", "amp_custom_white_list", "amp_custom_black_list"]
    assert dict(cpu.not_applied)["amp_custom_black_list"] == "no AMP on this device (see bf16)"
    plain = precision_plan(Config(amp_custom_black_list=["exp"]), "gpu")
    assert plain.not_applied == (("amp_custom_black_list", "neither bf16 nor fp16 is set: no AMP"),)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_unimplemented_keys_give_their_reason_on_every_device(device):
    plan = precision_plan(Config(sequence_parallel=True, use_fused_head_and_loss_fn=True, tensor_parallel_degree=2),
                          device)
    assert dict(plan.not_applied) == NOT_IMPLEMENTED
    assert "sequence_parallel" not in dict(plan.model_flags)


def test_pipeline_parallel_runs_float32_and_says_why():
    plan = precision_plan(Config(fp16=True, fp16_opt_level="O2", pipeline_parallel_degree=2,
                                 use_flash_attention=True), "gpu")
    assert plan.load_dtype == "float32" and not plan.uses_amp and not plan.loss_scaling
    assert [k for k, _ in plan.not_applied] == ["fp16", "fp16_opt_level"]
    assert "pipeline_parallel_degree > 1" in dict(plan.not_applied)["fp16"]
    assert plan.model_flags == (("use_flash_attention", True),)


def test_other_devices_run_float32_and_name_the_device():
    plan = precision_plan(Config(bf16=True, use_fused_rope=True), "xpu:0")
    assert plan.load_dtype == "float32" and not plan.uses_amp and plan.model_flags == ()
    assert [k for k, _ in plan.not_applied] == ["bf16", "use_fused_rope"]
    assert all("device 'xpu'" in reason for _, reason in plan.not_applied)


def test_conflicts_are_errors_naming_the_keys():
    with pytest.raises(ValueError, match="bf16 and fp16"):
        precision_plan(Config(bf16=True, fp16=True), "gpu")
    with pytest.raises(ValueError, match="fp16_opt_level: 'O3'"):
        precision_plan(Config(fp16_opt_level="O3"), "gpu")


def test_describe_is_one_line_saying_what_is_done_and_what_not():
    assert precision_plan(Config(), "cpu").describe() == (
        "precision: float32 throughout, no AMP, kernels: PaddleNLP defaults (cpu)")
    assert precision_plan(Config(bf16=True, fp16_opt_level="O2", amp_master_grad=True, use_flash_attention=True),
                          "gpu").describe() == (
        "precision: bfloat16 parameters, auto_cast O2 bfloat16 with float32 master weights and float32 master "
        "gradients, kernels: use_flash_attention (gpu)")
    assert precision_plan(Config(fp16=True, amp_custom_black_list=["exp"]), "gpu").describe() == (
        "precision: float32 parameters, auto_cast O1 float16, dynamic loss scale, white list [], black list "
        "['exp'], kernels: PaddleNLP defaults (gpu)")
    line = precision_plan(Config(bf16=True, use_fused_rms_norm=True), "cpu").describe()
    assert "\n" not in line and line == (
        "precision: float32 throughout, no AMP, kernels: PaddleNLP defaults (cpu); not applied: bf16: "
        f"{CPU_REASONS['bf16']} | use_fused_rms_norm: {CPU_REASONS['use_fused_rms_norm']}")


def test_every_key_the_plan_reads_is_a_config_field_with_a_gpu_statement():
    keys = set(GPU_EFFECT) | set(NOT_IMPLEMENTED) | set(CPU_REASONS)
    assert keys <= set(FIELDS)
    assert set(GPU_EFFECT) == set(FLAGS) | set(NOT_IMPLEMENTED) | {
        "bf16", "fp16", "fp16_opt_level", "amp_master_grad", "amp_custom_white_list", "amp_custom_black_list"}
    # Each key set on its own is either applied by the GPU plan or reported with a reason: never silently dropped.
    for key in GPU_EFFECT:
        value = "O2" if key == "fp16_opt_level" else ["exp"] if key.startswith("amp_custom") else True
        cfg = Config(**{key: value, **({} if key in ("bf16", "fp16") else {"bf16": True})})
        plan = precision_plan(cfg, "gpu")
        applied = {"bf16": plan.amp_dtype == "bfloat16", "fp16": plan.loss_scaling,
                   "fp16_opt_level": plan.decorate_o2, "amp_master_grad": plan.master_grad,
                   "amp_custom_white_list": bool(plan.custom_white_list),
                   "amp_custom_black_list": bool(plan.custom_black_list)}.get(key, key in dict(plan.model_flags))
        assert applied or key in dict(plan.not_applied), key


# ------------------------------------------------------------------------------------ runtime, on this CPU

def test_a_float32_plan_is_a_no_op():
    plan = precision_plan(Config(), "cpu")
    assert plan == PrecisionPlan(device="cpu")
    assert isinstance(plan.autocast(), contextlib.nullcontext)
    assert plan.load_kwargs == {} and plan.runtime() is None
    optimizer = object()
    assert plan.decorate(paddle.nn.Linear(2, 2), optimizer) is optimizer
    assert isinstance(precision_plan(Config(bf16=True, use_flash_attention=True), "cpu").autocast(),
                      contextlib.nullcontext)


def test_a_gpu_plan_calls_paddles_amp_api_with_its_settings(monkeypatch):
    plan = precision_plan(Config(bf16=True, fp16_opt_level="O2", amp_master_grad=True,
                                 amp_custom_black_list=["exp"]), "gpu")
    # The real calls: paddle's CPU build accepts these arguments (and leaves the CPU run in float32).
    with plan.autocast():
        pass
    model = paddle.nn.Linear(4, 4)
    optimizer = paddle.optimizer.AdamW(parameters=model.parameters())
    assert plan.decorate(model, optimizer) is not None
    calls = {}
    monkeypatch.setattr(paddle.amp, "auto_cast", lambda **kw: calls.setdefault("auto_cast", kw) and None)
    monkeypatch.setattr(paddle.amp, "decorate", lambda **kw: calls.setdefault("decorate", kw) and (model, "opt"))
    plan.autocast()
    assert plan.decorate(model, optimizer) == "opt"
    assert calls["auto_cast"] == dict(enable=True, custom_white_list=None, custom_black_list={"exp"}, level="O2",
                                      dtype="bfloat16")
    assert calls["decorate"] == dict(models=model, optimizers=optimizer, level="O2", dtype="bfloat16",
                                     master_weight=True, master_grad=True)
    assert plan.load_kwargs == {"dtype": "bfloat16"}
    amp = precision_plan(Config(fp16=True), "gpu").runtime()
    assert isinstance(amp, Amp) and amp.loss_scale.scale == 2.0 ** 15
    assert precision_plan(Config(bf16=True), "gpu").runtime().loss_scale is None


def test_loading_takes_the_plans_dtype_and_kernel_flags(tiny_policy_dir):
    default = load_policy(tiny_policy_dir, **precision_plan(Config(), "cpu").load_kwargs)
    assert {str(p.dtype) for p in default.model.parameters()} == {"paddle.float32"}
    assert not default.model.config.use_flash_attention and not default.model.config.use_fused_rms_norm
    plan = precision_plan(Config(bf16=True, fp16_opt_level="O2", use_flash_attention=True,
                                 use_fused_rms_norm=True), "gpu")
    low = load_policy(tiny_policy_dir, trainable=False, **plan.load_kwargs)
    assert {str(p.dtype) for p in low.model.parameters()} == {"paddle.bfloat16"}
    assert low.model.config.use_flash_attention and low.model.config.use_fused_rms_norm
    for name, p in default.model.named_parameters():  # the same weights, rounded to bfloat16
        expected = paddle.to_tensor(p.numpy()).astype("bfloat16").astype("float32").numpy()
        np.testing.assert_array_equal(dict(low.model.named_parameters())[name].astype("float32").numpy(), expected)


def test_the_maths_after_the_model_runs_outside_autocast(tiny_policy_dir, monkeypatch):
    """Under the update's autocast the log-softmax and entropy leave it (O2 would cast their float32 inputs down):
    each log-prob call opens paddle.amp.auto_cast(enable=False) once, and the numbers are the float32 ones."""
    from paddle_grpo.precision import full_precision

    assert isinstance(full_precision(), contextlib.nullcontext)  # no autocast active: nothing happens
    policy = load_policy(tiny_policy_dir, trainable=False)
    rng = np.random.default_rng(1)
    prompt = paddle.to_tensor(rng.integers(3, 300, size=(2, 5)))
    completion = paddle.to_tensor(rng.integers(3, 300, size=(2, 4)))
    ones = lambda t: paddle.ones(t.shape, dtype="int64")  # noqa: E731
    expected, _ = policy.logprobs(prompt, ones(prompt), completion, ones(completion))
    calls = []
    monkeypatch.setattr(paddle.amp, "is_autocast_enabled", lambda *a: True)

    def auto_cast(*args, **kwargs):  # PaddleNLP's RMSNorm calls auto_cast(False) positionally; ours use keywords
        if kwargs:
            calls.append(kwargs)
        return contextlib.nullcontext()

    monkeypatch.setattr(paddle.amp, "auto_cast", auto_cast)
    lp, entropy = policy.logprobs(prompt, ones(prompt), completion, ones(completion), with_entropy=True)
    assert calls == [{"enable": False}] and lp.dtype == paddle.float32 and entropy.dtype == paddle.float32
    # autocast is faked (a null context): the same float32 kernels as `expected` in one process, equal in practice
    np.testing.assert_allclose(lp.numpy(), expected.numpy(), rtol=1e-5, atol=1e-5)


def test_resume_reads_weights_back_into_a_low_precision_model(tiny_policy_dir):
    from paddle_grpo.run import checkpoint

    low = load_policy(tiny_policy_dir, dtype="bfloat16")
    expected = {n: p.astype("float32").numpy() for n, p in low.model.named_parameters()}
    for p in low.model.parameters():
        p.set_value(paddle.zeros_like(p))
    checkpoint.load_weights(low.model, tiny_policy_dir)
    assert {str(p.dtype) for p in low.model.parameters()} == {"paddle.bfloat16"}
    for n, p in low.model.named_parameters():
        np.testing.assert_array_equal(p.astype("float32").numpy(), expected[n])


def test_loss_scale_follows_gradscalers_dynamic_rule():
    scale = LossScale(init_loss_scaling=8.0, incr_every_n_steps=3, decr_every_n_nan_or_inf=2)
    seen = []
    for finite in (True, True, True, False, True, False, False, True, True, True):
        scale.update(finite)
        seen.append(scale.scale)
    # 3 good -> x2; a bad then a good resets the bad count; 2 bad in a row -> x0.5; then 3 good -> x2.
    assert seen == [8, 8, 16, 16, 16, 16, 8, 8, 8, 16]


def test_amp_unscales_and_reports_overflow_only_for_a_finite_loss():
    amp = Amp(PrecisionPlan(device="gpu", loss_scaling=True), LossScale(init_loss_scaling=4.0,
                                                                         decr_every_n_nan_or_inf=1))
    assert float(amp.scale(paddle.to_tensor(1.5))) == 6.0
    p = paddle.create_parameter([3], "float32")
    p.grad = paddle.to_tensor([4.0, 8.0, -2.0])
    amp.unscale([p])
    np.testing.assert_array_equal(p.grad.numpy(), [1.0, 2.0, -0.5])
    assert not amp.overflowed(False, float("nan")) and amp.loss_scale.scale == 4.0  # a NaN loss: a real failure
    assert amp.overflowed(True, float("inf")) and amp.loss_scale.scale == 2.0
    assert not amp.overflowed(True, 3.0) and amp.loss_scale.scale == 2.0
    amp.loss_scale.scale = 1.0
    assert not amp.overflowed(True, float("nan"))  # not finite at scale 1: a real failure
    assert Amp(PrecisionPlan()).scale("loss") == "loss" and not Amp(PrecisionPlan()).overflowed(True, math.inf)


# ---------------------------------------------------------------------------------- the trainer, on this CPU

@pytest.fixture(scope="module")
def trainer_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("precision")
    rows = [f'{{"src": "Who is {n}?", "tgt": "{n}"}}' for n in ("Ann", "Bob", "Cid", "Dan")]
    (d / "train.jsonl").write_text("\n".join(rows) + "\n")
    (d / "rewards.py").write_text("def r(prompts, completions, tgt=None, **kw):\n"
                                  "    return [0.1 * len(c) for c in completions]\n")
    return d


def make_trainer(files, policy_dir, out, **overrides):
    from paddle_grpo.trainer import Trainer

    values = dict(actor_model_name_or_path=policy_dir, use_rm_server=False, reward_funcs=f"{files / 'rewards.py'}:r",
                  train_datasets=str(files / "train.jsonl"), output_dir=str(out), logging_dir=str(out / "vdl"),
                  max_prompt_len=16, max_dec_len=6, min_dec_len=1, max_length=24, global_batch_size=2, rollout_n=4,
                  per_device_train_batch_size=4, per_device_logprob_batch_size=8, learning_rate=2e-3, max_steps=1,
                  kl_coeff=0.0, save_strategy="no", disable_tqdm=True, seed=3, temperature=1.0)
    values.update(overrides)
    return Trainer(config_from_dict(values))


def test_on_cpu_bf16_is_reported_and_the_step_is_exactly_the_float32_one(trainer_files, tiny_policy_dir, tmp_path,
                                                                        caplog):
    plain = make_trainer(trainer_files, tiny_policy_dir, tmp_path / "plain")
    assert plain.precision == PrecisionPlan(device="cpu") and plain.learner.amp is None
    with caplog.at_level(logging.INFO, logger="paddle_grpo.precision"):
        asked = make_trainer(trainer_files, tiny_policy_dir, tmp_path / "bf16", bf16=True, fp16_opt_level="O2",
                             use_flash_attention=True)
    lines = [r for r in caplog.records if r.name == "paddle_grpo.precision"]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert lines[0].getMessage().startswith("precision: float32 throughout, no AMP")
    assert f"bf16: {CPU_REASONS['bf16']}" in lines[0].getMessage()
    assert "use_flash_attention: flash attention is a GPU kernel" in lines[0].getMessage()
    assert asked.learner.amp is None and not asked.policy.model.config.use_flash_attention
    assert {str(p.dtype) for p in asked.policy.model.parameters()} == {"paddle.float32"}
    plain.train_step()
    asked.train_step()
    a, b = params(plain.policy.model), params(asked.policy.model)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], v) for k, v in params(make_trainer(
        trainer_files, tiny_policy_dir, tmp_path / "fresh").policy.model).items())  # the step did change them


def test_the_update_with_a_loss_scale_equals_the_unscaled_update(trainer_files, tiny_policy_dir, tmp_path):
    """The update's hooks on CPU: a power-of-two loss scale multiplies and divides exactly, so the parameters after
    one update are those of the float32 update; a scale that overflows skips the step without counting it."""
    def one_update(out, amp, overflow=False):
        trainer = make_trainer(trainer_files, tiny_policy_dir, out)
        trainer.learner.amp = amp
        if overflow:  # whether a scale overflows depends on the backward's arithmetic (kernels/norm.py keeps 3e38
            # finite where autograd overflowed): the embedding's gradient scaled once more, to infinity, as an fp16
            # backward's overflow
            embedding = trainer.policy.model.get_input_embeddings().weight
            embedding.register_hook(lambda grad: grad * amp.loss_scale.scale)
        cfg = trainer.cfg
        batch, _ = step.collect(trainer.par, trainer.policy, trainer.encode, trainer.rewarder, trainer.sampler,
                                trainer.train_records, cfg, trainer.geometry.prompts_per_rank, 0)
        advantages = paddle.to_tensor(np.random.default_rng(0).normal(size=batch.completion_ids.shape)
                                      .astype("float32"))
        inputs = step.UpdateInputs(batch, advantages, batch.completion_mask, None, None)
        before = params(trainer.policy.model)
        metrics = step.update(trainer.par, trainer.learner, inputs, cfg, trainer.geometry, 0).as_dict()
        return before, params(trainer.policy.model), metrics, trainer.learner.state

    plan = PrecisionPlan(device="gpu", loss_scaling=True)  # autocast stays a no-op: no amp_dtype
    _, plain, plain_metrics, _ = one_update(tmp_path / "a", None)
    _, scaled, scaled_metrics, _ = one_update(tmp_path / "b", Amp(plan, LossScale(init_loss_scaling=1024.0)))
    assert all(np.array_equal(plain[k], scaled[k]) for k in plain)
    assert scaled_metrics["train/grad_norm"] == plain_metrics["train/grad_norm"]
    overflow = Amp(plan, LossScale(init_loss_scaling=3e38, decr_every_n_nan_or_inf=1))
    before, after, metrics, state = one_update(tmp_path / "c", overflow, overflow=True)
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert state.nonfinite_total == 0 and state.nonfinite_in_a_row == 0 and overflow.loss_scale.scale == 1.5e38
    assert math.isnan(metrics["train/grad_norm"]) or math.isinf(metrics["train/grad_norm"])


def test_plan_for_run_uses_this_process_device():
    assert plan_for_run(Config(), announce=False).device == paddle.get_device().split(":")[0]
