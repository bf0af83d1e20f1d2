"""A real run (run_rl.py without --dry_run) checks at its start what the dry run checks about files, so that a
missing model file or data file is reported by its key (newcomer finding 2), not by PaddleNLP's loader
("please make sure one of the ['tokenizer_config.json'] under the dir ..."). Real directories and files; run_rl.py's
main in this process (it stops at the check, before any model is loaded)."""
import shutil

import pytest

from dry_run_helpers import run_rl_main, write_kk_data


@pytest.fixture
def base(tmp_path, tiny_policy_dir):
    train, evaluation = write_kk_data(tmp_path)
    return ["--actor_model_name_or_path", tiny_policy_dir, "--train_datasets", train, "--eval_datasets", evaluation,
            "--do_eval", "true", "--use_rm_server", "false", "--reward_funcs", "kk", "--global_batch_size", "2",
            "--rollout_n", "2", "--per_device_train_batch_size", "2", "--max_dec_len", "8", "--min_dec_len", "1", "--max_prompt_len", "64",
            "--max_steps", "1", "--report_to", "none", "--disable_tqdm", "true", "--output_dir", tmp_path / "out"]


def errors(err):
    return [line for line in err.splitlines() if line.startswith("run_rl.py: error: ")]


def test_an_empty_model_directory_names_the_key_and_what_is_missing(base, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    status, _, err = run_rl_main([*base, "--actor_model_name_or_path", tmp_path / "empty"], capsys)
    assert status == 2
    assert errors(err) == [
        f"run_rl.py: error: actor_model_name_or_path: '{tmp_path / 'empty'}' is not a whole model directory (as "
        "save_pretrained writes it): it lacks config.json, tokenizer_config.json, model.safetensors.index.json or "
        "model_state.pdparams.index.json or model.safetensors or model_state.pdparams (it holds nothing)"]
    assert not (tmp_path / "out").exists()  # stopped before the run started


def test_a_partial_model_directory_names_the_missing_file(base, tmp_path, tiny_policy_dir, tiny_reward_model_dir,
                                                          capsys):
    policy, rm = tmp_path / "policy", tmp_path / "rm"
    shutil.copytree(tiny_policy_dir, policy)
    shutil.copytree(tiny_reward_model_dir, rm)
    (policy / "tokenizer_config.json").unlink()
    (rm / "config.json").unlink()
    status, _, err = run_rl_main([*base, "--actor_model_name_or_path", policy, "--reward_funcs",
                                  f"kk,reward_model:{rm}"], capsys)
    assert status == 2
    lines = errors(err)
    assert len(lines) == 2, err
    assert lines[0].startswith(f"run_rl.py: error: actor_model_name_or_path: '{policy}' is not a whole model "
                               "directory (as save_pretrained writes it): it lacks tokenizer_config.json (it holds ")
    assert lines[1].startswith(f"run_rl.py: error: reward_funcs: reward_model:{rm}: '{rm}' is not a whole model "
                               "directory (as save_pretrained writes it): it lacks config.json (it holds ")


@pytest.mark.parametrize("key", ["train_datasets", "eval_datasets"])
def test_a_missing_data_file_names_its_key_and_path(base, tmp_path, key, capsys):
    missing = tmp_path / "no_such.jsonl"
    status, _, err = run_rl_main([*base, f"--{key}", f"{tmp_path / 'train.jsonl'},{missing}"], capsys)
    assert status == 2
    assert errors(err) == [f"run_rl.py: error: {key}: {missing}: file not found"]
    assert not (tmp_path / "out").exists()


def test_an_empty_train_datasets_names_its_key(base, capsys):
    status, _, err = run_rl_main([*base, "--train_datasets", " , "], capsys)
    assert status == 2
    assert errors(err) == ["run_rl.py: error: train_datasets: is empty; name the JSONL/parquet file(s) to read"]
