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
