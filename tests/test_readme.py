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


def test_ci_reruns_the_numerics_tests_as_the_readme_and_platform_doc_say(repo_root):
    # .ci/run's one extra command (the tests marked `numerics` again, on other CPU kernels) is the one README's
    # "Run the tests" and docs/platform.md show, and pytest.ini registers the marker.
    ci = (repo_root / ".ci" / "run").read_text(encoding="utf-8")
    reruns = re.findall(r"^(.*python -m pytest -m numerics)$", ci, re.M)
    assert len(reruns) == 1, ".ci/run must rerun the `numerics` tests once"
    assert re.search(r"^rerun=\$\?$", ci, re.M) and re.search(r'^exit "\$rerun"$', ci, re.M), "its status must count"
    section = (repo_root / "README.md").read_text(encoding="utf-8").split("## Run the tests")[1].split("\n## ")[0]
    assert f"`{reruns[0]}`" in section
    assert reruns[0] in fenced_commands((repo_root / "docs" / "platform.md").read_text(encoding="utf-8"))
    assert re.search(r"^    numerics: ", (repo_root / "pytest.ini").read_text(encoding="utf-8"), re.M)


def test_files_named_in_readme_and_docs_exist(repo_root):
    # every configs/, docs/ or tools/ path in the README, and every tools/ path in docs/*.md and data/README.md:
    # tools/ is grouped by job (bench/, data/, models/, eval/), so a script that moves takes its commands along
    def named(doc, folders):
        pattern = rf"(?<![\w./-])((?:{folders})/[\w./-]+\.(?:yaml|md|py|json))(?![\w-])"
        return [(doc.relative_to(repo_root), p) for p in set(re.findall(pattern, doc.read_text(encoding="utf-8")))]
    paths = named(repo_root / "README.md", "configs|docs|tools")
    for doc in [repo_root / "data" / "README.md", *sorted((repo_root / "docs").glob("*.md"))]:
        paths += named(doc, "tools")
    assert len(paths) > 50
    assert sorted(f"{doc}: {p}" for doc, p in paths if not (repo_root / p).exists()) == []


def test_readme_python_versions_are_setup_pys(repo_root):
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    setup = (repo_root / "setup.py").read_text(encoding="utf-8")
    low, high = re.search(r"Python 3\.(\d+)-3\.(\d+)", readme).groups()
    assert f'python_requires=">=3.{low},<3.{int(high) + 1}"' in setup


def test_bring_your_paddlenlp_config_commands_work(repo_root, tiny_policy_dir, serve, capsys, monkeypatch):
    # The section's dry run, with the tiny test model for build/quickstart_policy and a real kk reward server on a
    # free port for the one the section starts on 8731; it passes and prints the launch line the section shows.
    import shlex

    from dry_run_helpers import run_rl_main, thread_prefix
    from reward_server import create_app

    monkeypatch.chdir(repo_root)  # the command's paths are relative to the repository
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Bring your PaddleNLP config")[1].split("\n## ")[0]
    commands = fenced_commands(section)
    assert commands[0] == "python -m reward_server --port 8731 --reward kk &"
    dry = shlex.split(commands[1])
    assert dry[:2] == ["python", "run_rl.py"] and dry[-1] == "--dry_run"
    args = [tiny_policy_dir if a == "build/quickstart_policy" else a for a in dry[2:]]
    url = serve(create_app("kk")).url
    status, out, err = run_rl_main([*args, "--reward_server", url], capsys)
    assert status == 0, out + err
    shown = re.search(r"```text\n(launch: .*) \.\.\.\n```", section).group(1)
    launch = next(line for line in out.splitlines() if line.startswith("launch: "))
    # The launch line repeats the thread variables the test process was started with (dry_run/launch.py reads
    # /proc/self/environ); the README shows it for an environment without them.
    prefix = thread_prefix()
    assert launch.startswith(f"launch: {prefix}")
    launch = "launch: " + launch[len(f"launch: {prefix}"):]
    assert launch.startswith(shown.replace("build/quickstart_policy", tiny_policy_dir))


