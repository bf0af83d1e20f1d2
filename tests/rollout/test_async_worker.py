"""rollout/async_worker.py without a model: the versioned weight files (atomic, bit for bit, pruned), where the
private directory goes, and a child process's CPU time."""
import os
import tempfile

import numpy as np

from paddle_grpo.rollout.async_worker import WeightStore, process_cpu_s


def test_weight_store_round_trip_prune_and_copies(tmp_path):
    store = WeightStore(str(tmp_path / "w"))
    rng = np.random.default_rng(0)
    versions = {v: {"a.weight": rng.standard_normal((3, 4)).astype(np.float32), "b": np.arange(5)} for v in range(4)}
    for v, arrays in versions.items():
        store.publish(v, arrays)
    assert store.versions() == [0, 1, 2, 3] and not [n for n in os.listdir(store.directory) if n.startswith(".tmp")]
    loaded = store.load(2)
    assert sorted(loaded) == ["a.weight", "b"]
    assert all(np.array_equal(loaded[k], versions[2][k]) and loaded[k].dtype == versions[2][k].dtype for k in loaded)
    store.prune(2)
    assert store.versions() == [2, 3] and not store.has(1)
    store.copy_out([2, 3], str(tmp_path / "ckpt"))
    other = WeightStore(str(tmp_path / "other"))
    other.copy_in(str(tmp_path / "ckpt"), [3])
    assert other.versions() == [3] and np.array_equal(other.load(3)["a.weight"], versions[3]["a.weight"])
    waited = other.wait(3, alive=lambda: True)
    assert 0 <= waited < 1


def test_private_store_leaves_a_small_dev_shm_for_the_temporary_directory():
    small = WeightStore.private(needed_bytes=0)
    huge = WeightStore.private(needed_bytes=1 << 60)  # no /dev/shm holds an exbibyte
    try:
        if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
            assert small.directory.startswith("/dev/shm/")
        assert os.path.dirname(huge.directory) == tempfile.gettempdir()
    finally:
        small.remove()
        huge.remove()
    assert not os.path.exists(small.directory) and not os.path.exists(huge.directory)


def test_process_cpu_s_reads_this_process():
    mine = process_cpu_s()
    from_proc = process_cpu_s(os.getpid())
    # /proc counts clock ticks (1/100 s): the two readings of the same process differ by a few ticks at most
    assert from_proc is not None and abs(mine - from_proc) < 0.5
    assert process_cpu_s(2 ** 22 + 12345) is None  # above pid_max's default: no such process
