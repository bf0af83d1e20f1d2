"""ModelArguments: the policy (actor) model and tokenizer, and how they are loaded."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .fields import arg


@dataclass
class ModelArguments:
    actor_model_name_or_path: str = arg("", "Policy (actor) model and tokenizer: a local directory, or a hub ID "
                                            "(Qwen/Qwen2.5-1.5B-Instruct) found in PaddleNLP's cache under "
                                            "PPNLP_HOME or downloaded when online (docs/models.md); the "
                                            "reference model is a frozen copy of it.")
    build_actor_if_missing: str = arg("", "(new) When actor_model_name_or_path does not exist yet, build it with this "
                                          "recipe first (quickstart: the embedded default's tiny policy, made "
                                          "locally in a few minutes; quickstart_tools: the tool quickstart's). "
                                          "Empty: the directory must exist.",
                                      choices=("", "quickstart", "quickstart_tools", "smollm2_tools"))
    reward_model_name_or_path: str = arg("", "Directory (or hub ID) of a sequence-scoring reward model (one label, e.g. "
                                             "Qwen2ForSequenceClassification) scoring prompt + completion in-process "
                                             "(use_rm_server: false), after reward_funcs; its weight is the last "
                                             "of reward_weights. A reward server hosts one with "
                                             "`python -m reward_server --reward-model DIR`.")
    use_rm_server: bool = arg(True, "Score completions through the reward server at `reward_server`; false scores "
                                    "them in-process with `reward_funcs`.")
    reward_server: str = arg("http://127.0.0.1:8731", "Reward server URL; several comma-separated URLs spread the "
                                                      "requests across servers.")
    reward_funcs: str = arg("", "(new) Comma-separated reward functions for in-process scoring "
                                "(`use_rm_server: false`): built-in names (kk, gsm8k, tag_format, rouge_l, ...), "
                                "`module:function` or `path/file.py:function`.")
    reward_weights: Optional[List[float]] = arg(None, "(new) One weight per reward function (default 1.0 each); "
                                                      "the total is the weighted sum.")
    reward_server_token: str = arg("", "(new) Bearer token sent to the reward server (empty: none). Left out of the "
                                       "file and the command line: `$REWARD_SERVER_TOKEN` when it is set and not "
                                       "empty (the variable the server reads too); an explicit empty value means no "
                                       "token even then. Prefer the variable or a config file only you can read "
                                       "(mode 600) to the command line, which `ps` shows. Printed and written out as "
                                       "'***'.")
    reward_server_timeout: float = arg(60.0, "(new) Seconds one reward-server request's whole reply may take once "
                                             "it is sent (a silent or a trickled reply ends there; retried as a "
                                             "timeout).")
    reward_server_max_retries: int = arg(-1, "(new) At most this many retries of a failed reward-server request "
                                             "(connection error, timeout, 5xx, 408, 429), with capped exponential "
                                             "backoff; -1: no limit on the count, reward_server_max_wait_s ends "
                                             "them. Whichever ends first stops the run (a checkpoint is saved).")
    reward_server_max_wait_s: float = arg(600.0, "(new) How long the trainer keeps retrying a batch the reward "
                                                 "server(s) fail, in seconds from its first failure: a server that "
                                                 "restarts within it costs time, not the run; every wait is logged. "
                                                 "The tool server (tool_server) gets the same budget. 0: no retries.")
    reward_timeout_s: float = arg(300.0, "(new) Time limit in seconds per call of an in-process reward function "
                                         "(use_rm_server: false; also a reward_model_name_or_path model's call on a "
                                         "batch): a sample whose call runs over it gets reward None with the "
                                         "reason, as when the function fails (train/reward_none_frac). 0: no "
                                         "limit. Raise it for a large reward model on a slow device.")
    use_rule_reward: bool = arg(False, "PaddleNLP's built-in rule reward (GSM8K) of its PPO configs: true scores "
                                       "completions in-process with the gsm8k reward function "
                                       "(paddle_grpo/rewards/gsm8k.py), as `reward_funcs: gsm8k` does (the start-up "
                                       "log says so). It needs use_rm_server: false (PaddleNLP's own note) and "
                                       "reward_funcs empty or gsm8k.")
