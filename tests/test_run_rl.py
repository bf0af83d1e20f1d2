"""run_rl.py's command line: configuration and setup problems end with status 2 and one clear line."""
import subprocess
import sys


def run(repo_root, *args, cwd):
    return subprocess.run([sys.executable, str(repo_root / "run_rl.py"), *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, timeout=300)


def test_bad_key_is_reported_before_anything_heavy(repo_root, tmp_path):
    (tmp_path / "c.yaml").write_text("rl_algorithm: grpo\nlearning_rat: 1e-6\n")
    out = run(repo_root, tmp_path / "c.yaml", cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().endswith(f"{tmp_path / 'c.yaml'}:2: unknown key 'learning_rat' (did you mean "
                                       "'learning_rate'?)")


def test_missing_model_directory_is_one_line_not_a_traceback(repo_root, tmp_path):
    (tmp_path / "train.jsonl").write_text('{"src": "q", "tgt": "a"}\n')
    out = run(repo_root, "--actor_model_name_or_path", tmp_path / "nope", "--use_rm_server", "false",
              "--reward_funcs", "kk", "--train_datasets", tmp_path / "train.jsonl", "--output_dir", tmp_path / "o",
              cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "Traceback" not in out.stderr
    assert f"run_rl.py: error: actor_model_name_or_path: '{tmp_path / 'nope'}' is not a local model directory" \
        in out.stderr


def test_help(repo_root, tmp_path):
    out = run(repo_root, "--help", cwd=tmp_path)
    assert out.returncode == 0 and "python run_rl.py CONFIG.yaml" in out.stdout
    assert all(name in out.stdout.splitlines()[0] for name in ("GRPO", "REINFORCE++", "PPO", "VAPO", "tools"))


def test_a_relative_path_not_found_names_the_working_directory_and_the_files_directory(repo_root, tmp_path):
    # paths in a config resolve against the working directory, as in PaddleNLP; a path that exists relative to
    # the config file instead is named, with why it was not used
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "train.jsonl").write_text('{"src": "q", "tgt": "a"}\n')
    (conf / "c.yaml").write_text("use_rm_server: false\nreward_funcs: kk\ntrain_datasets: train.jsonl\n"
                                 "actor_model_name_or_path: ./my_model\n")
    out = run(repo_root, conf / "c.yaml", cwd=tmp_path)
    assert out.returncode == 2, out.stderr[-2000:]
    assert (f"run_rl.py: error: train_datasets: train.jsonl: file not found (relative to the working directory "
            f"{tmp_path}; {conf / 'train.jsonl'} exists: paths in a config resolve against the working directory, "
            f"as in PaddleNLP, not against the file's directory: start the run from {conf} or give that path)"
            ) in out.stderr
    assert (f"run_rl.py: error: actor_model_name_or_path: './my_model' is not a local model directory (relative to "
            f"the working directory {tmp_path}) (nor a hub ID") in out.stderr
