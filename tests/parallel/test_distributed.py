"""Data parallel on CPU: `python -m paddle.distributed.launch --devices "" --nproc_per_node 2 run_rl.py` against a
single-process run with the same global batch and seed. Sampling is keyed by global row (rollout/sampling.py), so
both runs draw the same completions; global denominators and summed gradients then make the updates equal up to float
rounding of a different summation order."""
import json
import os
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import paddle
import pytest
from launch_helpers import (SLOW, TINY_REL_TOL, assert_checkpoints_match, assert_metrics_match, assert_resume_exact,
                            launch, read_metrics, run, run_once, write_config)
from numerics import f32_sum_tol, tiny_lm_tol

from paddle_grpo import parallel
from paddle_grpo.parallel import ParallelContext


def test_collectives_are_the_identity_in_one_process():
    for _ in range(2):  # tests build several trainers in one process: the context is built each time
        par = ParallelContext.from_config(_cfg())
        assert par.world_size == 1 and par.rank == 0 and par.is_main
        assert (par.dp_world, par.dp_rank, par.tp_world, par.pp_world, par.sharding_world) == (1, 0, 1, 1, 1)
        assert par.vocab_parallel is None and par.model_load_kwargs() == {}
        assert par.all_gather_object({"a": 1}) == [{"a": 1}]
        np.testing.assert_array_equal(par.all_reduce_sum([1.5, 2.0]), [1.5, 2.0])
        assert par.all_true(True) and not par.all_true(False)
        assert par.broadcast_object([3]) == [3]
        assert par.share_within_model_parallel_group(lambda: [4]) == [4] and par.from_first_stage(5) == 5
        assert par.prompt_positions(8, 4) == list(range(8))


def _cfg(**values):
    from paddle_grpo.config import config_from_dict

    return config_from_dict({"global_batch_size": 8, "rollout_n": 2, "per_device_train_batch_size": 2, **values})


@pytest.mark.parametrize("world, values, expected", [
    (2, {}, (2, 1, 1, 1)),
    (2, {"sharding": "stage1"}, (1, 1, 1, 2)),
    (4, {"sharding": "stage1", "sharding_parallel_degree": 2}, (2, 1, 1, 2)),
    (8, {"sharding": "stage1", "tensor_parallel_degree": 2}, (1, 2, 1, 4)),
    (8, {"sharding": "stage1", "sharding_parallel_degree": 2, "tensor_parallel_degree": 2}, (2, 2, 1, 2)),
    (4, {"sharding_parallel_degree": 2}, (4, 1, 1, 1)),  # no `sharding` stage: the degree alone shards nothing
])
def test_hybrid_degrees(world, values, expected):
    got = parallel.hybrid_degrees(_cfg(**values), world)
    assert (got["dp_degree"], got["mp_degree"], got["pp_degree"], got["sharding_degree"]) == expected
    assert got["dp_degree"] * got["mp_degree"] * got["pp_degree"] * got["sharding_degree"] == world


def test_hybrid_degrees_reject_a_sharding_degree_that_does_not_divide():
    from paddle_grpo.config import ConfigError

    with pytest.raises(ConfigError, match="sharding_parallel_degree"):
        parallel.hybrid_degrees(_cfg(sharding="stage1", sharding_parallel_degree=3), 4)


