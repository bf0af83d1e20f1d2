"""A step that fails saves the last consistent state, and the resumed run equals the uninterrupted one (run/faults.py).

In-process, with the tiny policy, real reward servers on 127.0.0.1, real signals and a real file-size limit. Each
scenario stops a run at a chosen point of a step (its rollout's rewards, between its optimizer steps, its
checkpoint), checks what was saved and what the error says, resumes it with the same configuration and compares
the whole history (metrics.jsonl, rollouts.jsonl) and the final weights with an uninterrupted run: equal exactly
(fault_helpers.py says why exactness holds on one machine).
"""
import hashlib
import json
import os
import resource
import signal

import pytest

from fault_helpers import assert_same_history, assert_same_weights, make_cfg, read_rows, write_data
from paddle_grpo.rewards import get_reward_fn
from paddle_grpo.rewards.client import RewardServerError
from paddle_grpo.trainer import Trainer
from reward_server import create_app


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_data(tmp_path_factory.mktemp("faults"))


@pytest.fixture(scope="module")
def two_updates_reference(data, tiny_policy_dir, tmp_path_factory):
    """An uninterrupted run with two optimizer steps per step (global_mini_batch_size 2), a checkpoint every 2."""
    out = tmp_path_factory.mktemp("reference") / "out"
    Trainer(make_cfg(data, tiny_policy_dir, out, global_mini_batch_size=2, save_steps=2)).train()
    return out


class FailingAfter:
    """A reward server (WSGI app) that answers its first `n` requests with `app` and every later one with HTTP 503:
    a server gone for good after step n."""

    def __init__(self, app, n):
        self.app, self.n, self.hits = app, n, 0

    def __call__(self, environ, start_response):
        self.hits += 1
        if self.hits <= self.n:
            return self.app(environ, start_response)
        environ["wsgi.input"].read()
        start_response("503 Service Unavailable", [("Content-Type", "application/json")])
        return [json.dumps({"error_code": 503, "error_msg": "gone"}).encode()]


def test_a_reward_server_gone_for_good_saves_the_last_completed_step(data, tiny_policy_dir, tmp_path, serve):
    """Step 3 fails in its rollout's rewards, after its prompts were drawn from the sampler: the checkpoint holds
    the end of step 2 (the sampler rewound), and the same configuration with the server back resumes to the
    uninterrupted history."""
    fn = get_reward_fn(f"{data / 'rewards.py'}:name_reward")
    healthy = serve(create_app([fn]))
    server = dict(use_rm_server=True, reward_funcs="", reward_server=healthy.url)
    Trainer(make_cfg(data, tiny_policy_dir, tmp_path / "ref", **server)).train()

    failing = serve(FailingAfter(create_app([fn]), 2))
    out = tmp_path / "out"
    trainer = Trainer(make_cfg(data, tiny_policy_dir, out, **{**server, "reward_server": failing.url},
                               reward_server_max_wait_s=1))
    with pytest.raises(RewardServerError, match="HTTP 503: gone") as info:
        trainer.train()
    assert info.value.__notes__ == [f"RewardServerError at step 2: saved a checkpoint of the last completed step, "
                                    f"{out}/checkpoint-2: re-running the same command resumes from it with nothing "
                                    "lost"]
    assert [r["step"] for r in read_rows(out / "metrics.jsonl")] == [1, 2]
    state = json.loads((out / "checkpoint-2" / "trainer_state.json").read_text())
    # 2 steps of 4 prompts out of 12: position 8 of epoch 0 (step 3 had drawn 8..11 before its rewards failed)
    assert (state["step"], state["sampler"]["epoch"], state["sampler"]["position"]) == (2, 0, 8)
    assert state["optimizer_steps"] == 2 and "unlogged" not in state

    Trainer(make_cfg(data, tiny_policy_dir, out, **server)).train()
    assert_same_history(out, tmp_path / "ref")
    assert_same_weights(out / "checkpoint-4", tmp_path / "ref" / "checkpoint-4")


def _signal_or_fail_in_update(trainer, at_step, action):
    """Run `action()` right after the first optimizer step of step `at_step + 1` (the weights have changed)."""
    counted = trainer.learner.optimizer.step  # the guard's counting wrapper

    def step(*args, **kwargs):
        result = counted(*args, **kwargs)
        if trainer.step == at_step and trainer.guard.applied == 1:
            action()
        return result

    trainer.learner.optimizer.step = step


