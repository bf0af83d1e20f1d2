"""The `.[peer]` environment (PyTorch, transformers, TRL: /work/shared/peer's make_peer_venv.sh), for tests that
compare with transformers: shared by tests/tools/test_import_gguf.py, test_export_hf.py and test_trl_bench.py."""
import importlib.util
import os
import sys


def peer_python(modules=("torch", "transformers")):
    """The python of the peer environment (PADDLE_GRPO_PEER_PYTHON, or this one when it has every module of
    `modules`), or None."""
    if os.environ.get("PADDLE_GRPO_PEER_PYTHON"):
        return os.environ["PADDLE_GRPO_PEER_PYTHON"]
    if all(importlib.util.find_spec(m) is not None for m in modules):
        return sys.executable
    return None


def transformers_python_or_skip():
    """peer_python() for the tests that compare with transformers (torch and transformers), or skip naming how to
    make that environment (it cannot share this one: setup.py's `.[peer]`)."""
    import pytest

    python = peer_python()
    if python is None:
        pytest.skip("transformers and torch are not installed here: they need their own environment (setup.py's "
                    "`.[peer]`, e.g. python -m venv /work/peer-venv && /work/peer-venv/bin/pip install torch==2.13.0 "
                    "transformers); then set PADDLE_GRPO_PEER_PYTHON=/work/peer-venv/bin/python")
    return python