def test_data_parallel_groups_are_the_data_and_sharding_axes_of_fleets_topology():
    from paddle.distributed.fleet.base.topology import CommunicateTopology

    # fleet's axis order: data, pipe, sharding, sep, model (model innermost: consecutive ranks share a model shard)
    topo = CommunicateTopology(["data", "pipe", "sharding", "sep", "model"], [2, 1, 2, 1, 2])
    assert parallel.data_parallel_groups(topo) == [[0, 2, 4, 6], [1, 3, 5, 7]]
    for group in parallel.data_parallel_groups(topo):  # one TP coordinate per group, every data x sharding pair once
        coords = [topo.get_coord(r) for r in group]
        assert len({c.model for c in coords}) == 1 and len({(c.data, c.sharding) for c in coords}) == 4
    topo = CommunicateTopology(["data", "pipe", "sharding", "sep", "model"], [1, 1, 4, 1, 1])
    assert parallel.data_parallel_groups(topo) == [[0, 1, 2, 3]]
    topo = CommunicateTopology(["data", "pipe", "sharding", "sep", "model"], [1, 1, 1, 1, 4])
    assert parallel.data_parallel_groups(topo) == [[0], [1], [2], [3]]


def test_unsupported_layouts_name_their_key():
    assert parallel.unsupported_layout(_cfg(sharding="stage1", tensor_parallel_degree=2)) == []
    # stage2 runs as stage1 (with a warning, tests/config/test_paddlenlp_configs.py): only split_param is refused.
    problems = parallel.unsupported_layout(_cfg(sharding="stage2", sharding_parallel_config="split_param"))
    assert len(problems) == 1
    assert problems[0].startswith("sharding_parallel_config: 'split_param' is not supported")
    assert parallel.unsupported_layout(_cfg(pipeline_parallel_degree=2)) == []
    problems = parallel.unsupported_layout(_cfg(pipeline_parallel_degree=2, sharding="stage1",
                                            sharding_parallel_config="enable_stage1_overlap,split_param"))
    assert [p.split(":")[0] for p in problems] == ["pipeline_parallel_degree", "sharding_parallel_config"]


def test_optimizer_files_are_named_by_the_axes_that_split_the_state():
    from paddle_grpo.run.checkpoint import optimizer_file

    assert optimizer_file() == optimizer_file({}) == "optimizer.pdopt"
    assert optimizer_file({"tp": 1}) == "optimizer.tp1.pdopt"
    assert optimizer_file({"tp": 0, "sharding": 3}) == "optimizer.tp0.sharding3.pdopt"
    shard, saves = ParallelContext().optimizer_shard()  # one process: the whole state, saved by it
    assert shard == {} and saves


