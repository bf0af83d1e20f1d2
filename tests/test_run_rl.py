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
