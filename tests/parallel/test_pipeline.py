"""Pipeline parallelism: the plumbing in one process (layer split, owner map, p2p pair groups, config errors) and,
on CPU with gloo, `--pipeline_parallel_degree 2` against a single-process run of the same config.

3+ stages and `virtual_pp_degree` (fleet needs pp >= 3 for it), and pp 2 x dp 2, need 3-4 processes on this 2-core
machine: their plumbing (layer split, pair groups) is tested in one process, the runs themselves only with
PADDLE_GRPO_SLOW_DIST=1."""
import importlib.util
import json
import os
import pathlib
import sys

import paddle
import pytest
from launch_helpers import (SLOW, assert_checkpoints_match, assert_metrics_match, assert_resume_exact, launch,
                            read_metrics, run, tiny_rel_tol, write_config)

from paddle_grpo import parallel
from paddle_grpo.parallel import ParallelContext
from paddle_grpo.config import ConfigError, parse_args

# ------------------------------------------------------------------------------------------- one process

def test_stage_chunks_two_stages():
    # items: 0 embedding, 1..4 decoder layers, 5 final norm, 6 LM head
    assert parallel.stage_chunks(4, 2) == {0: [[0, 1, 2]], 1: [[3, 4, 5, 6]]}


def test_stage_chunks_three_stages_and_uneven_split():
    assert parallel.stage_chunks(6, 3) == {0: [[0, 1, 2]], 1: [[3, 4]], 2: [[5, 6, 7, 8]]}
    # 4 layers over 3 stages: PaddleNLP falls back to equal numbers of items (7 items -> 2, 2, 3)
    assert parallel.stage_chunks(4, 3) == {0: [[0, 1]], 1: [[2, 3]], 2: [[4, 5, 6]]}


def test_stage_chunks_virtual_pipeline_interleaves_chunks():
    # 6 layers, 3 stages x 2 chunks of one layer each; chunk c runs on stage c % 3
    assert parallel.stage_chunks(6, 3, vpp=2) == {0: [[0, 1], [4]], 1: [[2], [5]], 2: [[3], [6, 7, 8]]}


def test_expected_owner_follows_the_split():
    names = ["qwen2.embed_tokens.weight", "qwen2.layers.0.mlp.up_proj.weight", "qwen2.layers.3.self_attn.q_proj.bias",
             "qwen2.layers.4.input_layernorm.weight", "qwen2.norm.weight", "lm_head.weight"]
    assert [parallel.expected_owner(n, 6, 2) for n in names] == [0, 0, 1, 1, 1, 1]
    assert [parallel.expected_owner(n, 6, 3) for n in names] == [0, 0, 1, 2, 2, 2]
    assert [parallel.expected_owner(n, 6, 3, vpp=2) for n in names] == [0, 0, 0, 1, 2, 2]  # layer 3: chunk 3, stage 0


def test_merge_owners_gives_a_tied_embedding_to_the_first_stage():
    per_stage = [["qwen2.embed_tokens.weight", "qwen2.layers.0.w"], ["qwen2.layers.1.w"],
                 ["qwen2.norm.weight", "qwen2.embed_tokens.weight"]]
    assert parallel.merge_owners(per_stage) == {"qwen2.embed_tokens.weight": 0, "qwen2.layers.0.w": 0,
                                            "qwen2.layers.1.w": 1, "qwen2.norm.weight": 2}


def test_pipeline_pairs():
    assert parallel.pipeline_pairs([0, 1]) == []  # the pipeline group itself is the pair
    assert parallel.pipeline_pairs([0, 1, 2]) == [(0, 1), (0, 2), (1, 2)]
    assert parallel.pipeline_pairs([1, 3, 5, 7]) == [(1, 3), (1, 7), (3, 5), (5, 7)]  # ring: last -> first too


def _cfg(tmp_path, tiny_policy_dir, *extra):
    return parse_args([str(write_config(tmp_path, tiny_policy_dir, "grpo")), *map(str, extra)])