def test_prompt_positions_split_every_global_mini_batch_over_the_ranks():
    # 8 prompts, mini-batches of 4, 2 ranks: rank 0 takes 0,1 of mini-batch 0 and 4,5 of mini-batch 1.
    assert parallel.prompt_positions(8, 2, 0, 4) == [0, 1, 4, 5]
    assert parallel.prompt_positions(8, 2, 1, 4) == [2, 3, 6, 7]
    for n, world, mini in [(12, 3, 6), (16, 4, 4), (16, 2, 16), (6, 1, 3)]:
        parts = [parallel.prompt_positions(n, world, r, mini) for r in range(world)]
        assert sorted(p for part in parts for p in part) == list(range(n))  # a partition of the batch
        for part in parts:  # the rank's k-th local mini-batch lies inside global mini-batch k
            share = mini // world
            assert all(part[k * share + i] // mini == k for k in range(n // mini) for i in range(share))
    # A generation batch that is not whole mini-batches (dynamic sampling): contiguous blocks.
    assert parallel.prompt_positions(10, 2, 1, 4) == [5, 6, 7, 8, 9]


# ------------------------------------------------------------ building a missing policy before the groups form

def test_build_once_renames_a_finished_build_into_place_and_clears_dead_builders(tmp_path):
    host = socket.gethostname()
    target = tmp_path / "build" / "policy"
    target.parent.mkdir()
    dead = target.parent / f"policy.tmp-{host}-999999999.building"  # no such pid: a killed builder's leftover
    alive = target.parent / f"policy.tmp-{host}-{os.getppid()}"      # a running process's: not touched
    dead.mkdir()
    alive.mkdir()
    seen = []

    def build(directory):
        seen.append((directory, target.exists()))
        os.makedirs(directory)
        with open(os.path.join(directory, "config.json"), "w", encoding="utf-8") as f:
            f.write("{}")

    parallel.build_once(str(target), build, "a test recipe")
    assert seen == [(str(target.parent / f"policy.tmp-{host}-{os.getpid()}"), False)]  # built beside, not in place
    assert (target / "config.json").read_text() == "{}"
    assert sorted(p.name for p in target.parent.iterdir()) == sorted(["policy", alive.name])


def test_a_failed_build_stops_the_waiting_ranks_of_this_launch_only(tmp_path, monkeypatch):
    target = tmp_path / "policy"
    marker = tmp_path / f"policy.failed-{socket.gethostname()}"

    def broken(directory):
        os.makedirs(directory)
        raise ValueError("no space left for the tokenizer")

    with pytest.raises(ValueError, match="no space left"):
        parallel.build_once(str(target), broken, "a test recipe")
    # no half build; the lock file stays for the next node's (or start's) attempt
    assert not target.exists() and sorted(p.name for p in tmp_path.iterdir()) == [marker.name, "policy.lock"]
    monkeypatch.setenv("PADDLE_LOCAL_RANK", "1")  # a rank of the same launch (same launcher pid) waits
    with pytest.raises(RuntimeError, match=r"local rank 0 failed to build .*policy with a test recipe: "
                                           r"ValueError: no space left for the tokenizer"):
        parallel.build_once(str(target), broken, "a test recipe", poll_seconds=0.01)

    # A marker left by an earlier launch is not this launch's failure: the rank waits until the directory appears.
    marker.write_text(json.dumps({"launch": "another host 1 127.0.0.1:1", "error": "ValueError: old"}))
    timer = threading.Timer(0.3, target.mkdir)
    timer.start()
    parallel.build_once(str(target), broken, "a test recipe", poll_seconds=0.01)
    timer.join()
    assert target.is_dir()


@pytest.mark.e2e
@SLOW  # a 35 s build by design (longer than gloo's 30 s timeout), 46 s here: opt-in with the other launch checks
def test_two_ranks_build_a_missing_policy_longer_than_the_collective_timeout(tmp_path, tiny_policy_dir, repo_root):
    """build_actor_if_missing under 2 ranks, with a build (35 s) longer than gloo's fixed 30 s collective timeout:
    local rank 0 builds before the process group forms while rank 1 waits on the file system, then both train and
    the run equals one process on the same policy. (When the build ran after the process groups formed, rank 1
    waited in a barrier and gloo timed out: `unbound_buffer.cc:80 TIMEOUT`, exit 241.)"""
    policy = tmp_path / "build" / "policy"
    cfg = write_config(tmp_path, str(policy), "grpo")
    run_rl = str(repo_root / "run_rl.py")
    with ThreadPoolExecutor(1) as pool:  # the single-process reference runs while the launch mostly sleeps
        one = pool.submit(run, [sys.executable, run_rl, str(cfg), "--output_dir", str(tmp_path / "one"),
                                "--actor_model_name_or_path", tiny_policy_dir], tmp_path)
        run(launch(repo_root / "tests" / "workers" / "slow_build_run_rl.py", tiny_policy_dir, 35, cfg,
                   "--build_actor_if_missing", "quickstart", "--output_dir", tmp_path / "two",
                   log_dir=tmp_path / "log"), tmp_path)
        one.result()
    rank1 = (tmp_path / "log" / "workerlog.1").read_text()
    assert "still waiting for local rank 0 to build" in rank1 and "Traceback" not in rank1  # waited >= 30 s
    assert sorted(p.name for p in policy.parent.iterdir()) == ["policy"]  # renamed into place, nothing left over
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert sorted(one) == sorted(two) == [1, 2]
    # the global batch's statistics (both ranks' completions are in them), summed in another order
    assert_metrics_match([one[s] for s in sorted(one)], [two[s] for s in sorted(two)])
    assert one[1]["train/reward_std"] > 0


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, tiny_policy_dir, repo_root):
    """one_process(algorithm, *args): the output directory of run_rl.py on write_config's run in one process with
    `args`, run once per module for each (algorithm, args): the launches compared with the same single process
    share its run (run_rl.py in one process takes as long as a test's launch)."""
    runs = {}

    def get(algorithm, *args):
        key = (algorithm, tuple(map(str, args)))
        if key not in runs:
            work = tmp_path_factory.mktemp(f"one_{algorithm}")
            cfg = write_config(work, tiny_policy_dir, algorithm)
            run([sys.executable, str(repo_root / "run_rl.py"), str(cfg), "--output_dir", str(work / "one"), *key[1]],
                work)
            runs[key] = work / "one"
        return runs[key]

    return get


