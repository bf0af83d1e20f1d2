"""`python run_rl.py CONFIG --dry_run`: check everything a run needs that does not need the run itself.

Checks, each reporting every problem it finds (not only the first): the data files (read as the trainer reads them:
line-numbered errors), the model and tokenizer directories (config.json and the tokenizer files load with PaddleNLP's
Auto classes; the weight files must be there but are never read), the reward functions (a `reward_model:<dir or ID>`
entry like a model: never loaded, never downloaded) or the reward server's `/health`, the critic of a critic run
(rl_algorithm ppo, vapo: critic_model_name_or_path like a model, its config.json only), the tools (`tools`: each
loads, or the tool server's GET /tools answers and serves every named tool; `tool_format` for the tokenizer), the
prompts' token counts
against max_prompt_len (a warning with the numbers: see `check_prompt_lengths`), and the parallel layout against the
processes it implies. Prints the keys that differ from the defaults (the whole resolved configuration goes to a file
it names), a table of the keys the file or command line sets that have no effect on this device (with where and
why), and the exact launch command. Exit status 0 when that launch could start, 2 otherwise.

The key checks (names, types, ranges, combinations) happen before, in `config.load_config`, as for a real run.
`preflight` is the part of these checks that a real run makes at its start (run_rl.py), so that an empty model
directory or a missing data file is reported by its key there too, not by PaddleNLP's loader.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Sequence, Tuple

from ..config import Config, encoder_decoder_refusal, given_keys, group_size_notes, relative_path_note
from .launch import (split_dry_run, model_ranks, required_processes, redact_secrets, THREAD_VARIABLES,
                     started_environment, launch_command, launched_processes, check_layout, visible_gpus)  # noqa: F401
from .keys import keys_without_effect, resolved_config_file  # noqa: F401
# (the modules' tunable constants, MAX_PROCESSES and MAX_LENGTH_CHECKS, are not re-exported: a copy here would not
# change what the checks read; set them on dry_run.launch / dry_run.prompts)
from .prompts import data_files, check_data, prompt_renderer, check_prompt_lengths  # noqa: F401
from .models import STOPS, resolve_model, model_dir_problems, inspect_model, decoder_line, check_model  # noqa: F401
from .rewards import reward_model_specs, check_rewards  # noqa: F401
from .tools import check_tools, sandbox_problems, tool_problems  # noqa: F401
from .critic import (CRITIC_KEY, critic_spec, critic_is_built_actor, critic_dir_problems, check_critic,
                     critic_run_lines)  # noqa: F401
from .asynchronous import async_plan, correction_line, threads_line  # noqa: F401
from .loss import policy_loss_lines  # noqa: F401
from .distillation import TEACHER_KEY, check_teacher, teacher_spec  # noqa: F401


def preflight(cfg: Config) -> List[str]:
    """What a real run checks at its start, before loading anything (run_rl.py; exit 2 with these lines): every
    data file exists (named with its key), and every local model directory holds config.json, tokenizer_config.json
    and its weight files, so that a missing file is reported by its key, not by PaddleNLP's loader; and every
    in-process tool loads (tool_problems). File names only (and, for a critic or tools run, a local policy's
    config.json: an encoder-decoder policy is refused): no weights are read, no hub ID is looked up (the run
    resolves and downloads those itself, with its own message)."""
    from ..policy import hub

    problems = [] if cfg.train_datasets.replace(",", "").strip() else \
        ["train_datasets: is empty; name the JSONL/parquet file(s) to read"]
    problems += [f"{key}: {path}: file not found{relative_path_note(cfg, path)}" for key, path in data_files(cfg)
                 if not os.path.isfile(path)]
    models = [] if cfg.build_actor_if_missing and not os.path.isdir(cfg.actor_model_name_or_path) else \
        [("actor_model_name_or_path", cfg.actor_model_name_or_path)]
    for key, name in models + reward_model_specs(cfg) + critic_spec(cfg) + teacher_spec(cfg):
        if os.path.isdir(name):
            problems += (critic_dir_problems if key == CRITIC_KEY else model_dir_problems)(name, key)
        elif not hub.looks_like_hub_id(name):
            problems.append(f"{key}: '{name}' is not a local model directory{relative_path_note(cfg, name)} (nor "
                            "a hub ID such as 'Qwen/Qwen2.5-1.5B-Instruct'); point it at a directory written by "
                            f"save_pretrained{hub.made_by_note(name)}")
    problems += tool_problems(cfg)  # a misspelt tool is named now, not after the model has loaded
    actor = cfg.actor_model_name_or_path
    if (cfg.needs_critic or cfg.tools) and os.path.isfile(os.path.join(actor, "config.json")):  # hub ID: trainer
        with open(os.path.join(actor, "config.json"), encoding="utf-8") as f:
            refusal = encoder_decoder_refusal(cfg, bool(json.load(f).get("is_encoder_decoder", False)))
        problems += [refusal] if refusal else []
    return problems


def dry_run(cfg: Config, argv: Sequence[str], device: str, script: str = "run_rl.py") -> int:
    """Run every check for `cfg` (loaded from `argv`: config file + overrides) on `device` ("cpu"/"gpu"), print
    the keys that differ from the defaults, the keys set without effect, the warnings and the launch command; 0 when
    that launch could start, else 2."""
    print(f"configuration: the keys that differ from the defaults (all keys, resolved: {resolved_config_file(cfg)}; "
          f"a run writes them to {os.path.join(cfg.output_dir, 'config.yaml')})")
    print(cfg.format(only_changed=True), end="")
    print("\nchecks:")
    records: Dict[Tuple[str, str], list] = {}
    problems = check_data(cfg, records)
    # rollout_n 1 under a group estimator: the run trains, on other advantages than the estimator's name says
    warnings: List[str] = group_size_notes(cfg, given_keys(cfg))
    tokenizer = config = None
    if cfg.build_actor_if_missing and not os.path.isdir(cfg.actor_model_name_or_path):
        print(f"  actor_model_name_or_path: '{cfg.actor_model_name_or_path}' will be built first by the "
              f"'{cfg.build_actor_if_missing}' recipe (prompt lengths not checked: its tokenizer is built with it)")
    else:
        model_problems, config, tokenizer = inspect_model(cfg.actor_model_name_or_path, "actor_model_name_or_path",
                                                          cfg=cfg)
        problems += model_problems
        if config is not None:  # the LM head the run will use (chunked or full logits), as the run says it
            print(f"  {cfg.lm_head_decision(int(config.vocab_size))[1]}")
            for part in (decoder_line(cfg, config) or "").splitlines():
                print(f"  {part}")
                problems += [part] if part.startswith(STOPS) else []
            refusal = encoder_decoder_refusal(cfg, bool(getattr(config, "is_encoder_decoder", False)))
            problems += [refusal] if refusal else []
        if tokenizer is not None and records:
            warnings += check_prompt_lengths(cfg, tokenizer, config, records)
    problems += check_critic(cfg, len(tokenizer) if tokenizer is not None else None)
    teacher_lines, teacher_problems = check_teacher(cfg, getattr(config, "vocab_size", None))
    problems += teacher_problems
    critic_lines, critic_warnings, critic_problems = critic_run_lines(cfg)  # ppo / vapo keys, resolved
    print("".join(f"  {line}\n" for line in policy_loss_lines(cfg) + critic_lines + teacher_lines), end="")
    warnings, problems = warnings + critic_warnings, problems + critic_problems
    problems += check_rewards(cfg)
    problems += check_tools(cfg, tokenizer)
    launched = launched_processes()
    layout_problems, n = check_layout(cfg, launched)
    problems += layout_problems
    async_lines, async_problems = async_plan(cfg, n)
    print("".join(f"  {line}\n" for line in async_lines), end="")
    problems += async_problems
    if device == "gpu" and visible_gpus() < n:
        problems.append(f"the layout needs {n} GPUs; {visible_gpus()} are visible")
    rows = keys_without_effect(cfg, device)
    print(f"\nkeys set here that have no effect on this device ({device}): {len(rows) or 'none'}")
    key_width = max((len(k) for k, _, _, _ in rows), default=0)
    where_width = max((len(w) for _, _, w, _ in rows), default=0)
    for key, value, where, reason in rows:
        value = value if len(value) <= 24 else value[:21] + "..."  # the amp lists: one line per key
        print(f"  {key:<{key_width}}  {value:<12}  {where:<{where_width}}  {reason}")
    model = cfg.tensor_parallel_degree * cfg.pipeline_parallel_degree
    print(f"\nprocesses: {n} = tensor_parallel_degree {cfg.tensor_parallel_degree} x pipeline_parallel_degree "
          f"{cfg.pipeline_parallel_degree} x data/sharding ranks {n // model}"
          + (" (this dry run's own paddle.distributed.launch)" if launched is not None else ""))
    print(f"launch: {launch_command(cfg, argv, device, script)}")
    if warnings:
        print(f"\nwarning{'s' if len(warnings) > 1 else ''} (the launch can start, but check these):")
        for w in warnings:
            print(f"  ! {w}")
    if problems:
        print(f"\ndry run: {len(problems)} problem(s); the launch would not start:")
        for p in problems:
            print(f"  - {p}")
        return 2
    print(f"\ndry run: ok, with {len(warnings)} warning(s) above" if warnings else "\ndry run: ok")
    return 0
