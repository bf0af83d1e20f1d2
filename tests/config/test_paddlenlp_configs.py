"""PaddleNLP's own published RL configs (../shared/paddlenlp_configs, 14 files; see its SOURCE.md) pass
`run_rl.py CONFIG --dry_run` with only paths overridden: all 14 (GRPO, REINFORCE++, and the 4 critic files, ppo and
vapo) exit 0 and print the launch command their parallel layout needs. The files are read where they are, never
copied into the repository.

Opt-in (PADDLE_GRPO_SLOW_CONFIGS=1; 2 or 4 gloo processes per file, minutes each on 2 cores): every file's printed
launch command, plus `--max_steps 1 --max_dec_len 32`, trains one step with tiny local models
(`test_published_config_trains_one_step`).
"""
import json
import math
import os
import re
import shlex
import shutil
import sys

import pytest
import yaml

from dry_run_helpers import REPO, run_rl_main, write_train_eval
from paddle_grpo.config import ALIASES, FIELDS
from reward_server import create_app

CONFIGS = REPO.parent / "shared" / "paddlenlp_configs"
FILES = sorted(CONFIGS.glob("*.yaml")) if CONFIGS.is_dir() else []
CRITIC = {"ppo", "vapo"}
# The keys holding paths or hub IDs (what a user of these files changes to run them): each file's own value is
# replaced when it sets one.
MODEL_KEYS = ("actor_model_name_or_path", "critic_model_name_or_path")
SLOW = pytest.mark.skipif(os.environ.get("PADDLE_GRPO_SLOW_CONFIGS") != "1",
                          reason="2-4 gloo processes training one step per published config (minutes each on 2 "
                                 "cores); PADDLE_GRPO_SLOW_CONFIGS=1 runs it")


def _skip_without_configs():
    if not FILES:
        pytest.skip(f"PaddleNLP's published configs not found at {CONFIGS} (only present beside the project's own "
                    "checkout)")