def test_sigterm_during_an_update_finishes_the_step_and_saves_it_with_its_metrics(
        data, tiny_policy_dir, tmp_path, two_updates_reference):
    out = tmp_path / "out"
    cfg = make_cfg(data, tiny_policy_dir, out, global_mini_batch_size=2, save_steps=2)
    trainer = Trainer(cfg)
    _signal_or_fail_in_update(trainer, 2, lambda: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    # The signal came between step 3's two optimizer steps: the update ran to its end, and step 3 was saved with
    # the metrics it had not written yet.
    assert [r["step"] for r in read_rows(out / "metrics.jsonl")] == [1, 2]
    state = json.loads((out / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["optimizer_steps"] == 6
    assert state["unlogged"]["metrics"]["train/optimizer_steps"] == 6.0
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the trainer's handler is gone after train()

    Trainer(cfg).train()  # writes step 3's line first, then trains step 4
    assert_same_history(out, two_updates_reference)
    assert_same_weights(out / "checkpoint-4", two_updates_reference / "checkpoint-4")


def test_an_error_between_optimizer_steps_saves_nothing_and_says_where_resuming_starts(
        data, tiny_policy_dir, tmp_path, two_updates_reference):
    out = tmp_path / "out"
    cfg = make_cfg(data, tiny_policy_dir, out, global_mini_batch_size=2, save_steps=2)
    trainer = Trainer(cfg)

    def fail():
        raise RuntimeError("device lost")

    _signal_or_fail_in_update(trainer, 2, fail)
    with pytest.raises(RuntimeError, match="device lost") as info:
        trainer.train()
    assert info.value.__notes__ == [
        f"RuntimeError at step 2: no checkpoint saved: the error came during the update of step 3, after 1 of its "
        f"optimizer steps changed the weights, so the state after step 2 is gone; re-running the same command "
        f"resumes from {out}/checkpoint-2 (the steps after it are computed again, with the same values)"]
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == ["checkpoint-2"]

    Trainer(cfg).train()
    assert_same_history(out, two_updates_reference)
    assert_same_weights(out / "checkpoint-4", two_updates_reference / "checkpoint-4")


def _digest(directory):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_a_checkpoint_that_cannot_be_written_leaves_the_previous_one_intact(
        data, tiny_policy_dir, tmp_path, two_updates_reference):
    """A file-size limit (RLIMIT_FSIZE, what a full disk does to a write: the OS refuses it) from step 3 on: the
    metrics lines still fit, the model file of checkpoint-4 does not. The run says that saving failed, leaves
    checkpoint-2 byte for byte as it was and no partial directory, and resumes from it."""
    out = tmp_path / "out"
    cfg = make_cfg(data, tiny_policy_dir, out, global_mini_batch_size=2, save_steps=2)
    trainer = Trainer(cfg)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    saved = {}

    def limit_file_size():
        saved.update(_digest(out / "checkpoint-2"))
        resource.setrlimit(resource.RLIMIT_FSIZE, (300_000, hard))  # the model file is ~460 kB

    _signal_or_fail_in_update(trainer, 2, limit_file_size)
    try:
        with pytest.raises(OSError, match="File too large") as info:
            trainer.train()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert info.value.__notes__ == [
        f"OSError at step 4: saving a checkpoint of step 4 failed (OSError: [Errno 27] File too large); the latest "
        f"complete checkpoint is untouched: re-running the same command resumes from {out}/checkpoint-2"]
    assert [r["step"] for r in read_rows(out / "metrics.jsonl")] == [1, 2, 3, 4]
    assert sorted(p.name for p in out.iterdir() if "checkpoint" in p.name) == ["checkpoint-2"]
    assert _digest(out / "checkpoint-2") == saved

    Trainer(cfg).train()  # drops steps 3-4 from metrics.jsonl and computes them again
    assert_same_history(out, two_updates_reference)
    assert_same_weights(out / "checkpoint-4", two_updates_reference / "checkpoint-4")


def test_an_interrupt_raised_inside_a_pylayer_backward_is_still_the_interrupt():
    """The signal handler raises KeyboardInterrupt wherever the main thread is; inside Python code that paddle's
    backward runs (the PyLayer backward of kernels/, e.g. RMSNorm's) paddle hands it back as an OSError. After a
    signal, StepGuard.as_interrupt turns that back into the KeyboardInterrupt (exit 130, a checkpoint); before one,
    an OSError stays an error."""
    import types

    import paddle
    from paddle.autograd import PyLayer

    from paddle_grpo.run.faults import StepGuard

    class SignalInBackward(PyLayer):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, grad):
            # SIGTERM: the guard always handles it (a SIGINT that a background job ignores stays ignored). Python
            # runs the handler at the next bytecode: still in here.
            os.kill(os.getpid(), signal.SIGTERM)
            return grad * 2.0

    learner = types.SimpleNamespace(optimizer=types.SimpleNamespace(step=lambda: None))
    guard = StepGuard(types.SimpleNamespace(learner=learner))
    plain = OSError("a real error")
    assert guard.as_interrupt(plain) is plain
    previous = guard.install()
    try:
        x = paddle.ones([2, 3])
        x.stop_gradient = False
        with pytest.raises(BaseException) as caught:
            SignalInBackward.apply(x).sum().backward()
    finally:
        StepGuard.uninstall(previous)
    assert not isinstance(caught.value, KeyboardInterrupt)  # what paddle raises: the interrupt wrapped
    assert "KeyboardInterrupt" in str(caught.value)
    assert isinstance(guard.as_interrupt(caught.value), KeyboardInterrupt)
