"""tools/eval/quickstart_seeds.py: the summary of finished runs, and the tables README.md / docs/quickstart.md show."""
import json


def _fake_run(root, name, policy, evals, sft_steps):
    out = root / "output" / name
    out.mkdir(parents=True)
    with open(out / "metrics.jsonl", "w") as f:
        for step in range(0, 61):
            row = {"step": step, "train/reward": 0.1}
            if step in evals:
                row["eval/accuracy"] = evals[step]
            f.write(json.dumps(row) + "\n")
    (root / "build" / policy).mkdir(parents=True, exist_ok=True)
    (root / "build" / policy / "build_info.json").write_text(json.dumps({"sft_steps": sft_steps}))


def test_summary_reads_first_last_and_range_of_evals(load_tool, tmp_path):
    tool = load_tool("eval/quickstart_seeds")
    _fake_run(tmp_path, "s7", "qs_s7", {0: 0.5, 30: 0.75, 60: 0.7}, 450)
    row = tool.summarise(7, False, wall_s=181.6, root=str(tmp_path))
    assert row == {"seed": 7, "learning_rate_0": False, "sft_steps": 450, "eval_first": 0.5, "eval_last": 0.7,
                   "last_step": 60, "eval_all_min": 0.5, "eval_all_max": 0.75, "wall_s": 182,
                   "eval": [[0, 0.5], [30, 0.75], [60, 0.7]]}
    # A run's config.yaml (Config.format): every key as resolved, and what each unset one took.
    out = tmp_path / "output" / "s7" / "config.yaml"
    out.write_text("# AlgorithmArguments\nrl_algorithm: vapo\npretrain_critic_steps: null  # null = rl_algorithm "
                   "vapo's default 50\nclip_range_ratio: 0.2\n")
    row = tool.summarise(7, False, wall_s=181.6, root=str(tmp_path))
    assert row["config"] == {"rl_algorithm": "vapo", "pretrain_critic_steps": None, "clip_range_ratio": 0.2}
    assert row["config_unset"] == {"pretrain_critic_steps": "rl_algorithm vapo's default 50"}


def test_tables_give_ranges_over_seeds_and_controls(load_tool):
    tool = load_tool("eval/quickstart_seeds")
    runs = [dict(seed=1, learning_rate_0=False, sft_steps=475, eval_first=0.478, eval_last=0.831, last_step=300,
                 eval_all_min=0.478, eval_all_max=0.831, wall_s=180),
            dict(seed=2, learning_rate_0=False, sft_steps=450, eval_first=0.471, eval_last=0.934, last_step=300,
                 eval_all_min=0.471, eval_all_max=0.934, wall_s=None),
            dict(seed=1, learning_rate_0=True, sft_steps=475, eval_first=0.478, eval_last=0.506, last_step=300,
                 eval_all_min=0.478, eval_all_max=0.512, wall_s=176)]
    text = tool.tables({"machine": {}, "runs": runs})
    # gains: 0.831-0.478 = +35.3, 0.934-0.471 = +46.3; control 0.506-0.478 = +2.8
    assert text.splitlines()[0] == ("Over 2 seeds: step 0 0.471-0.478, step 300 0.831-0.934, **+35.3 to +46.3 "
                                    "points**; with `learning_rate 0`: +2.8 to +2.8 points.")
    assert "| `--seed 1` | 475 | 0.478 | 0.831 | +35.3 | 180 s |" in text
    assert "| `--seed 2` | 450 | 0.471 | 0.934 | +46.3 |  |" in text
    assert "| `--seed 1 --learning_rate 0` | 475 | 0.478 | 0.506 | +2.8 (all evals 0.478-0.512) | 176 s |" in text


# beside quickstart_seeds.json (Intel)
OTHER_MACHINES = ("quickstart_seeds_amd.json", "quickstart_seeds_zen5.json", "quickstart_seeds_zen4.json")


