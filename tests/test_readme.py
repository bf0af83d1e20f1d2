"""The README's commands are the ones CI runs, and the files they name exist."""
import re


def fenced_commands(text):
    return [line.strip() for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()
            if line.strip() and not line.startswith("#")]


def test_ci_runs_the_readme_install_and_test_commands(repo_root):
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    ci = (repo_root / ".ci" / "run").read_text(encoding="utf-8")
    commands = fenced_commands(readme)
    for command in ("python -m venv .venv && . .venv/bin/activate", 'pip install -e ".[test]"',
                    "python -m pytest", "python run_rl.py configs/quickstart.yaml"):
        assert command in commands, command
    for command in ('python -m venv .venv && . .venv/bin/activate', 'pip install -e ".[test]"',
                    "python -m pytest"):
        assert re.search(rf"^{re.escape(command)}$", ci, re.M), f".ci/run does not run `{command}`"


def test_files_named_in_readme_exist(repo_root):
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    for path in set(re.findall(r"\b((?:configs|docs|tools)/[\w./-]+\.(?:yaml|md|py))", readme)):
        assert (repo_root / path).exists(), path


def test_readme_python_versions_are_setup_pys(repo_root):
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    setup = (repo_root / "setup.py").read_text(encoding="utf-8")
    low, high = re.search(r"Python 3\.(\d+)-3\.(\d+)", readme).groups()
    assert f'python_requires=">=3.{low},<3.{int(high) + 1}"' in setup
