"""What a killed or failing run leaves on disk, read back by the next start: run/directory.py, run/checkpoint.py,
parallel/storage.py and parallel/startup.py on real files and real processes (no training here)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from paddle_grpo.run import checkpoint as ckpt
from paddle_grpo.run import directory as run_dir
from paddle_grpo.config import ConfigError, config_from_dict
from paddle_grpo.parallel import choose_resume_step


def _rows(path, steps, cut_last=False):
    lines = [json.dumps({"step": s, "train/reward": s / 10}) + "\n" for s in steps]
    if cut_last:
        lines[-1] = lines[-1][:len(lines[-1]) // 2]
    path.write_text("".join(lines))


def _steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def _checkpoint(out, step, **state):
    d = out / f"checkpoint-{step}"
    d.mkdir(parents=True)
    (d / "trainer_state.json").write_text(json.dumps({"step": step, "full": True, **state}))
    return str(d)


def test_a_last_line_cut_short_is_dropped_and_a_broken_line_before_it_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    _rows(path, [1, 2, 3], cut_last=True)  # killed while writing step 3's line
    assert run_dir.truncate_after(str(path), 5) == 1
    assert _steps(path) == [1, 2] and path.read_text().endswith("\n")
    _rows(path, [1, 2, 3])
    path.write_text(path.read_text().replace('{"step": 2', '{"step: 2'))
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON object .* the file is damaged"):
        run_dir.truncate_after(str(path), 5)


def test_a_checkpoint_with_unlogged_metrics_drops_its_own_step_too(tmp_path):
    """A fault after step 3's update saved checkpoint-3 with the metrics it had not written: the resumed run writes
    step 3's rows first, so whatever of them reached the files before the fault goes."""
    latest = _checkpoint(tmp_path, 3, unlogged={"metrics": {"train/reward": 0.3}, "samples": None})
    _rows(tmp_path / "metrics.jsonl", [1, 2, 3], cut_last=True)
    _rows(tmp_path / "rollouts.jsonl", [1, 2, 3])
    p = run_dir.plan(str(tmp_path), None, False)
    assert p.resume == latest
    run_dir.apply(p, str(tmp_path))
    assert _steps(tmp_path / "metrics.jsonl") == [1, 2] and _steps(tmp_path / "rollouts.jsonl") == [1, 2]


def test_the_same_run_stopped_before_its_first_checkpoint_starts_again(tmp_path):
    cfg = config_from_dict({"output_dir": str(tmp_path), "max_steps": 5})
    (tmp_path / "config.yaml").write_text(cfg.format())
    _rows(tmp_path / "metrics.jsonl", [0, 1])
    (tmp_path / ".tmp-checkpoint-2").mkdir()  # killed while writing its first checkpoint
    p = run_dir.plan(str(tmp_path), None, False, config_text=cfg.format())
    assert p.resume is None and sorted(os.path.basename(x) for x in p.remove) == [
        ".tmp-checkpoint-2", "config.yaml", "metrics.jsonl"]
    assert "stopped before its first checkpoint: starting it again from step 0" in p.reason
    other = config_from_dict({"output_dir": str(tmp_path), "max_steps": 6})  # another run: refused, as before
    with pytest.raises(ConfigError, match="already holds a run"):
        run_dir.plan(str(tmp_path), None, False, config_text=other.format())
    (tmp_path / "summary.json").write_text("{}")  # a run that ended is never started again silently
    with pytest.raises(ConfigError, match="already holds a run"):
        run_dir.plan(str(tmp_path), None, False, config_text=cfg.format())


def test_old_checkpoints_are_renamed_aside_before_deletion_and_leftovers_cleared(tmp_path, tiny_policy_dir):
    from paddle_grpo.policy import load_policy, load_tokenizer

    policy, tokenizer = load_policy(tiny_policy_dir), load_tokenizer(tiny_policy_dir)
    (tmp_path / ".tmp-checkpoint-1.deleting").mkdir()  # a deletion a kill interrupted
    for step in (1, 2, 3):
        ckpt.save_checkpoint(str(tmp_path), step, policy.model, tokenizer, trainer_state={}, full=False,
                             total_limit=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-2", "checkpoint-3"]
    assert ckpt.step_of(str(tmp_path / "checkpoint-3")) == 3


def test_ranks_resume_the_latest_checkpoint_all_of_them_have():
    assert choose_resume_step([(4, [2, 4]), (4, [2, 4])], False) == (4, "")
    assert choose_resume_step([(None, []), (None, [])], False) == (None, "")
    step, warning = choose_resume_step([(4, [2, 4]), (2, [2])], False)  # rank 0 saved checkpoint-4 alone
    assert step == 2 and "rank 0: checkpoint-4; rank 1: checkpoint-2" in warning
    with pytest.raises(ConfigError, match="rank 0: checkpoint-4; rank 1: no checkpoint"):
        choose_resume_step([(4, [4]), (None, [])], False)
    with pytest.raises(ConfigError, match="do not see the same checkpoint"):
        choose_resume_step([(4, [2, 4]), (2, [2])], True)  # resume_from_checkpoint named one: no substitute


# Two "nodes" building one missing policy on a shared file system: each process is local rank 0 of its node and
# loads parallel/startup.py alone (no paddle import), builds with a 3 s build that appends to a log of builds.
BUILDER = textwrap.dedent('''
    import importlib.util, logging, os, sys, time
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    spec = importlib.util.spec_from_file_location("startup", sys.argv[1])
    startup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(startup)

    def build(directory):
        with open(sys.argv[3], "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(3)
        os.makedirs(directory)
        open(os.path.join(directory, "config.json"), "w").close()

    startup.build_once(sys.argv[2], build, "a test recipe", poll_seconds=0.05, log_seconds=0.5)
    print("ready", os.path.isfile(os.path.join(sys.argv[2], "config.json")))
''')


def test_nodes_sharing_a_file_system_build_a_missing_policy_once(tmp_path, repo_root):
    target, builds = tmp_path / "build" / "policy", tmp_path / "builds.log"
    startup = repo_root / "paddle_grpo" / "parallel" / "startup.py"
    env = {**os.environ, "PADDLE_LOCAL_RANK": "0"}
    procs = [subprocess.Popen([sys.executable, "-c", BUILDER, str(startup), str(target), str(builds)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert len(builds.read_text().split()) == 1, outputs  # one build for both "nodes"
    assert all(out.strip().endswith("ready True") for out in outputs)
    text = "".join(outputs)
    assert text.count("does not exist: building it with a test recipe") == 1
    assert "another node is building" in text and "was built meanwhile by another node; using it" in text
    assert sorted(p.name for p in target.parent.iterdir()) == ["policy"]  # no lock file, no temporary left