def test_readme_and_quickstart_doc_show_the_recorded_runs(load_tool, repo_root):
    """The numbers docs/quickstart.md gives are the ones tools/eval/quickstart_seeds.py recorded, on the machine they
    name; README.md gives the overall range (its first screen and its status table)."""
    tool = load_tool("eval/quickstart_seeds")
    with open(repo_root / "docs" / "results" / "quickstart_seeds.json", encoding="utf-8") as f:
        results = json.load(f)
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    doc = (repo_root / "docs" / "quickstart.md").read_text(encoding="utf-8")
    text = tool.tables(results)
    summary_line, table = text.split("\n", 1)
    assert summary_line in doc
    assert table.strip() in doc
    assert results["machine"]["cpu"] in doc and f"{results['machine']['cores']} cores" in doc
    # the wall-time range is the recorded one of the runs that built their own policy (not the controls)
    walls = [r["wall_s"] for r in results["runs"] if r["wall_s"] is not None and not r["learning_rate_0"]]
    assert f"{min(walls) / 60:.1f}-{max(walls) / 60:.1f} min" in doc
    # the other machines' runs (AMD EPYC with AVX2, Zen 5 and Zen 4 EPYC with AVX-512) and the ranges over all of them
    others = []
    for name in OTHER_MACHINES:
        with open(repo_root / "docs" / "results" / name, encoding="utf-8") as f:
            others.append(json.load(f))
        line, other_table = tool.tables(others[-1]).split("\n", 1)
        assert line in doc and other_table.strip() in doc, name
        assert others[-1]["machine"]["cpu"] in doc and f"{others[-1]['machine']['cores']} cores" in doc
    every = [results] + others
    assert tool.combined(every).strip() in doc
    runs = [r for res in every for r in res["runs"] if not r["learning_rate_0"]]
    controls = [r for res in every for r in res["runs"] if r["learning_rate_0"]]
    gains = [100 * (r["eval_last"] - r["eval_first"]) for r in runs]
    control_gains = [100 * (r["eval_last"] - r["eval_first"]) for r in controls]
    machines = {2: "two", 3: "three", 4: "four"}[len(every)]
    assert (f"{min(gains):+.1f} to {max(gains):+.1f} points held-out accuracy over {len(runs)} runs on {machines} "
            f"machines") in readme
    assert f"rises by {min(gains):.1f} to {max(gains):.1f} points ({len(runs)} runs on {machines} machines" in readme
    assert f"`learning_rate: 0` {min(control_gains):+.1f} to {max(control_gains):+.1f}" in readme


def test_tables_without_controls(load_tool):
    tool = load_tool("eval/quickstart_seeds")
    run = dict(seed=5, learning_rate_0=False, sft_steps=400, eval_first=0.5, eval_last=0.75, last_step=300,
               eval_all_min=0.5, eval_all_max=0.75, wall_s=100)
    assert tool.tables({"runs": [run]}).splitlines()[0] == ("Over 1 seeds: step 0 0.500-0.500, step 300 "
                                                            "0.750-0.750, **+25.0 to +25.0 points**.")


def test_tables_of_controls_only(load_tool):
    # `--seeds "" --controls 1,2` (more controls for a file of earlier runs) printed its tables with a crash
    tool = load_tool("eval/quickstart_seeds")
    run = dict(seed=1, learning_rate_0=True, sft_steps=400, eval_first=0.5, eval_last=0.47, last_step=30,
               eval_all_min=0.46, eval_all_max=0.5, wall_s=100)
    lines = tool.tables({"runs": [run]}).splitlines()
    assert lines[0] == "Controls only: with `learning_rate 0`: -3.0 to -3.0 points."
    assert lines[4] == "| `--seed 1 --learning_rate 0` | 400 | 0.500 | 0.470 | -3.0 (all evals 0.460-0.500) | 100 s |"


def test_combined_ranges_over_machines(load_tool):
    tool = load_tool("eval/quickstart_seeds")

    def run(seed, control, first, last):
        return dict(seed=seed, learning_rate_0=control, sft_steps=400, eval_first=first, eval_last=last,
                    last_step=300, eval_all_min=first, eval_all_max=last, wall_s=None)

    intel = {"runs": [run(1, False, 0.5, 0.8), run(1, True, 0.5, 0.48)]}
    amd = {"runs": [run(1, False, 0.45, 0.9), run(2, False, 0.55, 0.7), run(1, True, 0.45, 0.456)]}
    # gains +30.0, +45.0, +15.0; controls -2.0, +0.6
    assert tool.combined([intel, amd]) == ("Over 2 machines (3 runs): step 0 0.450-0.550, step 300 0.700-0.900, "
                                           "**+15.0 to +45.0 points**; with `learning_rate 0` (2 runs): -2.0 to "
                                           "+0.6 points.\n")