def test_readme_names_every_key_without_effect_on_any_device(repo_root):
    # PaddleNLP keys accepted but inert everywhere (sequence_parallel is set by the shipped ppo.yaml): the
    # differences a PaddleNLP user reads must name them, not only the dry run's table
    from paddle_grpo.config import DEVICES, FIELDS, key_effect

    inert = [k for k in FIELDS if not any(key_effect(k, d).active for d in DEVICES)]
    assert "sequence_parallel" in inert
    section = (repo_root / "README.md").read_text(encoding="utf-8").split("## Bring your PaddleNLP config")[1]
    section = section.split("\n## ")[0]
    assert [k for k in inert if f"`{k}`" not in section] == []


def test_the_first_screen_says_what_it_is_and_how_to_install_run_and_test(repo_root):
    # a new user's first screen (about 30 lines): the algorithms, a clone, the install, the run and the test commands
    head = "\n".join((repo_root / "README.md").read_text(encoding="utf-8").splitlines()[:30])
    for word in ("GRPO", "REINFORCE++", "PPO", "VAPO", "tools", "git clone"):
        assert word in head, word
    commands = fenced_commands(head + "\n```")
    assert commands[:4] == ["python -m venv .venv && . .venv/bin/activate", 'pip install -e ".[test]"',
                            "python run_rl.py configs/quickstart.yaml", "python -m pytest"]
    setup = (repo_root / "setup.py").read_text(encoding="utf-8")
    description = re.search(r'description="([^"]*)"', setup).group(1)
    assert all(word in description for word in ("GRPO", "PPO", "VAPO", "tools")), description


def test_both_cores_table_shows_the_recorded_runs(repo_root):
    """README's "Both cores" rows are computed from the runs in docs/results (wall time rounded to the second, the
    speed-up per seed against the one-thread run of the same sitting, held-out accuracy at step 300)."""
    import json

    def load(name):
        with open(repo_root / "docs" / "results" / name, encoding="utf-8") as f:
            return json.load(f)["runs"]

    def span(values, fmt):
        return f"{fmt(min(values))}-{fmt(max(values))}"

    def row(runs, base):
        """(wall range, speed-up range, accuracy range) of `runs`, each seed against `base[seed]`'s wall time."""
        return (span([r["wall_s"] for r in runs], lambda v: f"{v:.0f}"),
                span([base[r["seed"]] / r["wall_s"] for r in runs], lambda v: f"{v:.2f}"),
                span([r["eval_accuracy"]["300"] for r in runs], lambda v: f"{v:.3f}"))

    section = (repo_root / "README.md").read_text(encoding="utf-8").split("## Both cores")[1].split("\n## ")[0]
    sittings = load("quickstart_async_seeds.json")
    sync = {r["seed"]: r["wall_s"] for r in sittings if r["mode"] == "sync"}
    wall, _, accuracy = row([r for r in sittings if r["mode"] == "sync"], sync)
    assert f"| one process (the default) | {wall} s | {accuracy} |" in section
    for mode, label in (("async", "asynchronous rollouts"), ("dp2", "2 data-parallel ranks")):
        wall, gain, accuracy = row([r for r in sittings if r["mode"] == mode], sync)
        assert f"| {label} | {wall} s ({gain}x shorter) | {accuracy} |" in section, mode
    threads = load("quickstart_threads.json")
    one = {r["seed"]: r["wall_s"] for r in threads if r["threads"] == 1}
    wall, gain, accuracy = row([r for r in threads if r["threads"] == 2], one)
    assert f"one thread took {span(list(one.values()), lambda v: f'{v:.0f}')} s there) | {wall} s ({gain}x shorter) " \
           f"| {accuracy} |" in section
