"""run_rl.py with one fault injected at an exact point, for tests/run/test_faults_e2e.py:

    faulty_run_rl.py FAULT CONFIG [--key value ...]

FAULT is `KIND:STEP`:
- `kill-metrics:N`     SIGKILL in the middle of writing step N's line of metrics.jsonl (half of it written);
- `kill-checkpoint:N`  SIGKILL in the middle of writing checkpoint-N's trainer_state.json (the last file);
- `enospc-metrics:N`   writing step N's metrics line fails with "No space left on device" after half of it;
- `enospc-all:N`       the same, and from then on every file a checkpoint writes itself fails the same way.

Everything else is the real run_rl.py: the fault replaces the built-in `open` of paddle_grpo.logging and
paddle_grpo.run.checkpoint (the modules that write metrics and checkpoints) by one that passes every other write through.
Random-time kills need no worker: the test sends SIGKILL itself."""
import errno
import os
import signal
import sys

import run_rl

from paddle_grpo import logging as metrics_logging
from paddle_grpo.run import checkpoint

kind, step = sys.argv[1].split(":")
step = int(step)
state = {"disk_full": False}


def fault(handle):
    handle.flush()
    if kind.startswith("kill"):
        os.kill(os.getpid(), signal.SIGKILL)
    state["disk_full"] = kind == "enospc-all"
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class Faulty:
    """A file whose first write is cut in half by the fault."""

    def __init__(self, handle):
        self.handle = handle

    def write(self, text):
        self.handle.write(text[:len(text) // 2])
        fault(self.handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.handle.close()

    def __getattr__(self, name):
        return getattr(self.handle, name)


class MetricsFile(Faulty):
    """metrics.jsonl whose line of the faulty step is cut in half by the fault; other lines are written whole."""

    def write(self, text):
        if text.startswith('{"step": %d,' % step):
            return super().write(text)
        return self.handle.write(text)


def logging_open(path, *args, **kwargs):
    handle = open(path, *args, **kwargs)
    return MetricsFile(handle) if os.path.basename(path) == "metrics.jsonl" else handle


def checkpoint_open(path, *args, **kwargs):
    handle = open(path, *args, **kwargs)
    if state["disk_full"] or (kind == "kill-checkpoint" and path.endswith(
            os.path.join(f".tmp-checkpoint-{step}", checkpoint.STATE_FILE))):
        return Faulty(handle)
    return handle


if kind in ("kill-metrics", "enospc-metrics", "enospc-all"):
    metrics_logging.open = logging_open
elif kind != "kill-checkpoint":
    raise SystemExit(f"unknown fault {sys.argv[1]!r}")
checkpoint.open = checkpoint_open
sys.exit(run_rl.main(sys.argv[2:]))