def test_another_config_gets_its_own_paths_and_the_critic_follows_the_policy(load_tool, tmp_path):
    """--config configs/quickstart_ppo.yaml: runs in output/ppo_s<s> with their own policy build/qs_ppo_s<s>, and
    the critic (critic_model_name_or_path == actor path in the file) is passed the same per-seed policy."""
    tool = load_tool("eval/quickstart_seeds")
    assert tool.run_prefix("configs/quickstart.yaml") == ""
    assert tool.run_prefix("configs/quickstart_ppo.yaml") == "ppo_"
    assert tool.run_paths(42, True, "ppo_") == {"policy": "build/qs_ppo_s42", "output": "output/ppo_s42_lr0"}
    assert tool.run_paths(42, False) == {"policy": "build/qs_s42", "output": "output/s42"}
    assert tool.critic_follows_policy("configs/quickstart_ppo.yaml")
    assert not tool.critic_follows_policy("configs/quickstart.yaml")
    _fake_run(tmp_path, "ppo_s3", "qs_ppo_s3", {0: 0.5, 60: 0.7}, 400)
    row = tool.summarise(3, False, root=str(tmp_path), prefix="ppo_")
    assert (row["sft_steps"], row["eval_first"], row["eval_last"]) == (400, 0.5, 0.7)


def test_ppo_results_match_the_docs(load_tool, repo_root):
    """The PPO quickstart's numbers in docs/quickstart.md (and README.md's status table) are the ones recorded in
    docs/results/quickstart_ppo_seeds.json (tools/eval/quickstart_seeds.py --config configs/quickstart_ppo.yaml)."""
    tool = load_tool("eval/quickstart_seeds")
    with open(repo_root / "docs" / "results" / "quickstart_ppo_seeds.json", encoding="utf-8") as f:
        results = json.load(f)
    assert results["config"] == "configs/quickstart_ppo.yaml" and results["run_args"] == ""
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    doc = (repo_root / "docs" / "quickstart.md").read_text(encoding="utf-8")
    summary_line, table = tool.tables(results).split("\n", 1)
    assert summary_line in doc and table.strip() in doc
    gains = [100 * (r["eval_last"] - r["eval_first"]) for r in results["runs"] if not r["learning_rate_0"]]
    assert f"{min(gains):+.1f} to {max(gains):+.1f} points over {len(gains)} seeds" in readme
    assert results["machine"]["cpu"] in doc
    runs = [r for r in results["runs"] if not r["learning_rate_0"]]
    assert len(runs) >= 3 and min(r["eval_last"] - r["eval_first"] for r in runs) >= 0.15  # the bar


def test_vapo_results_match_the_docs_and_name_every_effective_key(load_tool, repo_root):
    """docs/quickstart.md's VAPO table and trajectory are docs/results/quickstart_vapo_seeds.json's, and each run
    recorded its resolved config: vapo's defaults as the trainer took them."""
    tool = load_tool("eval/quickstart_seeds")
    with open(repo_root / "docs" / "results" / "quickstart_vapo_seeds.json", encoding="utf-8") as f:
        results = json.load(f)
    assert results["run_args"] == "--rl_algorithm vapo --pretrain_critic_steps null --normalize_advantage false"
    doc = (repo_root / "docs" / "quickstart.md").read_text(encoding="utf-8")
    summary_line, table = tool.tables(results).split("\n", 1)
    assert summary_line in doc and table.strip() in doc
    for run in results["runs"]:
        config, unset = run["config"], run["config_unset"]
        assert config["rl_algorithm"] == "vapo" and config["normalize_advantage"] is False
        assert unset["pretrain_critic_steps"] == "rl_algorithm vapo's default 50"
        assert unset["clip_range_ratio_high"] == "rl_algorithm vapo's default 0.28"
        assert run["effective"]["pretrain_critic_steps"] == 50 and run["effective"]["clip_range_ratio_high"] == 0.28
    seed42 = results["runs"][0]
    assert ", ".join(f"{a:.3f}" for _, a in seed42["eval"][3:]) in doc.replace("\n", " ")  # steps 60-200