@pytest.mark.e2e
@pytest.mark.parametrize("algorithm", ["grpo", pytest.param("reinforce_plus_plus", marks=pytest.mark.numerics)])
def test_two_ranks_match_one_rank(tmp_path, tiny_policy_dir, repo_root, algorithm, one_process):
    """GRPO with two mini-batches (optimizer steps) per rollout: each rank's k-th mini-batch must be its share of
    the single process's k-th mini-batch (parallel.prompt_positions)."""
    cfg = write_config(tmp_path, tiny_policy_dir, algorithm)
    run_rl = str(repo_root / "run_rl.py")
    minis = ["--global_mini_batch_size", "2"] if algorithm == "grpo" else []
    one_dir = one_process(algorithm, *minis)
    run(launch(run_rl, cfg, "--output_dir", tmp_path / "two", *minis, log_dir=tmp_path / "log"), tmp_path)
    one = [json.loads(line) for line in open(one_dir / "metrics.jsonl")]
    two = [json.loads(line) for line in open(tmp_path / "two" / "metrics.jsonl")]  # rank 0 alone writes
    assert [r["step"] for r in one] == [r["step"] for r in two] == [1, 2]
    # Losses and statistics: float32 sums in another order (launch_helpers.TINY_REL_TOL); rewards and lengths equal.
    assert assert_metrics_match(one, two) > 30
    assert one[0]["train/reward_std"] > 0
    # 2 steps x (2 mini-batches for grpo, 1 otherwise) Adam steps of lr 1e-3 (numerics.assert_adam_close).
    assert_checkpoints_match(one_dir, tmp_path / "two", tiny_policy_dir, 4 if minis else 2)
    assert "Traceback" not in (tmp_path / "log" / "workerlog.1").read_text()


