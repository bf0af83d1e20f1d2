"""Train a PaddleNLP language model with reinforcement learning: GRPO, REINFORCE++, RLOO, PPO, VAPO, with tools.

    python run_rl.py CONFIG.yaml [--key value ...]
    python run_rl.py CONFIG.yaml [--key value ...] --dry_run    # check everything, print the launch command
    python -m paddle.distributed.launch --devices "0,1,2,3" run_rl.py CONFIG.yaml

CONFIG is a flat YAML/JSON file with PaddleNLP's keys (docs/configuration.md); `--key value` pairs override it.
The configuration is validated before anything heavy is imported; a problem with the configuration, the data, the
model directory or the reward server exits with status 2 and a message that names the file, line or key (the data
files and local model directories are checked first, as --dry_run checks them: dry_run.preflight).
`--dry_run` (paddle_grpo/dry_run/) checks the data, model, reward and parallel layout without training, prints the
keys that have no effect on this device and the launch command, and exits 0 when that launch could start.
"""
import logging
import os
import sys

# How the launch command this script prints names it: as it was started, relative when under the working directory.
SCRIPT = os.path.relpath(__file__) if not os.path.relpath(__file__).startswith("..") else __file__


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from paddle_grpo.config import ConfigError, LayoutError, default_device, parse_args
    from paddle_grpo.dry_run import launch_command, preflight, split_dry_run

    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        dry, argv = split_dry_run(argv)
        cfg = parse_args(argv)
    except ConfigError as e:
        print(f"run_rl.py: configuration error: {e}", file=sys.stderr)
        return 2
    if dry:
        from paddle_grpo.dry_run import dry_run

        return dry_run(cfg, argv, default_device(), SCRIPT)
    missing = preflight(cfg)  # the dry run's file checks: a missing file is named by its key, not by PaddleNLP
    for problem in missing:
        print(f"run_rl.py: error: {problem}", file=sys.stderr)
    if missing:
        return 2
    if os.environ.get("PADDLE_TRAINER_ID", "0") == "0":  # rank 0 under paddle.distributed.launch
        print(f"configuration: the keys that differ from the defaults (all keys: {cfg.output_dir}/config.yaml)")
        print(cfg.format(only_changed=True), end="", flush=True)
    import contextlib

    from tqdm.contrib.logging import logging_redirect_tqdm

    from paddle_grpo import DataError, RewardServerError, TrainingError, train
    from paddle_grpo.environment import ToolServerError
    from paddle_grpo.policy.hf_weights import WeightFormatError
    from paddle_grpo.recipes import policy_builder

    # With progress bars, log lines are printed above the bar, not into it; without, logging stays as it is.
    bars = contextlib.nullcontext() if cfg.disable_tqdm else logging_redirect_tqdm()
    try:
        with bars:
            return train(cfg, policy_builder(cfg))
    except (ConfigError, DataError, FileNotFoundError, RewardServerError, ToolServerError, TrainingError,
            WeightFormatError, NotImplementedError) as e:
        # Problems with the user's setup, data, reward or tool server: say what and where, without a traceback.
        print(f"run_rl.py: error: {e}", file=sys.stderr)
        for note in getattr(e, "__notes__", ()):  # e.g. the checkpoint a fault saved, and how to resume
            print(f"run_rl.py: {note}", file=sys.stderr)
        if isinstance(e, LayoutError):  # started with the wrong number of processes: say how to start it
            print(f"run_rl.py: start it with: {launch_command(cfg, argv, default_device(), SCRIPT)}",
                  file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
