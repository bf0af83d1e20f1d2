"""tools/data/gen_kk.py and the solver in paddle_grpo.recipes.kk_puzzles.

The generated puzzles are checked by reading their English back: the parser and brute-force checker below share no
code with the generator or the solver, so a wrong rendering, a wrong solver or a wrong answer line all fail here.
"""
import itertools
import random
import re

import pytest

from paddle_grpo.data import read_jsonl
from paddle_grpo.recipes.kk_puzzles import evaluate, parse_statements, solve, statements_to_text

T, F = True, False

# ------------------------------------------------------------------------------------------------ hand-solved puzzles


def test_solver_on_hand_solved_puzzles():
    knight = lambda i: ("telling-truth", i)  # noqa: E731
    knave = lambda i: ("lying", i)  # noqa: E731
    # A: "A and B are both knaves." (B silent). A knight would be lying, so A is a knave; then the claim is false,
    # so B is a knight.
    assert solve([("and", knave(0), knave(1)), None]) == [(F, T)]
    # A: "A is a knave." Nobody can say that on the island.
    assert solve([knave(0)]) == []
    # A: "A is a knight." Both work.
    assert solve([knight(0)]) == [(T,), (F,)]
    # A: "B is a knave." B: "A and B are knights." B a knight would make A a knight saying B is a knave: B is a knave,
    # A tells the truth.
    assert solve([knave(1), ("and", knight(0), knight(1))]) == [(T, F)]
    # A: "If A is a knight then B is a knight." A knave would need A knight and B knave: A knight, B knight.
    assert solve([("->", knight(0), knight(1)), None]) == [(T, T)]
    # A: "A is a knight iff B is a knave." B: "A is a knave."
    assert solve([("<=>", knight(0), knave(1)), knave(0)]) == [(T, F)]
    # A: "B is not a knight or C is a knight." B: "A is a knave." C: "B is a knight."
    assert solve([("or", ("not", knight(1)), knight(2)), knave(0), knight(1)]) == [(T, F, F)]
    # silent people are free
    assert solve([None, None], 2) == [(T, T), (T, F), (F, T), (F, F)]


def test_evaluate_truth_tables():
    a = ("telling-truth", 0)
    b = ("telling-truth", 1)
    rows = list(itertools.product([T, F], repeat=2))
    assert [evaluate(("->", a, b), r) for r in rows] == [T, F, T, T]
    assert [evaluate(("<=>", a, b), r) for r in rows] == [T, F, F, T]
    assert [evaluate(("and", a, b), r) for r in rows] == [T, F, F, F]
    assert [evaluate(("or", a, b), r) for r in rows] == [T, T, T, F]
    assert [evaluate(("not", ("lying", 1)), r) for r in rows] == [T, F, T, F]
    with pytest.raises(ValueError, match="unknown statement operator 'xor'"):
        evaluate(("xor", a, b), (T, T))
    text = "(('lying', 1), ('<=>', ('telling-truth', 0), ('lying', 1)))"
    assert statements_to_text(parse_statements(text)) == text


# ------------------------------------------------------------------------------------------------ independent checker

ATOM = r"(\w+) is (not )?a (knight|knave)"
FORMS = [
    ("iff", re.compile(rf"{ATOM} if and only if {ATOM}")),
    ("if", re.compile(rf"[Ii]f {ATOM} then {ATOM}")),
    ("and", re.compile(rf"{ATOM} and {ATOM}")),
    ("or", re.compile(rf"{ATOM} or {ATOM}")),
    ("atom", re.compile(ATOM)),
]


def atom_value(name, negated, kind, world):
    value = world[name] if kind == "knight" else not world[name]
    return not value if negated else value


def parse_claim(claim):
    """English claim -> function of a world {name: is_knight}."""
    claim = claim[0].upper() + claim[1:]
    for form, pattern in FORMS:
        m = pattern.fullmatch(claim) or pattern.fullmatch(claim[0].lower() + claim[1:])
        if not m:
            continue
        g = m.groups()
        if form == "atom":
            return lambda w: atom_value(g[0], g[1], g[2], w)
        x = lambda w: atom_value(g[0], g[1], g[2], w)  # noqa: E731
        y = lambda w: atom_value(g[3], g[4], g[5], w)  # noqa: E731
        return {
            "iff": lambda w: x(w) == y(w),
            "if": lambda w: (not x(w)) or y(w),
            "and": lambda w: x(w) and y(w),
            "or": lambda w: x(w) or y(w),
        }[form]
    raise AssertionError(f"claim outside the grammar: {claim!r}")


