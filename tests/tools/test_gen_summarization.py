"""tools/data/gen_summarization.py: determinism, the shape of documents and summaries, and the shipped data files."""
import json
import re

import pytest

from paddle_grpo.data import read_jsonl
from paddle_grpo.rewards.rouge import rouge_l

COMMAND = ["--num", "400", "--eval-num", "40", "--seed", "1"]  # data/README.md's command


def _words(text):
    return re.findall(r"[a-z0-9]+", text.lower())


def test_generator_is_deterministic_and_seeded(load_tool):
    gen = load_tool("data/gen_summarization")
    assert gen.generate(30, seed=4) == gen.generate(30, seed=4)
    assert gen.generate(30, seed=4) != gen.generate(30, seed=5)
    assert gen.generate(10, seed=4) == gen.generate(30, seed=4)[:10]  # a prefix of the stream


def test_records_are_summaries_of_their_documents(load_tool):
    gen = load_tool("data/gen_summarization")
    records = gen.generate(300, seed=2)
    assert len({r["src"] for r in records}) == 300 and [r["id"] for r in records[:2]] == ["summ-0", "summ-1"]
    kinds = set()
    for r in records:
        assert r["src"].startswith("summarize: ")
        doc, summary = r["src"][len("summarize: "):], r["tgt"]
        assert 3 <= doc.count(". ") + 1 <= 8 and summary.endswith(".") and summary.count(". ") == 0
        assert len(_words(summary)) < len(_words(doc)) / 2
        # Near-extractive: every name is copied from the document, and most of the other words too.
        assert set(re.findall(r"\b[A-Z]\w+", summary[1:])) <= set(re.findall(r"\b[A-Z]\w+", doc)), r
        words = _words(summary)
        assert sum(w in set(_words(doc)) for w in words) >= 0.75 * len(words), r
        # The summary names the main event's first person or organisation, which the document mentions.
        kinds.add(next(i for i, e in enumerate(gen.EVENTS) if _fits(e["summary"], summary)))
    assert kinds == set(range(len(gen.EVENTS)))  # every event kind occurs
    # The reference is close to the right document and far from another one's.
    right = rouge_l(None, [r["src"] for r in records[:50]], tgt=[r["tgt"] for r in records[:50]])
    wrong = rouge_l(None, [r["src"] for r in records[1:51]], tgt=[r["tgt"] for r in records[:50]])
    assert sum(right) > 2 * sum(wrong)


def _fits(template, text):
    """Does `text` match a summary template (slots as wildcards)?"""
    pattern = re.escape(template[0].upper() + template[1:])
    return re.fullmatch(re.sub(r"\\\{\w+\\\}", ".+", pattern), text) is not None


def test_prefix_and_cli(load_tool, tmp_path):
    gen = load_tool("data/gen_summarization")
    out, ev = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    assert gen.main(["--num", "5", "--eval-num", "3", "--seed", "9", "--prefix", "", "--output", str(out),
                     "--eval-output", str(ev)]) == 0
    train, held = read_jsonl(str(out)), read_jsonl(str(ev))
    assert len(train) == 5 and len(held) == 3 and not train[0]["src"].startswith("summarize")
    assert [r["src"] for r in train + held] == [r["src"] for r in gen.generate(8, seed=9, prefix="")]
    with pytest.raises(SystemExit):
        gen.main(["--num", "5", "--eval-num", "3", "--output", str(out)])  # eval records need a file


def test_shipped_data_is_reproduced_by_the_recorded_command(load_tool, repo_root, tmp_path):
    gen = load_tool("data/gen_summarization")
    out, ev = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    gen.main(COMMAND + ["--output", str(out), "--eval-output", str(ev)])
    shipped = repo_root / "data"
    assert (shipped / "summarization_train.jsonl").read_bytes() == out.read_bytes()
    assert (shipped / "summarization_eval.jsonl").read_bytes() == ev.read_bytes()
    size = sum((shipped / f"summarization_{p}.jsonl").stat().st_size for p in ("train", "eval"))
    assert size < 300_000
    train = read_jsonl(str(shipped / "summarization_train.jsonl"))
    held = read_jsonl(str(shipped / "summarization_eval.jsonl"))
    assert not {r["src"] for r in train} & {r["src"] for r in held}
    assert json.loads((shipped / "summarization_eval.jsonl").read_text().splitlines()[0])["id"] == "summ-400"
