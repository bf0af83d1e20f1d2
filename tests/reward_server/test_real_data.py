"""Real K&K and GSM8K rows from ../shared/data through a real server and the client: gold answers (and harmless
rewrites of them) score maximal, perturbed answers score what PaddleNLP's rules / the GSM8K check say."""
import json
import random
from decimal import Decimal

import pandas as pd
import pytest

from paddle_grpo.rewards.client import RewardClient
from paddle_grpo.rewards.kk import parse_ground_truth
from reward_server import create_app

pytestmark = pytest.mark.shared_data
ROWS = 200


def score_all(client, src, tgt, response, batch=64):
    out = []
    for i in range(0, len(response), batch):
        out += client.score(src[i:i + batch], tgt[i:i + batch], response[i:i + batch])
    return out


def load_kk(shared_data):
    frames = [pd.read_parquet(shared_data / "kk" / f"{n}ppl" / "train.parquet") for n in (3, 4, 5)]
    rows = pd.concat(frames, ignore_index=True)
    return rows.sample(n=ROWS, random_state=0).to_dict("records")


def numbered(pairs):
    return "\n".join(f"({i}) {name} is a {role}" for i, (name, role) in enumerate(pairs, 1))


def kk_cases(row, rng):
    """(response, expected score) pairs for one puzzle. The expected statuses come from the `names` and `solution`
    columns, independently of the `tgt` text the reward parses."""
    pairs = [(name, "knight" if is_knight else "knave") for name, is_knight in zip(row["names"], row["solution"])]
    think = " ".join([row["cot_head"], *row["cot_repeat_steps"], row["cot_foot"]])

    def respond(answer, prefix=""):
        return f"{prefix}{think}</think>\n<answer>{answer}</answer>"

    shuffled = pairs[:]
    rng.shuffle(shuffled)
    shouted = "\n\n".join(f"  ({i})   {name.upper()}   is a  {role.capitalize()} " for i, (name, role)
                          in enumerate(shuffled, 1))
    flip = rng.randrange(len(pairs))
    flipped = [(n, ("knave" if r == "knight" else "knight") if i == flip else r) for i, (n, r) in enumerate(pairs)]
    return [
        (respond(numbered(pairs)), 3.0),
        (respond(numbered(pairs), prefix="<think>"), 3.0),
        (respond(numbered(shuffled)), 3.0),
        (respond(shouted), 3.0),
        (respond(row["solution_text"]), 3.0),
        (respond(numbered(flipped)), -0.5),                                  # format +1, wrong answer -1.5
        (respond(numbered(pairs[1:])), -1.0),                                # a person missing: unparseable
        (respond(numbered(pairs)).replace("</answer>", ""), -3.0),          # broken format
        (respond(numbered(pairs)) + "\n<answer>" + numbered(pairs) + "</answer>", -3.0),  # two answers
    ]


def test_kk_real_puzzles(shared_data, serve):
    rng = random.Random(0)
    client = RewardClient(serve(create_app("kk")).url, max_retries=0)
    src, tgt, response, expected = [], [], [], []
    for row in load_kk(shared_data):
        truth = {name.lower(): "knight" if k else "knave" for name, k in zip(row["names"], row["solution"])}
        assert parse_ground_truth(row["solution_text_format"]) == truth
        for text, value in kk_cases(row, rng):
            src.append(row["prompt"][0]["content"])
            tgt.append(row["solution_text_format"])
            response.append(text)
            expected.append(value)
    scores = score_all(client, src, tgt, response)
    wrong = [(r[-300:], e, s) for r, e, s in zip(response, expected, scores) if s != e]
    assert not wrong, f"{len(wrong)} of {len(scores)} wrong, first: {wrong[:3]}"
    assert expected.count(3.0) == 5 * ROWS


def load_gsm8k(shared_data):
    rows = [json.loads(line) for line in open(shared_data / "gsm8k" / "train.jsonl", encoding="utf-8")]
    chosen = random.Random(0).sample(rows, ROWS)
    # Every row whose answer has thousands separators too: the normalisation must hold on all of them.
    return chosen + [r for r in rows if "," in r["answer"].rsplit("####", 1)[1] and r not in chosen]


def test_gsm8k_real_problems(shared_data, serve):
    client = RewardClient(serve(create_app("gsm8k")).url, max_retries=0, read_timeout=120)
    src, tgt, response, expected = [], [], [], []
    for row in load_gsm8k(shared_data):
        final = row["answer"].rsplit("####", 1)[1].strip()
        value = Decimal(final.replace(",", ""))
        cases = [(row["answer"], 1.0), (f"#### {final}", 1.0), (f"\\boxed{{{final}}}", 1.0),
                 (f"So the answer is {value}.", 1.0), (f"#### {value + 1}", 0.0), (f"\\boxed{{{value * 2 + 1}}}", 0.0),
                 ("I cannot solve this.", 0.0)]
        for text, score in cases:
            src.append(row["question"])
            tgt.append(row["answer"])
            response.append(text)
            expected.append(score)
    scores = score_all(client, src, tgt, response)
    wrong = [(r[-200:], t[-30:], e, s) for r, t, e, s in zip(response, tgt, expected, scores) if s != e]
    assert not wrong, f"{len(wrong)} of {len(scores)} wrong, first: {wrong[:3]}"