def test_tool_runs_record_tool_use_and_accuracy_with_and_without_tools(load_tool, tmp_path):
    """A multi-turn run's row keeps the first and last eval/tool_use_rate and accuracy with / without tools (nan,
    an accuracy over no sample, becomes None and prints as "-"); --tables adds the second table."""
    tool = load_tool("eval/quickstart_seeds")
    out = tmp_path / "output" / "tools_s5"
    out.mkdir(parents=True)
    rows = [{"step": 0, "eval/accuracy": 0.25, "eval/tool_use_rate": 0.3, "eval/accuracy_with_tools": 0.8,
             "eval/accuracy_without_tools": 0.0125},
            {"step": 5, "train/reward": 0.5},
            {"step": 60, "eval/accuracy": 0.9, "eval/tool_use_rate": 1.0, "eval/accuracy_with_tools": 0.9,
             "eval/accuracy_without_tools": float("nan")}]
    (out / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))  # nan is written as NaN
    (tmp_path / "build" / "qs_tools_s5").mkdir(parents=True)
    (tmp_path / "build" / "qs_tools_s5" / "build_info.json").write_text(json.dumps({"sft_steps": 300}))
    row = tool.summarise(5, False, wall_s=600.4, root=str(tmp_path), prefix="tools_")
    assert row["tools"] == {"tool_use": [0.3, 1.0], "accuracy_with_tools": [0.8, 0.9],
                            "accuracy_without_tools": [0.0125, None]}
    assert (row["eval_first"], row["eval_last"], row["last_step"], row["wall_s"]) == (0.25, 0.9, 60, 600)
    text = tool.tables({"runs": [row]})
    assert text.splitlines()[0] == "Over 1 seeds: step 0 0.250-0.250, step 60 0.900-0.900, **+65.0 to +65.0 points**."
    assert "| `--seed 5` | 0.300 -> 1.000 | 0.800 -> 0.900 | 0.013 -> - |" in text.splitlines()
    # a single-turn run has no tool row and no second table
    _fake_run(tmp_path, "s6", "qs_s6", {0: 0.5, 60: 0.7}, 400)
    plain = tool.summarise(6, False, root=str(tmp_path))
    assert "tools" not in plain and "tool use" not in tool.tables({"runs": [plain]})


def test_tools_results_match_the_docs(load_tool, repo_root):
    """The tool quickstart's numbers in docs/quickstart.md (and README.md's status table) are the ones recorded in
    docs/results/quickstart_tools_seeds.json (tools/eval/quickstart_seeds.py --config configs/quickstart_tools.yaml),
    and they meet the issue's bar: every seed gains at least 20 points within 15 minutes including the policy
    build; the learning_rate 0 control stays within the evaluation's noise."""
    tool = load_tool("eval/quickstart_seeds")
    with open(repo_root / "docs" / "results" / "quickstart_tools_seeds.json", encoding="utf-8") as f:
        results = json.load(f)
    assert results["config"] == "configs/quickstart_tools.yaml" and results["run_args"] == ""
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    doc = (repo_root / "docs" / "quickstart.md").read_text(encoding="utf-8")
    summary_line, tables = tool.tables(results).split("\n", 1)
    assert summary_line in doc and tables.strip() in doc and results["machine"]["cpu"] in doc
    assert tool.tool_table(results).strip() in doc
    runs = [r for r in results["runs"] if not r["learning_rate_0"]]
    controls = [r for r in results["runs"] if r["learning_rate_0"]]
    assert len(runs) >= 3 and controls and all("tools" in r for r in results["runs"])
    assert min(r["eval_last"] - r["eval_first"] for r in runs) >= 0.20
    assert max(r["wall_s"] for r in runs) <= 15 * 60
    # 500 problems: standard error of a difference of two evaluations at most 100 * sqrt(2 * 0.25 / 500) = 3.2
    # points; 3 standard errors
    assert all(abs(r["eval_last"] - r["eval_first"]) < 0.095 for r in controls)
    gains = [100 * (r["eval_last"] - r["eval_first"]) for r in runs]
    assert f"{min(gains):+.1f} to {max(gains):+.1f} points over {len(runs)} seeds" in readme