def test_virtual_pipeline_needs_three_stages(tmp_path, tiny_policy_dir):
    cfg = _cfg(tmp_path, tiny_policy_dir, "--pipeline_parallel_degree", 2, "--virtual_pp_degree", 2)
    with pytest.raises(ConfigError, match="virtual_pp_degree.*pipeline_parallel_degree"):
        parallel.check_pipeline_config(cfg)


def test_virtual_pipeline_needs_enough_micro_batches(tmp_path, tiny_policy_dir):
    # 4 prompts x 4 samples, 8 per micro-batch: 2 micro-batches for 3 stages
    cfg = _cfg(tmp_path, tiny_policy_dir, "--pipeline_parallel_degree", 3, "--virtual_pp_degree", 2,
               "--per_device_train_batch_size", 8)
    with pytest.raises(ConfigError, match="per_device_train_batch_size"):
        parallel.check_pipeline_config(cfg)
    parallel.check_pipeline_config(_cfg(tmp_path, tiny_policy_dir, "--pipeline_parallel_degree", 3,
                                        "--virtual_pp_degree", 2, "--per_device_train_batch_size", 4))


def test_pipeline_with_tensor_parallel_or_lora_is_refused(tmp_path, tiny_policy_dir):
    cfg = _cfg(tmp_path, tiny_policy_dir, "--pipeline_parallel_degree", 2, "--tensor_parallel_degree", 2)
    with pytest.raises(NotImplementedError, match="tensor_parallel_degree.*pipeline_parallel_degree"):
        parallel.check_pipeline_config(cfg)
    cfg = _cfg(tmp_path, tiny_policy_dir, "--pipeline_parallel_degree", 2, "--lora", "true")
    with pytest.raises(NotImplementedError, match="lora.*pipeline_parallel_degree"):
        parallel.check_pipeline_config(cfg)


def test_one_process_refuses_two_stages(tmp_path, tiny_policy_dir):
    cfg = _cfg(tmp_path, tiny_policy_dir, "--pipeline_parallel_degree", 2)
    with pytest.raises(ConfigError, match="pipeline_parallel_degree"):
        ParallelContext.from_config(cfg)


# ------------------------------------------------------------------------------------- 2 processes (gloo)

def _tiny_policy(tmp_path, **model_kwargs):
    """The tests' tiny policy (conftest.tiny_policy_dir) with other model options."""
    from paddle_grpo.recipes.tiny import build_tiny_policy

    conftest_path = pathlib.Path(__file__).parent.parent / "conftest.py"
    spec = importlib.util.spec_from_file_location("_conftest_corpus", conftest_path)
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    path = tmp_path / "policy"
    build_tiny_policy(str(path), conftest.TINY_CORPUS, vocab_size=320, seed=0, **model_kwargs)
    return str(path)


def _metrics(path):
    return [row for _, row in sorted(read_metrics(path).items())]


