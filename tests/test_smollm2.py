"""The SmolLM2 recipe (configs/smollm2_grpo.yaml, paddle_grpo/recipes/smollm2.py): its data split, reward and config.

No model is needed, except by the one check of the prompt against the imported model's own chat template, which is
skipped when build/models/smollm2-135m-instruct is absent. The learning runs take 20+ minutes each on 2 cores:
their numbers are in docs/smollm2.md and docs/results/smollm2_seeds.json.
"""
import importlib.util
import os

import pytest

from paddle_grpo.config import load_config
from paddle_grpo.data import read_jsonl
from paddle_grpo.recipes import smollm2 as sm
from paddle_grpo.rewards import get_reward_fn


def _pairs(rows):
    return [(r["a"], r["b"]) for r in rows]


def test_split_covers_every_pair_once_and_holds_out_100():
    train, held = sm.split_pairs()
    everything = {(a, b) for a in range(1, 21) for b in range(1, 21)}
    assert len(train) == 300 and len(held) == 100
    assert not set(train) & set(held)
    assert set(train) | set(held) == everything
    assert sm.split_pairs() == (train, held)  # fixed: no run seed enters it


def test_no_held_out_sum_is_trained_on_in_either_order():
    # The ordered-pair split held out 84 problems whose twin b + a was in training (counted here with the old
    # rule: one shuffle of the 400 ordered pairs, the first 100 held out); the split by unordered pair holds none.
    import random

    train, held = sm.split_pairs()
    trained = set(train)
    assert [p for p in held if (p[1], p[0]) in trained] == []
    ordered = [(a, b) for a in range(1, 21) for b in range(1, 21)]
    random.Random(sm.SPLIT_SEED).shuffle(ordered)
    old_train, old_held = set(ordered[100:]), ordered[:100]
    assert sum((b, a) in old_train for a, b in old_held) == 84


