"""Recipes on top of the runtime: the quickstart policy, tiny models, Knights-and-Knaves generation, seq2seq build
recipes and data converters. Tools, tests and the command line import them; the runtime core never does (it takes
a recipe's build function as an argument: `Trainer(cfg, build_policy)`)."""
from __future__ import annotations

import sys
from typing import Any, Callable, Optional

# The values of `build_actor_if_missing` that name a recipe (config/model.py offers exactly these; a test checks it).
POLICY_RECIPES = ("quickstart", "quickstart_tools", "smollm2_tools")


def policy_builder(cfg: Any) -> Optional[Callable[[str], None]]:
    """`build(directory)` for the recipe that `cfg.build_actor_if_missing` names; None when it names none."""
    name = cfg.build_actor_if_missing
    if not name:
        return None
    if name not in POLICY_RECIPES:
        raise ValueError(f"build_actor_if_missing: unknown recipe {name!r}; valid: {', '.join(POLICY_RECIPES)}")

    def build(directory: str) -> None:
        from ..config import real_model_name_marks

        marks = real_model_name_marks(directory)
        if marks:  # load_config refuses this already; a Config built directly is not validated
            raise ValueError(f"build_actor_if_missing: {name}: refusing to build the tiny toy policy at "
                             f"'{directory}', whose name looks like a real model's ({', '.join(map(repr, marks))}); "
                             "check actor_model_name_or_path")
        # looked up at build time, so a test can stand in for the slow build
        if name == "quickstart_tools":
            from .quickstart_tools import build_quickstart_tools_policy as builder
        elif name == "smollm2_tools":  # the warm start of the imported SmolLM2: one start for every run seed
            from .smollm2_tools_warm import build_smollm2_tools_policy

            def builder(directory: str, seed: int, progress: bool) -> None:
                build_smollm2_tools_policy(directory, progress=progress)
        else:
            from .quickstart import build_quickstart_policy as builder

        # a bar only on a terminal: in a log file its updates would pile up on one line (log lines instead)
        builder(directory, seed=cfg.seed, progress=not cfg.disable_tqdm and sys.stderr.isatty())

    return build