def parse_quiz(src):
    """The templated prompt of a generated puzzle -> (names, [(speaker, claim function)])."""
    quiz = re.fullmatch(r"<\|im_start\|>system\n.*\n<\|im_end\|>\n<\|im_start\|>user\n(.*)\n<\|im_end\|>\n"
                        r"<\|im_start\|>assistant\n<think>", src, re.S).group(1)
    m = re.fullmatch(r"On this island every inhabitant is either a knight, who always tells the truth, or a knave, "
                     r"who always lies\. You meet (\d+) inhabitants: (.*?)\. (.*) So who is a knight and who is a "
                     r"knave\?", quiz)
    count, people, body = int(m.group(1)), m.group(2), m.group(3)
    names = re.split(r", and |, | and ", people)
    assert len(names) == count
    sentences = re.split(r'(?<=\.) |(?<=\.") ', body)
    assert len(sentences) == count, sentences
    said = []
    for sentence in sentences:
        if '"' in sentence:
            claim = sentence[sentence.index('"') + 1:sentence.rindex('"')].rstrip(".,")
        else:
            claim = sentence.split(" that ", 1)[1].rstrip(".")
        outside = sentence.replace(claim, " ")
        speakers = [n for n in names if re.search(rf"\b{n}\b", outside)]
        assert len(speakers) == 1, sentence
        said.append((speakers[0], parse_claim(claim)))
    return names, said


def check_record(rec):
    """Exactly one world satisfies the rendered puzzle, and the tgt and solution columns state it."""
    names, said = parse_quiz(rec["src"])
    worlds = []
    for values in itertools.product([F, T], repeat=len(names)):
        world = dict(zip(names, values))
        if all(claim(world) == world[speaker] for speaker, claim in said):
            worlds.append(world)
    assert len(worlds) == 1, rec["src"]
    answer = re.findall(r"\((\d+)\) (\w+) is a (knight|knave)", rec["tgt"])
    assert [int(i) for i, _, _ in answer] == list(range(1, len(names) + 1))
    assert [n for _, n, _ in answer] == names
    assert {n: k == "knight" for _, n, k in answer} == worlds[0]
    assert rec["solution"] == [worlds[0][n] for n in names]
    assert sorted(s for s, _ in said) == sorted(names)


def test_checker_rejects_a_wrong_answer(repo_root):
    """The checker can fail: flip the first person of a shipped answer."""
    rec = read_jsonl(repo_root / "data" / "kk_synthetic_eval.jsonl")[0]
    check_record(rec)
    flipped = re.sub(r"knight|knave", lambda m: "knave" if m.group(0) == "knight" else "knight", rec["tgt"], count=1)
    assert flipped != rec["tgt"]
    with pytest.raises(AssertionError):
        check_record(dict(rec, tgt=flipped))
    with pytest.raises(AssertionError):
        check_record(dict(rec, solution=[not rec["solution"][0]] + rec["solution"][1:]))


# ------------------------------------------------------------------------------------------------ the generator

@pytest.mark.parametrize("people", range(2, 9))
def test_generated_puzzles_have_one_solution_for_every_size(load_tool, tmp_path, people):
    gen = load_tool("data/gen_kk")
    out = tmp_path / "kk.jsonl"
    num = 12 if people <= 5 else 4
    assert gen.main(["--num", str(num), "--min-people", str(people), "--max-people", str(people), "--seed", "11",
                     "--output", str(out)]) == 0
    records = read_jsonl(out)
    assert len(records) == num
    for rec in records:
        assert len(rec["solution"]) == people
        check_record(rec)


def test_every_statement_form_is_rendered_and_checked(load_tool):
    gen = load_tool("data/gen_kk")
    puzzles = gen.generate(300, 3, 4, seed=2)
    ops = {s[0] for p in puzzles for s in p["statements"]}
    assert ops == {"telling-truth", "lying", "not", "and", "or", "->", "<=>"}
    templates = set()
    for k, p in enumerate(puzzles):
        assert solve(p["statements"]) == [p["solution"]]
        rec = gen.to_record(p, str(k))
        check_record(dict(rec, src=rec["src"][0], tgt=rec["tgt"][0]))
        for sentence in gen.SPEECH:
            head = sentence.split("{")[0]
            if head and head in p["quiz"]:
                templates.add(sentence)
    assert len(templates) >= 3


