"""The reward functions, reward models named in reward_funcs (never loaded), or the reward server's /health."""
from __future__ import annotations

from typing import Callable, List, Optional, Tuple

from ..config import Config
from .models import inspect_model


def reward_model_specs(cfg: Config) -> List[Tuple[str, str]]:
    """(label, model name) of the in-process reward models: each `reward_model:<dir or ID>` of reward_funcs and
    reward_model_name_or_path."""
    from ..rewards.reward_model import REWARD_MODEL_PREFIX

    if cfg.use_rm_server:
        return []
    out = [(f"reward_funcs: {r}", r[len(REWARD_MODEL_PREFIX):].strip())
           for r in (x.strip() for x in cfg.reward_funcs.split(",")) if r.startswith(REWARD_MODEL_PREFIX)]
    if cfg.reward_model_name_or_path.strip():
        out.append(("reward_model_name_or_path", cfg.reward_model_name_or_path.strip()))
    return out


def check_rewards(cfg: Config, get: Optional[Callable] = None) -> List[str]:
    """Problems with the reward: each reward server's GET /health (short timeout), or the in-process reward
    functions (resolved by name) and reward models (checked as models: never loaded, never downloaded)."""
    problems = []
    if cfg.use_rm_server:
        import requests

        get = get or requests.get
        headers = {"Authorization": f"Bearer {cfg.reward_server_token}"} if cfg.reward_server_token else {}
        for url in [u.strip().rstrip("/") for u in cfg.reward_server.split(",") if u.strip()]:
            try:
                reply = get(url + "/health", timeout=5, headers=headers)
            except requests.RequestException as e:
                problems.append(f"reward_server: {url}/health cannot be reached: {type(e).__name__}: {e}")
                continue
            if reply.status_code == 404:  # PaddleNLP's own reward server has no /health
                print(f"  reward_server: {url} answers (no /health: a PaddleNLP server?)")
            elif reply.status_code != 200:
                problems.append(f"reward_server: {url}/health answered HTTP {reply.status_code}")
            else:
                print(f"  reward_server: {url}/health: ok")
        return problems
    from ..rewards import get_reward_fn
    from ..rewards.reward_model import REWARD_MODEL_PREFIX

    for name in [r.strip() for r in cfg.reward_funcs.split(",") if r.strip()]:
        if name.startswith(REWARD_MODEL_PREFIX):
            continue  # get_reward_fn would load (or download) the weights: checked below as a model
        try:
            get_reward_fn(name)
        except Exception as e:  # noqa: BLE001  a user's module may raise anything on import
            problems.append(f"reward_funcs: {name!r}: {e}")
    for label, name in reward_model_specs(cfg):
        problems += inspect_model(name, label, labels=1)[0]
    return problems