@pytest.mark.e2e
def test_tensor_parallel_logprobs_entropy_and_gradients_equal_a_single_process(tmp_path, tiny_policy_dir,
                                                                              repo_root):
    from paddle_grpo.policy.causal import completion_logprobs, load_causal_lm

    rng = np.random.default_rng(0)
    V = 300  # a vocabulary the 2 ranks split evenly
    inputs = {"prompt_ids": rng.integers(3, V, size=(3, 6)), "prompt_mask": np.array([[0, 0, 1, 1, 1, 1]] * 3),
              "completion_ids": rng.integers(3, V, size=(3, 5)),
              "completion_mask": np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]])}
    np.savez(tmp_path / "r_inputs.npz", **inputs)
    run(launch(repo_root / "tests" / "workers" / "tp_logprobs_worker.py", tiny_policy_dir, tmp_path / "r.npz",
               log_dir=tmp_path / "log"), repo_root)
    got = np.load(tmp_path / "r.npz")
    model = load_causal_lm(tiny_policy_dir)
    args = [paddle.to_tensor(inputs[k]) for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
    lp, ent = completion_logprobs(model, *args, temperature=0.8, with_entropy=True)
    mask = args[3].astype("float32")
    ((lp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
    m = inputs["completion_mask"].astype(bool)
    # two ranks' halves of every layer against one process: other sums, so tests/numerics.py's bound for the tiny
    # policy (hidden 64, intermediate 128, 2 layers, vocab 320), twice that for gradients
    tol = tiny_lm_tol(128, 2, 320)
    np.testing.assert_allclose(got["logprobs"][m], lp.numpy()[m], rtol=1e-5, atol=tol)
    np.testing.assert_allclose(got["entropy"][m], ent.numpy()[m], rtol=1e-5, atol=tol)
    full_grad = model.get_input_embeddings().weight.grad.numpy()
    np.testing.assert_allclose(got["embed_grad"][:full_grad.shape[0]], full_grad, rtol=1e-4,
                               atol=2 * tol * np.abs(full_grad).max())
    assert np.abs(full_grad).max() > 1e-4


# name: (chunk_size, temperature, transpose_y, with_entropy); 3 x 5 = 15 positions, so 4 and 7 leave a short last chunk
CHUNKED_HEAD_CASES = {"c1": (1, 1.0, False, True), "c4_t07": (4, 0.7, False, True), "c7_tied": (7, 1.0, True, True),
                      "c15_tied_t13": (15, 1.3, True, True), "c64": (64, 0.7, False, True),
                      "c4_no_entropy": (4, 1.0, False, False)}


def _reference_head(hidden, weight, labels, a, b, temperature, with_entropy):
    """Unsharded, unchunked float64: log-probs, entropy and the gradients of sum(a lp + b H) w.r.t. hidden, weight."""
    h = paddle.to_tensor(hidden.astype(np.float64), stop_gradient=False)
    w = paddle.to_tensor(weight.astype(np.float64), stop_gradient=False)
    z = paddle.matmul(h, w) / temperature
    lse = paddle.logsumexp(z, axis=-1)
    lab = paddle.to_tensor(np.maximum(labels, 0)).unsqueeze(-1)
    lp = paddle.take_along_axis(z, lab, axis=-1).squeeze(-1) - lse
    ent = lse - (paddle.nn.functional.softmax(z, axis=-1) * z).sum(axis=-1)
    loss = (lp * paddle.to_tensor(a.astype(np.float64))).sum()
    if with_entropy:
        loss = loss + (ent * paddle.to_tensor(b.astype(np.float64))).sum()
    loss.backward()
    return lp.numpy(), ent.numpy(), h.grad.numpy(), w.grad.numpy()


@pytest.mark.e2e
def test_tensor_parallel_chunked_head_equals_the_unsharded_unchunked_head(tmp_path, repo_root):
    """VocabParallel.chunked_logprobs_and_entropy on 2 ranks (each half of the vocabulary), every case in one launch:
    log-probs, entropy, the hidden states' gradient (summed over the ranks) and each weight shard's gradient equal
    a float64 computation on the whole head. Logits of up to ~20 (the shift by the global row max matters), labels
    in both halves and an ignore index (-100, read as id 0)."""
    rng = np.random.default_rng(3)
    n, T, H, V = 3, 5, 8, 40
    labels = rng.integers(0, V, size=(n, T))
    labels[0, :2] = [3, V - 1]
    labels[2, 4] = -100
    inputs = {"hidden": rng.normal(size=(n, T, H)).astype(np.float32),
              "weight": (2.5 * rng.normal(size=(H, V))).astype(np.float32), "labels": labels,
              "a": rng.normal(size=(n, T)).astype(np.float32), "b": rng.normal(size=(n, T)).astype(np.float32)}
    np.savez(tmp_path / "inputs.npz", **inputs)
    cases = {k: dict(zip(("chunk_size", "temperature", "transpose_y", "with_entropy"), v))
             for k, v in CHUNKED_HEAD_CASES.items()}
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    run(launch(repo_root / "tests" / "workers" / "tp_chunked_head_worker.py", tmp_path, log_dir=tmp_path / "log"),
        repo_root)
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in (0, 1)]
    assert np.abs(inputs["hidden"] @ inputs["weight"]).max() > 15
    # float32 against float64 (tests/numerics.py): logits sum H = 8 terms (sum|terms| <= 30 at temperature 0.7), a
    # log-prob subtracts a logsumexp of V = 40 positive terms; gradients sum V terms dz * w (sum|dz| <= 2, |w| <= 8)
    value_tol = 2 * f32_sum_tol(H, 30.0) + f32_sum_tol(V, 1.0)  # 6.2e-5
    grad_tol = 2 * value_tol + f32_sum_tol(V, 16.0)             # 2e-4
    worst = {}
    for name, case in cases.items():
        lp, ent, dh, dw = _reference_head(inputs["hidden"], inputs["weight"], labels, inputs["a"], inputs["b"],
                                          case["temperature"], case["with_entropy"])
        for got in ranks:  # every rank returns the full distribution's values and the summed hidden gradient
            np.testing.assert_allclose(got[f"{name}/logprobs"], lp, rtol=1e-5, atol=value_tol, err_msg=name)
            np.testing.assert_allclose(got[f"{name}/hidden_grad"], dh, rtol=1e-4, atol=grad_tol, err_msg=name)
            assert (f"{name}/entropy" in got) == case["with_entropy"], name
            if case["with_entropy"]:
                np.testing.assert_allclose(got[f"{name}/entropy"], ent, rtol=1e-5, atol=value_tol, err_msg=name)
        shards = [got[f"{name}/weight_grad"] for got in ranks]  # [H, V/2] each, or [V/2, H] tied
        full = np.concatenate(shards, axis=0).T if case["transpose_y"] else np.concatenate(shards, axis=1)
        np.testing.assert_allclose(full, dw, rtol=1e-4, atol=grad_tol, err_msg=name)
        assert np.abs(dw).max() > 0.1 and np.abs(dh).max() > 0.1
        for key, ref in (("logprobs", lp), ("entropy", ent), ("hidden_grad", dh)):
            if f"{name}/{key}" in ranks[0]:
                worst[key] = max(worst.get(key, 0.0), float(np.abs(ranks[0][f"{name}/{key}"] - ref).max()))
        worst["weight_grad"] = max(worst.get("weight_grad", 0.0), float(np.abs(full - dw).max()))
    print("largest absolute difference from float64:", {k: f"{v:.2g}" for k, v in worst.items()})


@pytest.mark.e2e
def test_tensor_parallel_training_equals_a_single_process(tmp_path, tiny_policy_dir, repo_root, one_process):
    cfg = write_config(tmp_path, tiny_policy_dir, "reinforce_plus_plus")
    run_rl = str(repo_root / "run_rl.py")
    one_dir = one_process("reinforce_plus_plus")  # the same run as test_two_ranks_match_one_rank's
    run(launch(run_rl, cfg, "--output_dir", tmp_path / "tp", "--tensor_parallel_degree", 2,
               log_dir=tmp_path / "log"), tmp_path)
    one = [json.loads(line) for line in open(one_dir / "metrics.jsonl")]
    tp = [json.loads(line) for line in open(tmp_path / "tp" / "metrics.jsonl")]
    assert_metrics_match(one, tp)
    # The two runs' sampling log-probs (PaddleNLP's forward under TP, the lean Qwen2 path in one process) are float32
    # rounding apart and enter the reward's KL term; Adam's first steps move a parameter by about the learning rate
    # (1e-3) whatever its gradient's size, so rounding-level gradient differences show up as ~1e-5 on a few elements
    # (numerics.assert_adam_close). A sharding bug moves most parameters by ~1e-3. The shards are merged on save.
    assert_checkpoints_match(one_dir, tmp_path / "tp", tiny_policy_dir, one[-1]["train/optimizer_steps"])
    ckpt = tmp_path / "tp" / "checkpoint-2"
    assert (ckpt / "optimizer.tp0.pdopt").is_file() and (ckpt / "optimizer.tp1.pdopt").is_file()
    assert json.loads((ckpt / "config.json").read_text()).get("tensor_parallel_degree", 1) == 1


@pytest.mark.e2e
def test_two_ranks_resume_exactly(tmp_path, tiny_policy_dir, repo_root):
    """Both ranks load the checkpoint: resuming at step 2 reproduces steps 3-4 of the uninterrupted 2-rank run,
    running reward normaliser included. reinforce_plus_plus, because normalize_reward has no effect with grpo
    (PaddleNLP forces it off there)."""
    cfg = write_config(tmp_path, tiny_policy_dir, "reinforce_plus_plus")
    assert_resume_exact(tmp_path, str(repo_root / "run_rl.py"), cfg,
                        ["--max_steps", 4, "--save_steps", 2, "--lr_scheduler_type", "cosine",
                         "--normalize_reward", "true"])
    # The normaliser saw the global batch (both ranks' rows), not one rank's half: after 2 steps of 16 rows its
    # count is 32 and its mean is the mean of the two steps' mean rewards (every row valid, rewards in [0, 1] so no
    # clipping). Tolerance: train/reward is a float32-rounded mean of 16 values (f32 rounding 6e-8 per operation,
    # ~17 operations, rewards <= 1): 1e-6 absolute covers it with margin; the normaliser sums in float64.
    state = json.loads((tmp_path / "full" / "checkpoint-2" / "trainer_state.json").read_text())
    metrics = read_metrics(tmp_path / "full")
    assert all(metrics[s]["train/reward_none_frac"] == 0 for s in (1, 2))
    assert state["normalizer"]["count"] == 32
    assert state["normalizer"]["mean"] == pytest.approx(
        (metrics[1]["train/reward"] + metrics[2]["train/reward"]) / 2, abs=1e-6)


@pytest.mark.e2e
def test_sharding_stage1_equals_a_single_process_and_resumes_exactly(tmp_path, tiny_policy_dir, repo_root):
    """sharding: stage1 on 2 ranks (each keeps the AdamW states of half the parameters): the same metrics and
    parameters as one process; the two optimizer files together hold exactly the single process's state; resuming
    at step 2 reproduces steps 3-4 bitwise."""
    cfg = write_config(tmp_path, tiny_policy_dir, "grpo")
    run_rl = str(repo_root / "run_rl.py")
    common = ["--max_steps", 4, "--save_steps", 2, "--lr_scheduler_type", "cosine", "--max_grad_norm", 0.05]
    run([sys.executable, run_rl, str(cfg), "--output_dir", str(tmp_path / "one"), *map(str, common)], tmp_path)
    sharded = [*common, "--sharding", "stage1"]
    run(launch(run_rl, cfg, "--output_dir", tmp_path / "s1", *sharded, log_dir=tmp_path / "log1"), tmp_path)

    one, s1 = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "s1")
    assert sorted(one) == sorted(s1) == [1, 2, 3, 4]
    assert_metrics_match([one[s] for s in sorted(one)], [s1[s] for s in sorted(s1)])
    assert all(one[s]["train/grad_norm"] > 0.05 for s in one)  # clipping was active: the norm counts every shard
    assert_checkpoints_match(tmp_path / "one", tmp_path / "s1", tiny_policy_dir, one[4]["train/optimizer_steps"],
                             checkpoint="checkpoint-4")

    ckpt = tmp_path / "s1" / "checkpoint-4"
    assert not (ckpt / "optimizer.pdopt").exists()
    parts = [paddle.load(str(ckpt / f"optimizer.sharding{r}.pdopt")) for r in (0, 1)]
    full = paddle.load(str(tmp_path / "one" / "checkpoint-4" / "optimizer.pdopt"))
    moments = [{k for k in p if "moment" in k} for p in parts]
    assert moments[0] and moments[1] and not moments[0] & moments[1]  # a partition of the parameters' states
    assert moments[0] | moments[1] == {k for k in full if "moment" in k}
    for part in parts:
        for key in (k for k in part if "moment" in k):
            # Adam's moments are averages of the gradients and of their squares: the gradients' float32 rounding
            # (TINY_REL_TOL), measured against the tensor's largest moment where a gradient cancels
            want = full[key].numpy()
            np.testing.assert_allclose(part[key].numpy(), want, rtol=TINY_REL_TOL,
                                       atol=TINY_REL_TOL * np.abs(want).max())

    assert_resume_exact(tmp_path, run_rl, cfg, sharded, full_dir=tmp_path / "s1")


# ------------------------------------------------------------------- 3-4 processes (opt-in: slow on 2 cores)

LAUNCHES = 20
# layout: (processes, overrides, {group: size}); the pipelines of 3+ stages add their p2p pair groups.
LAYOUTS = {
    "tp2_x_sharding2": (4, ["--tensor_parallel_degree", 2, "--sharding", "stage1"],
                        {"world": 4, "data": 2, "model": 2, "pipe": 1, "sharding": 2}),
    "pp4": (4, ["--pipeline_parallel_degree", 4], {"world": 4, "data": 1, "model": 1, "pipe": 4, "sharding": 1}),
    "pp3": (3, ["--pipeline_parallel_degree", 3], {"world": 3, "data": 1, "model": 1, "pipe": 3, "sharding": 1}),
}


def _first_error(log_dir):
    """The first line of a failed launch's worker logs that says what went wrong."""
    for log in sorted(log_dir.glob("workerlog.*")):
        for line in log.read_text(errors="replace").splitlines():
            if any(s in line for s in ("Error", "error:", "TIMEOUT", "refused", "reset by peer", "address.cc")):
                return f"{log.name}: {line.strip()[:200]}"
    return "no error line in the worker logs"


@pytest.mark.e2e
@SLOW
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_twenty_launches_in_a_row_all_start(tmp_path, tiny_policy_dir, repo_root, layout):
    """ParallelContext.from_config with 3-4 gloo processes, LAUNCHES times in a row, none retried: every launch
    creates all its groups, and an all-reduce of rank + 1 over each group this rank belongs to gives the sum over
    that group's ranks. Before each gloo group got its own TCP store (parallel.cpu_shims.isolate_gloo_groups)
    fleet.init failed in most of these launches (docs/distributed.md)."""
    nproc, overrides, sizes = LAYOUTS[layout]
    cfg = write_config(tmp_path, tiny_policy_dir, "grpo")
    worker = repo_root / "tests" / "workers" / "startup_worker.py"
    failures = []
    for i in range(LAUNCHES):
        out = tmp_path / f"out{i}"
        out.mkdir()
        done = run_once(launch(worker, out, cfg, *overrides, log_dir=tmp_path / f"log{i}", nproc=nproc), tmp_path,
                        timeout=180)
        if done.returncode != 0:
            failures.append(f"launch {i + 1}: exit {done.returncode}, {_first_error(tmp_path / f'log{i}')}")
            continue
        for r in range(nproc):
            groups = json.loads((out / f"rank{r}.json").read_text())
            pairs = [name for name in groups if name.startswith("pair")]
            assert len(pairs) == (2 if sizes["pipe"] >= 3 else 0), (i, r, groups)  # a ring: two neighbours
            for name, (total, ranks) in groups.items():
                assert r in ranks and len(ranks) == sizes.get(name, 2), (i, r, name, ranks)
                assert total == sum(q + 1 for q in ranks), (i, r, name, total, ranks)
    print(f"{layout}: {LAUNCHES - len(failures)} of {LAUNCHES} launches started")
    assert not failures, f"{len(failures)} of {LAUNCHES} launches failed:\n" + "\n".join(failures)