def test_generator_is_deterministic(load_tool, tmp_path):
    gen = load_tool("data/gen_kk")
    args = ["--num", "40", "--min-people", "2", "--max-people", "6", "--eval-num", "10"]
    outs = []
    for run, seed in enumerate(["4", "4", "5"]):
        out, ev = tmp_path / f"t{run}.jsonl", tmp_path / f"e{run}.jsonl"
        gen.main(args + ["--seed", seed, "--output", str(out), "--eval-output", str(ev)])
        outs.append((out.read_bytes(), ev.read_bytes()))
    assert outs[0] == outs[1] and outs[0][0] != outs[2][0]
    assert gen.generate(5, 3, 3, seed=9) == gen.generate(5, 3, 3, seed=9)


def test_canonical_key_ignores_renaming_and_operand_order(load_tool):
    gen = load_tool("data/gen_kk")
    # A: "B is a knave and C is a knight"; B: "A is a knave"; C: "A iff B". Solved by hand: A knave, B knight,
    # C knave.
    p = [("and", ("lying", 1), ("telling-truth", 2)), ("lying", 0),
         ("<=>", ("telling-truth", 0), ("telling-truth", 1))]
    # the same people listed as C, A, B (old i -> new (i + 1) % 3), operands swapped
    q = [("<=>", ("telling-truth", 2), ("telling-truth", 1)), ("and", ("telling-truth", 0), ("lying", 2)),
         ("lying", 1)]
    assert solve(p) == [(F, T, F)] and solve(q) == [(F, F, T)]
    assert gen.canonical_key(p) == gen.canonical_key(q)
    r = [("and", ("lying", 1), ("telling-truth", 2)), ("lying", 0), ("->", ("telling-truth", 0),
                                                                     ("telling-truth", 1))]
    assert gen.canonical_key(p) != gen.canonical_key(r)


def test_generator_limits(load_tool):
    gen = load_tool("data/gen_kk")
    with pytest.raises(ValueError, match="within 2..8"):
        gen.generate_puzzle(random.Random(0), 9)
    with pytest.raises(ValueError):
        gen.generate(3, 1, 3, seed=0)
    # there are only 164 distinct 2-person puzzles in the grammar: asking for more fails instead of looping
    with pytest.raises(RuntimeError, match="distinct puzzles with 2..2 people"):
        gen.generate(200, 2, 2, seed=0, max_repeats=300)
    with pytest.raises(SystemExit):
        gen.main(["--num", "3", "--output", "x.jsonl", "--max-people", "9"])


def test_names_are_distinct_and_never_inside_one_another(load_tool):
    names = load_tool("data/gen_kk").NAMES
    assert len(set(names)) == len(names) >= 8
    for a, b in itertools.permutations(names, 2):
        assert a.lower() not in b.lower(), (a, b)
    assert all(re.fullmatch(r"[A-Z][a-z]+", n) for n in names)


# ------------------------------------------------------------------------------------------------ shipped data

def test_shipped_data_parses_is_correct_and_disjoint(repo_root):
    train = read_jsonl(repo_root / "data" / "kk_synthetic_train.jsonl")
    evaluation = read_jsonl(repo_root / "data" / "kk_synthetic_eval.jsonl")
    assert len(train) == 2000 and len(evaluation) == 200
    for rec in train + evaluation:
        check_record(rec)
    assert len({r["src"] for r in train}) == 2000
    assert not {r["src"] for r in train} & {r["src"] for r in evaluation}
    assert {len(r["solution"]) for r in train} == {2, 3, 4} == {len(r["solution"]) for r in evaluation}
    total = sum((repo_root / "data" / f).stat().st_size
                for f in ("kk_synthetic_train.jsonl", "kk_synthetic_eval.jsonl"))
    assert total < 3_000_000


def test_shipped_data_is_reproduced_by_the_recorded_command(load_tool, repo_root, tmp_path):
    readme = (repo_root / "data" / "README.md").read_text(encoding="utf-8")
    command = re.search(r"```\n(python tools/data/gen_kk\.py .*?)\n```", readme, re.S).group(1).replace("\\\n", " ")
    argv = command.split()[2:]
    argv[argv.index("--output") + 1] = str(tmp_path / "train.jsonl")
    argv[argv.index("--eval-output") + 1] = str(tmp_path / "eval.jsonl")
    load_tool("data/gen_kk").main(argv)
    assert (tmp_path / "train.jsonl").read_bytes() == (repo_root / "data" / "kk_synthetic_train.jsonl").read_bytes()
    assert (tmp_path / "eval.jsonl").read_bytes() == (repo_root / "data" / "kk_synthetic_eval.jsonl").read_bytes()
