"""PaddleNLP's own published RL configs (../shared/paddlenlp_configs, 14 files; see its SOURCE.md) pass
`run_rl.py CONFIG --dry_run` with only paths overridden: the 10 GRPO / REINFORCE++ files exit 0 and print the
launch command their parallel layout needs; the 4 critic files (ppo, vapo) exit 2 with one message naming
rl_algorithm. The files are read where they are, never copied into the repository."""
import pathlib
import re

import pytest
import yaml

from dry_run_helpers import REPO, run_rl_main, write_kk_data
from paddle_grpo.config import ALIASES, FIELDS
from reward_server import create_app

CONFIGS = REPO.parent / "shared" / "paddlenlp_configs"
FILES = sorted(CONFIGS.glob("*.yaml")) if CONFIGS.is_dir() else []
CRITIC = {"ppo", "vapo"}
SUPPORTED = "grpo, reinforce_plus_plus, reinforce_plus_plus_baseline, rloo"


def _skip_without_configs():
    if not FILES:
        pytest.skip(f"PaddleNLP's published configs not found at {CONFIGS} (only present beside the project's own "
                    "checkout)")


def _algorithm(path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))["rl_algorithm"]


@pytest.fixture
def overrides(tmp_path, tiny_policy_dir, serve):
    """The path overrides: tiny local model for every model key, small local data, a real local reward server."""
    train, evaluation = write_kk_data(tmp_path)
    server = serve(create_app("kk"))
    return ["--actor_model_name_or_path", tiny_policy_dir, "--train_datasets", train, "--eval_datasets",
            evaluation, "--reward_server", server.url, "--output_dir", tmp_path / "out",
            "--logging_dir", tmp_path / "vdl"]


def test_there_are_ten_grpo_family_and_four_critic_files():
    _skip_without_configs()
    algorithms = [_algorithm(p) for p in FILES]
    assert len(FILES) == 14
    assert sum(a in CRITIC for a in algorithms) == 4


def test_every_key_of_every_published_file_is_known():
    _skip_without_configs()
    unknown = {p.name: [k for k in yaml.safe_load(p.read_text(encoding="utf-8")) if k not in FIELDS and k not in
                        ALIASES] for p in FILES}
    assert {name: keys for name, keys in unknown.items() if keys} == {}


@pytest.mark.parametrize("name", [p.name for p in FILES if _algorithm(p) not in CRITIC] or ["(none)"])
def test_grpo_family_config_passes_the_dry_run(name, overrides, capsys):
    _skip_without_configs()
    path = CONFIGS / name
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    status, out, err = run_rl_main([path, *overrides, "--dry_run"], capsys)
    assert status == 0, out + err
    assert out.rstrip().endswith("dry run: ok")
    # The launch command: one process per tensor x pipeline x sharding rank (independent of dry_run's arithmetic).
    sharding = raw.get("sharding_parallel_degree", -1) if raw.get("sharding") else 1
    n = raw.get("tensor_parallel_degree", 1) * raw.get("pipeline_parallel_degree", 1) * max(sharding, 1)
    launch = re.search(r"^launch: (.*)$", out, re.M).group(1)
    assert launch.startswith(f'python -m paddle.distributed.launch --devices "" --nproc_per_node {n} ')
    assert f" {path} --actor_model_name_or_path " in launch and "--dry_run" not in launch
    # Its keys without effect on a CPU are in the table, with their reasons.
    assert re.search(rf"^  bf16 +true +{re.escape(str(path))}:\d+ +paddle has no bfloat16 matmul kernel on CPU", out, re.M)
    assert f"actor_model_name_or_path: {overrides[1]} (Qwen2Config" in out


@pytest.mark.parametrize("name", [p.name for p in FILES if _algorithm(p) in CRITIC] or ["(none)"])
def test_critic_config_is_refused_by_rl_algorithm(name, overrides, capsys):
    _skip_without_configs()
    path = CONFIGS / name
    algorithm = _algorithm(path)
    status, out, err = run_rl_main([path, *overrides, "--dry_run"], capsys)
    assert status == 2
    line = next(i + 1 for i, text in enumerate(path.read_text(encoding="utf-8").splitlines())
                if text.startswith("rl_algorithm:"))
    assert err.strip() == (f"run_rl.py: configuration error: {path}:{line}: key 'rl_algorithm' = '{algorithm}': is "
                           f"not supported: needs a critic (value model), which paddle_grpo does not have; the "
                           f"supported algorithms are {SUPPORTED}")


def test_stage2_and_fused_linear_file_loads_with_one_warning_each(overrides, capsys, caplog):
    _skip_without_configs()
    (path,) = [p for p in FILES if re.search(r"^fused_linear:", p.read_text(encoding="utf-8"), re.M)]
    status, out, err = run_rl_main([path, *overrides, "--dry_run"], capsys)
    assert status == 0, out + err
    messages = [r.getMessage() for r in caplog.records if r.name == "paddle_grpo.config"]
    assert sum("sharding 'stage2' runs as stage1" in m for m in messages) == 1
    # fused_linear: False, under its new name, in the table of keys set with no effect on a CPU
    assert re.search(rf"^  use_fused_linear +false +{re.escape(str(path))}:\d+ ", out, re.M)
