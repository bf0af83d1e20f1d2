"""Train a PaddleNLP language model with GRPO / REINFORCE++.

    python run_rl.py CONFIG.yaml [--key value ...]
    python -m paddle.distributed.launch --devices "0,1,2,3" run_rl.py CONFIG.yaml

CONFIG is a flat YAML/JSON file with PaddleNLP's keys (docs/configuration.md); `--key value` pairs override it.
The configuration is validated before anything heavy is imported; a problem exits with status 2 and a message that
names the file, line and key.
"""
import importlib.util
import logging
import sys


def main(argv=None):
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from paddle_grpo.config import ConfigError, parse_args

    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        cfg = parse_args(argv)
    except ConfigError as e:
        print(f"run_rl.py: configuration error: {e}", file=sys.stderr)
        return 2
    print(cfg.format(), end="")
    if importlib.util.find_spec("paddle_grpo.trainer") is None:
        print("run_rl.py: the configuration is valid, but training is not yet available in this version of "
              "paddle_grpo (the trainer is being built; see the README's status section).")
        return 0
    from paddle_grpo.trainer import train
    return train(cfg)


if __name__ == "__main__":
    sys.exit(main())
