"""The CPU shims of paddle_grpo/parallel/cpu_shims.py patch paddle internals: each paddle function they replace or
rely on is pinned (signature and source hash, cpu_shims.PINS) to the paddle they were written against. When paddle
changes under a shim this test fails and names the shim to re-check. One process, no launch."""
import inspect
import re

import paddle
import pytest

from paddle_grpo.parallel import cpu_shims
from paddle_grpo.parallel.cpu_shims import PINS, changed_pins, fingerprint, resolve

SHIMS = ("isolate_gloo_groups", "install_cpu_collectives", "install_cpu_pipeline")


def test_every_shim_is_pinned_and_names_the_paddle_it_targets():
    assert re.fullmatch(r"\d+\.\d+\.\d+", cpu_shims.PADDLE_VERSION)
    pinned = {pin.shim for pin in PINS}
    for name in SHIMS:
        assert name in pinned, f"{name} has no Pin"
        assert f"Targets paddle {cpu_shims.PADDLE_VERSION}" in inspect.getdoc(getattr(cpu_shims, name))
    assert len({pin.target for pin in PINS}) == len(PINS)  # each paddle object pinned once


@pytest.mark.parametrize("pin", PINS, ids=lambda pin: f"{pin.shim}:{pin.target.rsplit('.', 1)[-1]}")
def test_paddle_is_what_the_shims_were_written_against(pin):
    problems = changed_pins((pin,))
    assert not problems, (f"installed paddle {paddle.__version__}, shims written for {cpu_shims.PADDLE_VERSION}: "
                          + "; ".join(problems))


def test_the_replaced_collectives_keep_paddles_signatures():
    """The stand-ins are called with paddle's arguments: same parameter names, in the same order (defaults may
    differ: `op` is ignored, the stand-in always sums)."""
    for name in ("_c_identity", "_mp_allreduce", "_c_concat", "_c_split"):
        ours = list(inspect.signature(getattr(cpu_shims, name)).parameters)
        pin = next(p for p in PINS if p.target.endswith(f":{name}"))
        theirs = [part.split("=")[0].strip() for part in pin.signature.strip("()").split(",")]
        assert ours == theirs, name


def test_a_changed_or_missing_paddle_function_is_reported_with_its_shim(monkeypatch):
    from paddle.distributed.fleet.layers.mpu import mp_ops

    pin = next(p for p in PINS if p.target.endswith(":_c_split"))
    assert changed_pins((pin,)) == []

    def _c_split(tensor, group=None, axis=-1):  # a paddle release that grew an argument
        return tensor

    monkeypatch.setattr(mp_ops, "_c_split", _c_split)
    (problem,) = changed_pins((pin,))
    assert "mp_ops:_c_split changed" in problem and "re-check the shim install_cpu_collectives" in problem
    assert "'(tensor, group=None, axis=-1)'" in problem
    monkeypatch.delattr(mp_ops, "_c_split")
    (problem,) = changed_pins((pin,))
    assert "_c_split is gone" in problem and "install_cpu_collectives" in problem


def test_fingerprints_are_of_the_source():
    def f(x, y=1):
        return x + y

    signature, sha = fingerprint(f)
    assert signature == "(x, y=1)" and re.fullmatch(r"[0-9a-f]{16}", sha)

    def g(x, y=1):
        return x - y

    assert fingerprint(g)[0] == signature and fingerprint(g)[1] != sha  # same signature, other body
    send = resolve("paddle.distributed.communication.send:send")
    assert inspect.isfunction(send) and send.__module__ == "paddle.distributed.communication.send"
    assert inspect.ismodule(resolve("paddle.distributed.fleet.meta_parallel.pp_utils.p2p_communication"))