@pytest.mark.e2e
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_two_stages_with_and_without_the_chunked_lm_head_match_one_process(tmp_path, tiny_policy_dir, repo_root,
                                                                          tied):
    """GRPO with the KL loss, 2 mini-batches per step (old log-probs from the synced full copy, a weight copy
    between optimizer steps) and clipping by the norm summed over both stages. Tied embeddings: the embedding lives
    on both stages (fleet all-reduces its gradient) and counts once in the gradient norm.

    Two launches of 2 stages, with the full logits and with policy.head_chunk_size set (the last stage hands the
    loss its final hidden states and the loss applies the stage's LM head, weight [H, V] or the shared embedding
    [V, H] when tied, 7 positions at a time: micro-batches of 4 x 8 completion positions, 7 does not divide them),
    and one process: the full-logits launch matches the process, the chunked launch the full one (equal losses,
    gradient norms with clipping active, every metric and the trained weights; measured 2.7e-6 / 3.2e-6). One
    launch serves both comparisons (they were two tests launching the same full-logits run)."""
    policy = _tiny_policy(tmp_path, tie_word_embeddings=True) if tied else tiny_policy_dir
    common = ["--global_mini_batch_size", 2, "--max_grad_norm", 0.5]
    calls = _chunked_and_full(tmp_path, policy, repo_root, [*common, "--pipeline_parallel_degree", 2], nproc=2)
    # 2 steps x 2 optimizer steps x 2 micro-batches, on the last stage only; none without chunking
    assert calls == {"full": [[], []], "chunked": [[], [7] * 8]}
    cfg = write_config(tmp_path, policy, "grpo")  # the launches' config (written again, the same)
    run([sys.executable, str(repo_root / "run_rl.py"), str(cfg), "--output_dir", str(tmp_path / "one"),
         *map(str, common)], tmp_path)
    one, pp = _metrics(tmp_path / "one"), _metrics(tmp_path / "full")
    assert [r["step"] for r in one] == [r["step"] for r in pp] == [1, 2]
    assert assert_metrics_match(one, pp) > 30  # float32 sums in other orders; rewards and lengths equal
    assert one[0]["train/grad_norm"] > 0.5 and one[0]["train/optimizer_steps"] == 2  # clipping ran
    ckpt = tmp_path / "full" / "checkpoint-2"
    # The merged full copy. The LM head sees every position, so gradients differ by float rounding, which Adam
    # turns into up to lr-sized steps on the few embedding rows whose gradient is ~1e-10 (below adam_epsilon):
    # numerics.assert_adam_close. 2 steps x 2 mini-batches.
    drift = assert_checkpoints_match(tmp_path / "one", tmp_path / "full", policy, 4)
    assert drift["moved"] > 3e-3, drift
    assert (ckpt / "optimizer.pp0.pdopt").is_file() and (ckpt / "optimizer.pp1.pdopt").is_file()
    assert json.loads((ckpt / "trainer_state.json").read_text())["pipeline_parallel_degree"] == 2
    for log in ("log_full/workerlog.0", "log_full/workerlog.1", "log_chunked/workerlog.0", "log_chunked/workerlog.1"):
        assert "Traceback" not in (tmp_path / log).read_text()
    _compare(tmp_path / "full", tmp_path / "chunked", policy)


def _chunked_and_full(tmp_path, policy, repo_root, overrides, nproc):
    """Two launches of tests/workers/chunked_head_run_rl.py (full logits, then chunks of 7) into tmp_path/full and
    tmp_path/chunked; {run: [chunk sizes the loss used, per rank]}."""
    cfg = write_config(tmp_path, policy, "grpo")
    worker = repo_root / "tests" / "workers" / "chunked_head_run_rl.py"
    for name, chunk in (("full", 0), ("chunked", 7)):
        run(launch(worker, chunk, cfg, "--output_dir", tmp_path / name, *overrides, log_dir=tmp_path / f"log_{name}",
                   nproc=nproc), tmp_path)
    initial = paddle.load(os.path.join(policy, "model_state.pdparams"))
    trained = paddle.load(str(tmp_path / "full" / "checkpoint-2" / "model_state.pdparams"))
    moved = max(float((trained[k] - initial[k]).abs().max()) for k in trained)
    assert moved > 1.5e-3, moved  # two Adam steps of lr 1e-3
    return {name: [json.loads((tmp_path / name / f"head_calls.rank{r}.json").read_text()) for r in range(nproc)]
            for name in ("full", "chunked")}


@pytest.mark.e2e
def test_two_stages_resume_exactly(tmp_path, tiny_policy_dir, repo_root):
    """Each stage reloads its optimizer file and its part of the saved full model: steps 3-4 after a resume at
    step 2 are those of the uninterrupted run, bit for bit."""
    cfg = write_config(tmp_path, tiny_policy_dir, "grpo")
    assert_resume_exact(tmp_path, str(repo_root / "run_rl.py"), cfg,
                        ["--max_steps", 4, "--save_steps", 2, "--lr_scheduler_type", "cosine",
                         "--pipeline_parallel_degree", 2])


# ----------------------------------------------------------------------- 3-4 processes (opt-in: slow on 2 cores)

# Opt-in (launch_helpers.SLOW): 3-4 processes on 2 cores, ~30 s each here.

