"""Two "nodes" on one machine (two `paddle.distributed.launch --nnodes 2` commands, one process each, one file
system): the missing policy is built once, not once per node, and every checkpoint is written once."""
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from launch_helpers import read_metrics, run_once, write_config


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.e2e
def test_two_nodes_on_one_file_system_build_the_policy_once_and_write_checkpoints_once(
        tmp_path, tiny_policy_dir, repo_root):
    policy = tmp_path / "build" / "policy"  # missing: build_actor_if_missing builds it (8 s stand-in build)
    cfg = write_config(tmp_path, str(policy), "grpo")
    port = _free_port()
    worker = repo_root / "tests" / "workers" / "slow_build_run_rl.py"

    def node(rank):
        return run_once([sys.executable, "-m", "paddle.distributed.launch", "--master", f"127.0.0.1:{port}",
                         "--nnodes", "2", "--rank", str(rank), "--devices", "", "--nproc_per_node", "1",
                         "--log_dir", str(tmp_path / f"log{rank}"), str(worker), tiny_policy_dir, "8", str(cfg),
                         "--build_actor_if_missing", "quickstart", "--output_dir", str(tmp_path / "out"),
                         "--save_steps", "1", "--save_on_each_node", "true"], tmp_path, timeout=300)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(node, (0, 1)))
    logs = [(tmp_path / f"log{rank}" / "workerlog.0").read_text() for rank in (0, 1)]
    for r, log in zip(results, logs):
        assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:], log[-3000:])
    text = "".join(logs)
    assert text.count("does not exist: building it with the 'quickstart' recipe") == 1, text[-4000:]
    assert "another node is building" in text and "was built meanwhile by another node; using it" in text
    assert sorted(p.name for p in policy.parent.iterdir()) == ["policy"]  # no lock file, no temporary left
    # One file system: written once (by global rank 0), and save_on_each_node says it has no effect.
    for step in (1, 2):
        assert text.count(f"saved {tmp_path / 'out'}/checkpoint-{step}") == 1
        assert (tmp_path / "out" / f"checkpoint-{step}" / "trainer_state.json").is_file()
    assert "save_on_each_node: true has no effect" in logs[0]
    assert sorted(read_metrics(tmp_path / "out")) == [1, 2]
