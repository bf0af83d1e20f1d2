"""Multi-turn rollouts with the calculator on 2 CPU processes (gloo) against one process: 2 data-parallel ranks,
tensor parallel 2, and pipeline parallel 2 (its update feeds the pipeline the attention mask of actions and tool
output, step/policy_update._pipeline_mini_batch). The same global batch and seed: sampling is keyed by global row and token position, a row's tool
turns depend only on what it wrote (the calculator is deterministic, and each row's KV slots hold its own tokens, so
the timing of the tool pool does not enter the numbers), so the samples, their turns and the rewards come out
identical, and the metrics and weights agree up to float32 rounding of other summation orders.

Opt-in (PADDLE_GRPO_SLOW_DIST=1, launch_helpers.SLOW): three launches of tool_helpers' policy with prompts that list
the tools (a few hundred tokens), over a minute on 2 loaded cores; the suite must stay fast.
"""
import json
import sys

import pytest
from launch_helpers import SLOW, assert_checkpoints_match, launch, read_metrics, run
from numerics import f32_sum_tol
from tool_helpers import REWARD_FILE, build_tool_policy, write_tool_data

# Float32 bound of these runs: tool_helpers' policy (2 layers, hidden 64, intermediate 128; ~303 tokens) sums at
# most ROWS x (max_prompt_len + max_dec_len) positions into a weight's gradient, through ~42 chained sums (forward
# and backward: 2 x (9 per layer x 2 layers + 3), as launch_helpers.tiny_rel_tol).
ROWS, PROMPT, DEC = 16, 384, 64
REL_TOL = f32_sum_tol(ROWS * (PROMPT + DEC), 1.0, depth=2 * (9 * 2 + 3))
ABS_TOL = f32_sum_tol(ROWS * DEC, 1.0)  # a mean over the step's completion tokens whose terms (~1) cancel


def tool_config(tmp_path):
    policy = tmp_path / "policy"
    build_tool_policy(str(policy))
    train, _ = write_tool_data(str(tmp_path))
    (tmp_path / "rewards.py").write_text(REWARD_FILE)
    cfg = {"actor_model_name_or_path": str(policy), "tools": "calculator", "max_turns": 3, "use_rm_server": False,
           "reward_funcs": f"{tmp_path / 'rewards.py'}:used_calculator", "train_datasets": train,
           "max_prompt_len": PROMPT, "max_dec_len": DEC, "min_dec_len": 1, "max_length": PROMPT + DEC,
           "max_tool_response_len": 16, "global_batch_size": 4, "rollout_n": 4, "per_device_train_batch_size": 4,
           "per_device_logprob_batch_size": 4, "learning_rate": 1e-3, "max_steps": 2, "save_steps": 100,
           "disable_tqdm": True, "report_to": "none", "temperature": 1.0, "kl_loss_coeff": 0.01, "kl_coeff": 0.0}
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps(cfg))
    return path


def samples(output_dir):
    """(prompt, completion, reward, turns without their wall times) of each logged sample."""
    rows = [json.loads(line) for line in (output_dir / "rollouts.jsonl").read_text().splitlines()]
    return [(r["prompt"], r["completion"], r["reward"],
             [{k: v for k, v in m.items() if k != "latency_s"} for m in r["turns"]]) for r in rows]


@pytest.mark.e2e
@pytest.mark.numerics
@SLOW
@pytest.mark.parametrize("layout", ["data_parallel", "tensor_parallel", "pipeline_parallel"])
def test_multi_turn_on_two_processes_equals_one_process(tmp_path, repo_root, layout):
    cfg = tool_config(tmp_path)
    extra = {"data_parallel": [], "tensor_parallel": ["--tensor_parallel_degree", 2],
             "pipeline_parallel": ["--pipeline_parallel_degree", 2]}[layout]
    run([sys.executable, str(repo_root / "run_rl.py"), str(cfg), "--output_dir", str(tmp_path / "one")], tmp_path)
    run(launch(repo_root / "run_rl.py", cfg, "--output_dir", tmp_path / "two", *extra, log_dir=tmp_path / "log"),
        tmp_path)
    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert sorted(one) == sorted(two) == [1, 2]
    for step in (1, 2):
        assert set(one[step]) == set(two[step])
        assert one[step]["rollout/tool_calls_per_sample"] > 0
        for key, value in one[step].items():
            if key.startswith("perf/") or key == "rollout/tool_latency_s":  # wall times
                continue
            if key.startswith(("rollout/", "train/reward", "response_length/")):  # counts of identical samples
                assert two[step][key] == value, (step, key)
            else:
                assert two[step][key] == pytest.approx(value, rel=REL_TOL, abs=ABS_TOL), (step, key)
    assert samples(tmp_path / "one") == samples(tmp_path / "two")
    assert_checkpoints_match(tmp_path / "one", tmp_path / "two", tmp_path / "policy",
                             one[2]["train/optimizer_steps"], rel=REL_TOL)
    assert "Traceback" not in (tmp_path / "log" / "workerlog.1").read_text()
