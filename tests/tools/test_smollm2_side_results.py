"""docs/smollm2.md's distillation and bfloat16 tables are what their results files hold: each row is rebuilt here
from docs/results/smollm2_opd.json / smollm2_rollout_precision.json (every step's reward, every evaluation) and
must appear in the page as written."""
import json
import pathlib
import statistics

REPO = pathlib.Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "smollm2.md").read_text(encoding="utf-8")


def runs(name):
    data = json.loads((REPO / "docs" / "results" / name).read_text(encoding="utf-8"))
    return {r["name"]: r for r in data["runs"]}


def accuracy(run, steps):
    by_step = dict((s, a) for s, a in run["evals"])
    return " / ".join(f"{by_step[s]:.2f}" for s in steps)


def correct_samples(run):
    return round(sum(reward for _, reward, _ in run["steps"]) * 32)  # 32 samples a step, reward 0 or 1


def test_the_bfloat16_table_is_the_results_file():
    r = runs("smollm2_rollout_precision.json")
    for seed in (42, 1, 2):
        f32, b16 = r[f"float32_s{seed}"], r[f"bfloat16_s{seed}"]
        steps = (0, 20, 40, 50, 60)
        row = (f"| {seed} | {accuracy(f32, steps)} | {accuracy(b16, steps)} | {correct_samples(f32)} / "
               f"{correct_samples(b16)} |")
        assert row in DOC, row
    gains = {p: sorted(round(100 * (r[f"{p}_s{s}"]["evals"][-1][1] - r[f"{p}_s{s}"]["evals"][0][1]))
                       for s in (42, 1, 2)) for p in ("float32", "bfloat16")}
    assert gains == {"float32": [67, 70, 75], "bfloat16": [48, 62, 70]}
    assert "+48 to +70 points against float32's +67 to +75" in (REPO / "docs" / "PERFORMANCE.md").read_text()


def test_the_distillation_table_is_the_results_file():
    r = runs("smollm2_opd.json")
    for name, label in (("opd_s42", "distillation, lr 5e-5, `--seed 42`"),
                        ("opd_s1", "distillation, lr 5e-5, `--seed 1`"),
                        ("opd_full_s42", "distillation, `opd_kl_estimator: full`, lr 5e-5, `--seed 42`")):
        run = r[name]
        kl = run["opd_reverse_kl"]
        row = (f"| {label} | {accuracy(run, (0, 10, 20, 30, 40))} | {correct_samples(run)} | "
               f"{statistics.mean(kl[:5]):.2f} -> {statistics.mean(kl[-5:]):.2f} |")
        assert row in DOC, row
    for name in ("24l_rl_s42", "24l_rl_s1"):
        assert all(a == 0 for _, a in r[name]["evals"])
    assert [correct_samples(r[n]) for n in ("24l_rl_s42", "24l_rl_s1")] == [0, 3]
