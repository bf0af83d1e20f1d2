"""run_rl.py with a slow stand-in for the quickstart build, for tests/parallel/test_distributed.py:

    slow_build_run_rl.py SOURCE_POLICY SECONDS CONFIG [--key value ...]

`build_actor_if_missing: quickstart` then "builds" the policy by waiting SECONDS and copying SOURCE_POLICY: the
real SFT takes a minute, this keeps the length that matters (longer than gloo's 30 s collective timeout) without
the minute of CPU."""
import shutil
import sys
import time

import run_rl

from paddle_grpo.recipes import quickstart

source, seconds = sys.argv[1], float(sys.argv[2])


def slow_build(out_dir, seed=0, **_):
    time.sleep(seconds)
    shutil.copytree(source, out_dir)


quickstart.build_quickstart_policy = slow_build  # the trainer imports it from the module at build time
sys.exit(run_rl.main(sys.argv[3:]))
