"""LoggingArguments: output and logging directories, VisualDL, metrics.jsonl."""
from __future__ import annotations

from dataclasses import dataclass

from .fields import REPORT_TO, arg, nowhere


@dataclass
class LoggingArguments:
    output_dir: str = arg("output", "Checkpoints, metrics.jsonl, rollout samples, config.yaml and summary.json go "
                                    "here. When it already holds a run, the run resumes from its latest "
                                    "checkpoint (as in PaddleNLP); without a checkpoint it is refused unless "
                                    "overwrite_output_dir.")
    overwrite_output_dir: bool = arg(False, "Delete a previous run in output_dir (metrics, samples, checkpoints, "
                                            "its VisualDL record) and train from scratch instead of resuming it.")
    logging_dir: str = arg("vdl_log", "VisualDL log directory. One inside the file's output_dir follows an "
                                      "output_dir given on the command line (`--output_dir X` turns the file's "
                                      "`output/quickstart/vdl_log` into `X/vdl_log`), unless logging_dir is given "
                                      "there too. A run whose logging_dir already holds another run's VisualDL "
                                      "record (VisualDL shows one record per folder) writes its own into the "
                                      "subfolder `<output_dir name>-<hash>`, with a warning; a resumed run finds its "
                                      "record again. PaddleNLP's default is `<output_dir>/runs/<date>_<host>`, a new "
                                      "folder at every start; here a resume rebuilds one record per run.")
    logging_steps: int = arg(1, "Log sample completions every this many steps.")
    report_to: str = arg("visualdl", "visualdl, all, wandb or tensorboard (all three: VisualDL here, with a "
                                     "one-line warning for wandb/tensorboard) or none.", choices=REPORT_TO)
    wandb_http_proxy: str = arg("", "HTTP proxy for wandb.", **nowhere("wandb is not used; metrics go to VisualDL "
                                                                       "and metrics.jsonl"))
    run_name: str = arg("", "Experiment name, used as the VisualDL run name.")