def test_shipped_data_files_are_the_generators_output_and_disjoint(repo_root, tmp_path):
    spec = importlib.util.spec_from_file_location("_gen_smollm2_data",
                                                  repo_root / "tools" / "data" / "gen_smollm2_data.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.main(["--out-dir", str(tmp_path)])
    shipped = repo_root / "data" / "smollm2_add"
    for name in ("train.jsonl", "eval.jsonl"):
        assert (tmp_path / name).read_bytes() == (shipped / name).read_bytes()
    train, held = read_jsonl(str(shipped / "train.jsonl")), read_jsonl(str(shipped / "eval.jsonl"))
    assert (_pairs(train), _pairs(held)) == sm.split_pairs()
    assert not {r["src"] for r in train} & {r["src"] for r in held}
    assert all(r["tgt"] == str(r["a"] + r["b"]) for r in train + held)
    assert all(f"What is {r['a']} + {r['b']}? Reply with only the number." in r["src"] for r in train + held)


def test_reward_scores_the_first_integer():
    fn = get_reward_fn("paddle_grpo.recipes.smollm2:first_number_reward")
    assert fn is sm.first_number_reward and fn.max_score == 1.0
    completions = ["19", " 19.", "The answer is 19", "8 + 11 = 19", "190", "-19", "nineteen", "19 or 20"]
    assert fn(["p"] * 8, completions, tgt=["19"] * 8) == [1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]


def test_config_loads_with_the_runs_settings(repo_root):
    cfg = load_config(str(repo_root / "configs" / "smollm2_grpo.yaml"), device="cpu", warn=False)
    assert cfg.actor_model_name_or_path == sm.MODEL_DIR and not cfg.build_actor_if_missing
    assert get_reward_fn(cfg.reward_funcs) is sm.first_number_reward
    assert (cfg.rl_algorithm, cfg.global_batch_size, cfg.rollout_n, cfg.max_dec_len) == ("grpo", 4, 8, 12)
    assert cfg.learning_rate == 1e-5 and cfg.temperature == 1.0
    assert not cfg.needs_reference_model  # no KL: no reference model to hold
    assert cfg.batch_geometry(1).optimizer_steps_per_step == 1
    assert cfg.train_datasets == "data/smollm2_add/train.jsonl" and cfg.eval_datasets == "data/smollm2_add/eval.jsonl"


@pytest.mark.skipif(not os.path.isdir(os.path.join(os.path.dirname(os.path.dirname(__file__)), sm.MODEL_DIR)),
                    reason=f"{sm.MODEL_DIR} not imported ({sm.IMPORT_COMMAND})")
def test_prompt_is_the_models_own_chat_template(repo_root):
    """The committed prompts equal what the imported tokenizer's jinja template renders for one user turn (so the
    model sees the format TRL's conversational run gave it), and fit max_prompt_len."""
    from paddle_grpo.policy import load_tokenizer

    tok = load_tokenizer(str(repo_root / sm.MODEL_DIR))
    for a, b in [(1, 1), (8, 11), (20, 20)]:
        rendered = tok.apply_chat_template([{"role": "user", "content": sm.question(a, b)}], tokenize=False,
                                           add_generation_prompt=True)
        assert rendered == sm.prompt(a, b)
    cfg = load_config(str(repo_root / "configs" / "smollm2_grpo.yaml"), device="cpu", warn=False)
    assert len(tok(sm.prompt(20, 20), add_special_tokens=False)["input_ids"]) <= cfg.max_prompt_len


def test_a_missing_model_names_the_import_command(repo_root, tmp_path, monkeypatch):
    """Without the imported model, the dry run's check and the trainer's model lookup both say how to make it."""
    from paddle_grpo.dry_run import preflight
    from paddle_grpo.policy import hub

    cfg = load_config(str(repo_root / "configs" / "smollm2_grpo.yaml"), device="cpu", warn=False)
    monkeypatch.chdir(tmp_path)  # the config's relative model path does not exist here
    problems = [p for p in preflight(cfg) if p.startswith("actor_model_name_or_path")]
    assert len(problems) == 1 and sm.IMPORT_COMMAND in problems[0]
    with pytest.raises(FileNotFoundError, match="make it with: " + sm.IMPORT_COMMAND.replace(".", r"\.")):
        hub.resolve_model_dir(sm.MODEL_DIR)
    assert hub.made_by_note("build/models/other") == ""


def test_docs_show_the_committed_results(repo_root):
    """docs/smollm2.md's table is what tools/eval/smollm2_seeds.py prints for docs/results/smollm2_seeds.json, and every
    learning run's held-out accuracy there rose while every learning_rate 0 control's did not."""
    import json

    spec = importlib.util.spec_from_file_location("_smollm2_seeds", repo_root / "tools" / "eval" / "smollm2_seeds.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    with open(repo_root / "docs" / "results" / "smollm2_seeds.json", encoding="utf-8") as f:
        results = json.load(f)
    doc = (repo_root / "docs" / "smollm2.md").read_text(encoding="utf-8")
    assert tool.tables(results) in doc
    # (the training-minutes table only of the runs beside TRL: the current runs shared a loaded machine, so their
    # minutes are not shown as a speed)
    with open(repo_root / "docs" / "results" / "smollm2_seeds_ordered_split.json", encoding="utf-8") as f:
        earlier = json.load(f)  # the split by ordered pair, beside TRL's one run
    assert tool.wall_clock_table(earlier) in doc
    for run in results["runs"]:
        change = run["evals"][-1][1] - run["evals"][0][1]
        # 100 held-out problems sampled once each: a standard error of at most 5 points per evaluation
        assert change > 0.15 if run["learning_rate"] > 0 else abs(change) <= 0.1, run["name"]


def test_wall_clock_table_from_hand_made_runs(repo_root):
    """The side-by-side table in training minutes: cumulative step seconds up to each evaluation (hand-computed)."""
    spec = importlib.util.spec_from_file_location("_smollm2_seeds", repo_root / "tools" / "eval" / "smollm2_seeds.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    ours = {"name": "s7", "seed": 7, "learning_rate": 1e-5, "evals": [[0, 0.0], [2, 0.6], [3, 0.7]],
            "steps": [[1, 0.0, 30.0], [2, 0.5, 60.0], [3, 0.5, 90.0]]}
    trl = {"name": "trl_s7", "peer": "trl", "trl_version": "1.16.0", "seed": 7, "learning_rate": 1e-5,
           "evals": [[0, 0.0], [3, 0.4]], "steps": [[1, 0.0, 120.0], [2, 0.2, 120.0], [3, 0.3, 60.0]]}
    control = dict(ours, name="s7_lr0", learning_rate=0.0)
    rows = tool.wall_clock_table({"runs": [ours, trl, control]}).splitlines()
    assert len(rows) == 4  # header, rule, ours, TRL: the control has no curve to race
    # ours: median of 30, 60, 90 = 60; 180 s = 3.0 min to step 3; 0.6 >= 0.5 first at step 2 after 90 s = 1.5 min
    assert rows[2] == "| `--seed 7` | 60.0 | 3.0 (step 3) | step 2, 1.5 min (0.60) | 0.70 (step 3) |"
    # TRL: median of 120, 120, 60 = 120; 300 s = 5.0 min; never reaches 0.5
    assert rows[3] == "| TRL 1.16.0, seed 7 | 120.0 | 5.0 (step 3) | not reached | 0.40 (step 3) |"


def test_the_speed_beside_trl_is_the_recorded_pairs(repo_root):
    """README, docs/smollm2.md and docs/PERFORMANCE.md quote the three alternated pairs of
    docs/results/bench_smollm2_recipe.jsonl: each side's medians and the paired ratios, recomputed here."""
    import json

    rows = [json.loads(line) for line in
            (repo_root / "docs" / "results" / "bench_smollm2_recipe.jsonl").read_text().splitlines()]
    by = {(r["pair"], r["side"]): r["step_s_median"] for r in rows}
    pairs = sorted({r["pair"] for r in rows})
    assert pairs == [1, 2, 3] and len(rows) == 12
    assert all(r["prompt_tokens"] == rows[0]["prompt_tokens"] for r in rows)  # the same prompts on both sides

    def span(values, digits=2):
        return f"{min(values):.{digits}f}-{max(values):.{digits}f}"

    ratios = {side: [by[p, side] / by[p, "trl_2t"] for p in pairs] for side in ("ours_1t", "ours_2t", "ours_async_1t")}
    perf = (repo_root / "docs" / "PERFORMANCE.md").read_text()
    for side, label in (("ours_1t", "ours, `--threads 1`"), ("ours_2t", "ours, `--threads 2`"),
                        ("ours_async_1t", "ours, async, 1 + 1 threads"), ("trl_2t", "TRL 1.16, `--threads 2`")):
        assert f"| {label} | {', '.join(f'{by[p, side]:.2f}' for p in pairs)} |" in perf, side
    assert (f"1 thread {span(ratios['ours_1t'])}; 2 threads {span(ratios['ours_2t'])}; async "
            f"{span(ratios['ours_async_1t'])}") in perf
    readme = (repo_root / "README.md").read_text()
    trl = span([by[p, "trl_2t"] for p in pairs], 1)
    assert f"against TRL's {trl}" in " ".join(readme.split())
    assert f"{span(ratios['ours_2t'] + ratios['ours_async_1t'])}x" in " ".join(readme.split())
    assert f"{span(ratios['ours_1t'])}x" in " ".join(readme.split())


def test_the_128_token_pairs_are_the_recorded_ones(repo_root):
    """docs/PERFORMANCE.md and docs/smollm2.md quote docs/results/bench_smollm2_128.jsonl: every side's step per pair
    and the paired ratios, recomputed here."""
    import json

    rows = [json.loads(line) for line in
            (repo_root / "docs" / "results" / "bench_smollm2_128.jsonl").read_text().splitlines()]
    by = {(r["pair"], r["side"]): r["step_s_median"] for r in rows}
    pairs = sorted({r["pair"] for r in rows})
    assert len(rows) == 4 * len(pairs) and all(r["completion_len_mean"] == 128 for r in rows)

    def span(values):
        return f"{min(values):.2f}-{max(values):.2f}"

    perf = (repo_root / "docs" / "PERFORMANCE.md").read_text()
    for side, label in (("ours_1t", "ours, `--threads 1`"), ("ours_2t", "ours, `--threads 2`"),
                        ("ours_async_1t", "ours, async, 1 + 1 threads"), ("trl_2t", "TRL 1.16, `--threads 2`")):
        assert f"| {label} | {', '.join(f'{by[p, side]:.2f}' for p in pairs)} |" in perf, side
    ratios = {side: span([by[p, side] / by[p, "trl_2t"] for p in pairs])
              for side in ("ours_1t", "ours_2t", "ours_async_1t")}
    assert f"1 thread {ratios['ours_1t']}; 2 threads {ratios['ours_2t']}; async {ratios['ours_async_1t']}" in perf
    doc = " ".join((repo_root / "docs" / "smollm2.md").read_text().split())
    assert (f"was {ratios['ours_2t']} at two threads, {ratios['ours_async_1t']} asynchronous and "
            f"{ratios['ours_1t']} at one") in doc


def test_collect_run_keeps_the_metrics_asked_for(repo_root, tmp_path):
    """--keep-metric: the value at every training step, None where the step did not log it (a written run)."""
    import json

    spec = importlib.util.spec_from_file_location("_smollm2_seeds", repo_root / "tools" / "eval" / "smollm2_seeds.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    out = tmp_path / "output" / "smollm2_opd_s3"
    out.mkdir(parents=True)
    (out / "config.yaml").write_text("seed: 3\nlearning_rate: 5.0e-05\n", encoding="utf-8")
    rows = [{"step": 0, "eval/accuracy": 0.0},
            {"step": 1, "train/reward": 0.125, "perf/step_s": 20.0, "opd/reverse_kl": 2.71828},
            {"step": 2, "train/reward": 0.25, "perf/step_s": 22.0, "eval/accuracy": 0.1}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    run = tool.collect_run("opd_s3", root=str(tmp_path), keep=("opd/reverse_kl",))
    assert run["metrics"] == {"opd/reverse_kl": [2.7183, None]}
    assert (run["seed"], run["learning_rate"], run["evals"], run["wall_s"]) == (3, 5e-05, [[0, 0.0], [2, 0.1]], 42)
    assert "metrics" not in tool.collect_run("opd_s3", root=str(tmp_path))