def _compare(one_dir, other_dir, initial_dir, layers=2):
    """The two runs' metrics and checkpoint-2 parameters are the same training summed in other orders
    (launch_helpers.tiny_rel_tol for a `layers`-layer policy; numerics.assert_adam_close)."""
    one, other = _metrics(one_dir), _metrics(other_dir)
    assert [r["step"] for r in one] == [r["step"] for r in other] == [1, 2]
    assert_metrics_match(one, other, rel=tiny_rel_tol(layers))
    drift = assert_checkpoints_match(one_dir, other_dir, initial_dir, one[-1]["train/optimizer_steps"],
                                     rel=tiny_rel_tol(layers))
    print(f"{other_dir.name} - {one_dir.name}: parameters {drift}")


@pytest.mark.e2e
@SLOW
@pytest.mark.parametrize("vpp", [1, 2])
def test_three_stages_match_one_process(tmp_path, repo_root, vpp):
    """pp 3 (p2p through the 2-rank pair groups) and pp 3 x virtual_pp_degree 2 (interleaved scheduler: 8
    micro-batches of 2) on a 6-layer policy. Measured: metrics 1.2e-5 / 2.5e-7 relative, parameters 2.5e-5 /
    7.9e-6."""
    policy = _tiny_policy(tmp_path, num_layers=6)
    cfg = write_config(tmp_path, policy, "grpo")  # 3 stages x 2 chunks of 1 layer
    run_rl = str(repo_root / "run_rl.py")
    common = ["--max_grad_norm", 0.5, "--per_device_train_batch_size", 2, "--pipeline_parallel_degree", 3,
              "--virtual_pp_degree", vpp]
    run([sys.executable, run_rl, str(cfg), "--output_dir", str(tmp_path / "one"), *map(str, common[:4])], tmp_path)
    run(launch(run_rl, cfg, "--output_dir", tmp_path / "pp", *common, log_dir=tmp_path / "log", nproc=3), tmp_path)
    _compare(tmp_path / "one", tmp_path / "pp", policy, layers=6)


@pytest.mark.e2e
@SLOW
def test_two_stages_times_two_data_ranks_match_two_data_ranks(tmp_path, tiny_policy_dir, repo_root):
    """pp 2 x dp 2 (4 processes; the DP group is the ranks of one stage) against plain dp 2. Against one process
    they differ once global_mini_batch_size < global_batch_size: a data-parallel mini-batch is the k-th slice of
    every rank's share, not the k-th slice of the global batch. Measured: metrics 1.3e-5 relative, parameters
    1.4e-5."""
    cfg = write_config(tmp_path, tiny_policy_dir, "grpo")
    run_rl = str(repo_root / "run_rl.py")
    common = ["--global_mini_batch_size", 2, "--max_grad_norm", 0.5]
    run(launch(run_rl, cfg, "--output_dir", tmp_path / "dp", *common, log_dir=tmp_path / "log_dp"), tmp_path)
    run(launch(run_rl, cfg, "--output_dir", tmp_path / "pp", "--pipeline_parallel_degree", 2, *common,
               log_dir=tmp_path / "log", nproc=4), tmp_path)
    _compare(tmp_path / "dp", tmp_path / "pp", tiny_policy_dir)


@pytest.mark.e2e
@SLOW
def test_three_stages_interleaved_with_the_chunked_lm_head_match_without(tmp_path, repo_root):
    """pp 3 x virtual_pp_degree 2: the LM head is the last layer of the last stage's second model chunk. Measured:
    parameters 2.6e-5 (as pp 3 x vpp 2 against one process, test_three_stages_match_one_process)."""
    policy = _tiny_policy(tmp_path, num_layers=6)
    calls = _chunked_and_full(tmp_path, policy, repo_root, ["--max_grad_norm", 0.5, "--per_device_train_batch_size", 2,
                                                            "--pipeline_parallel_degree", 3, "--virtual_pp_degree", 2],
                              nproc=3)
    assert calls["full"] == [[], [], []] and calls["chunked"][:2] == [[], []] and calls["chunked"][2]
    assert set(calls["chunked"][2]) == {7}
    _compare(tmp_path / "full", tmp_path / "chunked", policy, layers=6)