def _raw(path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def _algorithm(path):
    return _raw(path)["rl_algorithm"]


def _line_of(path, key):
    return next(i + 1 for i, text in enumerate(path.read_text(encoding="utf-8").splitlines())
                if text.startswith(f"{key}:"))


def write_gsm8k_data(directory, n=16):
    """train.jsonl and eval.jsonl of `n` GSM8K-style records (the answer after `####`) in `directory`."""
    return write_train_eval(directory, lambda i: {
        "src": f"<|im_start|>user\nWhat is 12 + {i}?<|im_end|>\n<|im_start|>assistant\n",
        "tgt": f"12 + {i} = {12 + i}\n#### {12 + i}"}, n, prefix="gsm8k_")


def write_kk_train_data(directory, n=16):
    """train.jsonl and eval.jsonl of `n` Knights-and-Knaves records whose reference the kk reward reads."""
    return write_train_eval(directory, lambda i: {
        "src": f"<|im_start|>user\nIsland {i}: Zoey says Ethan is a knave. Who is who?<|im_end|>\n"
               "<|im_start|>assistant\n<think>",
        "tgt": "(1) Zoey is a knight\n(2) Ethan is a knave" if i % 2 else
               "(1) Zoey is a knave\n(2) Ethan is a knight"}, n, prefix="kk_")


def path_overrides(path, tmp_path, model_dir, server_url, records=16):
    """The command-line overrides that point `path`'s paths at local things: every model key the file sets at
    `model_dir`; the data at small local files (GSM8K-style for the files that score with PaddleNLP's GSM8K rule
    reward, use_rule_reward, else Knights-and-Knaves), `records` prompts each; the reward server at `server_url`;
    output_dir and logging_dir under `tmp_path`."""
    raw = _raw(path)
    write = write_gsm8k_data if raw.get("use_rule_reward") else write_kk_train_data
    train, evaluation = write(tmp_path, n=records)
    models = [a for key in MODEL_KEYS if raw.get(key) for a in (f"--{key}", model_dir)]
    return [*models, "--train_datasets", train, "--eval_datasets", evaluation, "--reward_server", server_url,
            "--output_dir", tmp_path / "out", "--logging_dir", tmp_path / "vdl"]


@pytest.fixture
def overrides(tmp_path, tiny_policy_dir, serve):
    """path -> its path overrides: tiny local model for every model key, small local data, a real local reward
    server."""
    server = serve(create_app("kk"))
    return lambda path: path_overrides(path, tmp_path, tiny_policy_dir, server.url)


def expected_processes(raw):
    """One process per tensor x pipeline x sharding rank (independent of dry_run's arithmetic)."""
    sharding = raw.get("sharding_parallel_degree", -1) if raw.get("sharding") else 1
    return raw.get("tensor_parallel_degree", 1) * raw.get("pipeline_parallel_degree", 1) * max(sharding, 1)


def test_there_are_ten_grpo_family_and_four_critic_files():
    _skip_without_configs()
    algorithms = [_algorithm(p) for p in FILES]
    assert len(FILES) == 14
    assert sum(a in CRITIC for a in algorithms) == 4


def test_every_key_of_every_published_file_is_known():
    _skip_without_configs()
    unknown = {p.name: [k for k in _raw(p) if k not in FIELDS and k not in ALIASES] for p in FILES}
    assert {name: keys for name, keys in unknown.items() if keys} == {}


@pytest.mark.parametrize("name", [p.name for p in FILES] or ["(none)"])
def test_published_config_passes_the_dry_run(name, overrides, tiny_policy_dir, capsys):
    _skip_without_configs()
    path = CONFIGS / name
    raw = _raw(path)
    args = overrides(path)
    status, out, err = run_rl_main([path, *args, "--dry_run"], capsys)
    assert status == 0, out + err
    assert out.rstrip().endswith("dry run: ok")
    launch = re.search(r"^launch: (.*)$", out, re.M).group(1)
    assert launch.startswith(f'python -m paddle.distributed.launch --devices "" --nproc_per_node '
                             f'{expected_processes(raw)} ')
    assert f" {path} --actor_model_name_or_path " in launch and "--dry_run" not in launch
    # Its keys without effect on a CPU are in the table, with their reasons.
    assert re.search(rf"^  bf16 +true +{re.escape(str(path))}:\d+ +paddle has no bfloat16 matmul kernel on CPU", out, re.M)
    assert f"actor_model_name_or_path: {tiny_policy_dir} (Qwen2Config" in out
    table = out.split("keys set here that have no effect")[1].split("\nprocesses:")[0]
    value_rows = re.search(rf"^  per_device_value_batch_size +\d+ +{re.escape(str(path))}:\d+ +(.*)$", table, re.M)
    if raw["rl_algorithm"] in CRITIC:
        # The critic is checked as a model and said in one line; its keys have their effect.
        assert (f"  critic_model_name_or_path: {tiny_policy_dir} (Qwen2Config, vocabulary 320): a causal LM "
                "(Qwen2ForCausalLM): its backbone with a new value head initialised to zeros (every value starts at "
                "0; the LM head's weights are dropped)\n") in out
        assert value_rows is None and "critic_learning_rate" not in table
        # lr_scheduler_type constant: min_learning_rate (set to the peak rate in these files) does not decay to.
        assert re.search(rf"^  min_learning_rate +\S+ +{re.escape(str(path))}:\d+ +lr_scheduler_type "
                         "'constant' does not decay", table, re.M)
    else:
        assert "critic_model_name_or_path:" not in out
        assert value_rows.group(1).startswith(f"rl_algorithm '{raw['rl_algorithm']}' trains no critic (value model)")
    if raw.get("use_rule_reward"):  # PaddleNLP's GSM8K rule reward, in-process
        assert "\nreward_funcs: gsm8k\n" in out and "reward_funcs: 'gsm8k'" not in err


def test_stage2_and_fused_linear_file_loads_with_one_warning_each(overrides, capsys, caplog):
    _skip_without_configs()
    (path,) = [p for p in FILES if re.search(r"^fused_linear:", p.read_text(encoding="utf-8"), re.M)]
    status, out, err = run_rl_main([path, *overrides(path), "--dry_run"], capsys)
    assert status == 0, out + err
    messages = [r.getMessage() for r in caplog.records if r.name == "paddle_grpo.config"]
    assert sum("sharding 'stage2' runs as stage1" in m for m in messages) == 1
    # fused_linear: False, under its new name, in the table of keys set with no effect on a CPU
    assert re.search(rf"^  use_fused_linear +false +{re.escape(str(path))}:\d+ ", out, re.M)


@pytest.mark.parametrize("name", [p.name for p in FILES if _algorithm(p) in CRITIC] or ["(none)"])
def test_critic_file_with_pipeline_stages_is_refused_naming_the_keys(name, overrides, tiny_policy_dir, capsys):
    # The critic is not built for pipeline stages: the same file with pipeline_parallel_degree 2 stops at load.
    _skip_without_configs()
    path = CONFIGS / name
    status, out, err = run_rl_main([path, *overrides(path), "--pipeline_parallel_degree", "2", "--dry_run"], capsys)
    assert status == 2
    assert err.strip() == (f"run_rl.py: configuration error: command line: key 'pipeline_parallel_degree' = 2: must be "
                           f"1: rl_algorithm '{_algorithm(path)}' trains a critic (value model), and the critic is "
                           "not built for pipeline stages; use tensor_parallel_degree and sharding instead "
                           f"(critic_model_name_or_path {tiny_policy_dir!r})")


@pytest.fixture(scope="module")
def tp4_policy_dir(tmp_path_factory):
    """The tiny policy with 4 key/value heads, so that tensor_parallel_degree 4 (the 32B files) splits them."""
    from conftest import TINY_CORPUS
    from paddle_grpo.recipes.tiny import build_tiny_policy

    path = tmp_path_factory.mktemp("tiny_policy_kv4")
    build_tiny_policy(str(path), TINY_CORPUS, vocab_size=320, seed=0, num_heads=4, num_kv_heads=4)
    return str(path)


@SLOW
@pytest.mark.parametrize("name", [p.name for p in FILES] or ["(none)"])
def test_published_config_trains_one_step(name, tmp_path, tp4_policy_dir, serve, capsys):
    """The launch command the dry run prints (2 or 4 gloo processes), plus `--max_steps 1 --max_dec_len 32`,
    trains one step: metrics.jsonl has step 1 with a reward for every sample, a finite policy loss (none during
    VAPO's pretrain_critic_steps, which update only the critic) and for ppo and vapo the critic's value loss."""
    _skip_without_configs()
    from launch_helpers import run_once

    path = CONFIGS / name
    raw = _raw(path)
    server = serve(create_app("kk"))
    # Enough prompts for one step of the largest global_batch_size (256), and for evaluation.
    args = path_overrides(path, tmp_path, tp4_policy_dir, server.url, records=max(16, raw["global_batch_size"]))
    status, out, err = run_rl_main([path, *args, "--dry_run"], capsys)
    assert status == 0, out + err
    launch = shlex.split(re.search(r"^launch: (.*)$", out, re.M).group(1))
    assert launch[launch.index("--nproc_per_node") + 1] in ("2", "4")
    # The printed command, started from tmp_path (the launcher's log/ goes there): this interpreter, the script by
    # its absolute path.
    script = next(i for i, a in enumerate(launch) if a.endswith("run_rl.py"))
    cmd = [sys.executable, *launch[1:script], str(REPO / "run_rl.py"), *launch[script + 1:],
           "--max_steps", "1", "--max_dec_len", "32"]
    for attempt in (1, 2):
        done = run_once(cmd, tmp_path, timeout=1800)
        # A gloo worker killed by a signal (SIGABRT under an overloaded 2-core machine, as launch_helpers.run
        # retries: the launcher exits -6, status 250) is retried once; a real error fails the second attempt too.
        signalled = "Exit code -" in done.stdout + done.stderr or (done.returncode or 0) >= 128
        if done.returncode == 0 or not signalled or attempt == 2:
            break
        print(f"retrying after a worker died by a signal (status {done.returncode})")
        shutil.rmtree(tmp_path / "out", ignore_errors=True)
    logs = "".join(p.read_text(errors="replace")[-4000:] for p in sorted((tmp_path / "log").glob("workerlog.*")))
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:], logs)
    rows = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if r["step"] == 1 and "train/reward" in r]
    assert row["train/reward_none_frac"] == 0 and math.isfinite(row["train/reward"]), row
    keys = ["train/value_loss"] if raw["rl_algorithm"] in CRITIC else []
    keys += ["train/policy_loss"] if raw.get("pretrain_critic_steps", 0) < 1 else []
    for key in keys:
        assert math.isfinite(row[key]), (key, row)
