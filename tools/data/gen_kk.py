"""Generate Knights-and-Knaves puzzles with exactly one solution, as src/tgt JSONL (the project's own K&K data).

    python tools/data/gen_kk.py --num 2000 --min-people 2 --max-people 4 --seed 1 \
        --output data/kk_synthetic_train.jsonl [--eval-num 200 --eval-output data/kk_synthetic_eval.jsonl]

Each person (2..8, names drawn from NAMES, which this tool owns) makes one statement from a small grammar:
"X is a knight", "X is a knave", "X is not a knight/knave", and two such simple claims joined by "and", "or",
"if ... then ...", or "... if and only if ...". A brute-force solver (`paddle_grpo.recipes.kk_puzzles.solve`, all 2^N
assignments) keeps only puzzles with exactly one consistent assignment; others are discarded and resampled.
Puzzles are also unique as logic: two puzzles that differ only by renaming or reordering the people are never
both emitted (`canonical_key`), so the train and eval outputs, drawn from one stream, are disjoint.

Output lines have seed 003's format, built by the same code as `tools/data/convert_kk.py`:
`src` [K&K system prompt + quiz + `<|im_start|>assistant\\n<think>`], `tgt` ["(1) Name is a knight\\n..."],
`solution` (list of bools, True = knight) and `id`. Everything is drawn from `random.Random(seed)`, so a seed
always gives the same file (for a given Python 3 version; the generator uses only `random`'s stable methods).

Left out on purpose: nested compound claims ("not (A and B)", which English renders ambiguously), claims about
what someone else said, people who stay silent, difficulty control beyond the number of people, and
chain-of-thought solutions.
"""
from __future__ import annotations

import argparse
import itertools
import os
import random
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from paddle_grpo.data import write_jsonl  # noqa: E402
from paddle_grpo.recipes.kk_puzzles import build_kk_prompt, format_kk_solution, solve  # noqa: E402

MIN_PEOPLE, MAX_PEOPLE = 2, 8
EXACT_DEDUP_PEOPLE = 5

# Common first names; none is a substring of another, so answers can be matched by name.
NAMES = (
    "Alice", "Bruno", "Clara", "Daniel", "Elena", "Felix", "Grace", "Hugo", "Irene", "Jonas", "Karen", "Leo",
    "Maria", "Nathan", "Olga", "Peter", "Quinn", "Rosa", "Simon", "Tessa", "Victor", "Wendy", "Xavier", "Yara",
    "Zack", "Amir", "Bianca", "Carlos", "Diana", "Ethan", "Fiona", "George", "Hannah", "Ivan", "Julia", "Kevin",
    "Laura", "Marco", "Nora", "Oscar", "Paula", "Rachel", "Sergio", "Tina", "Umar", "Vera", "William", "Yusuf",
)

# How a statement is attributed to its speaker. The claim is either quoted or follows " that ".
SPEECH = (
    '{name} says, "{Claim}."',
    '{name} claims that {claim}.',
    '"{Claim}," says {name}.',
    '{name} tells you that {claim}.',
    'According to {name}, "{Claim}."',
    '{name} insists: "{Claim}."',
    '{name} states that {claim}.',
    '"{Claim}," {name} declares.',
    'When asked, {name} answers: "{Claim}."',
    '{name} announces that {claim}.',
)

# Relative frequency of each statement form.
FORMS = ("atom", "not", "and", "or", "->", "<=>")
FORM_WEIGHTS = (3, 1, 2, 2, 2, 2)


def render_claim(stmt, names) -> str:
    """English for a statement of the grammar above (lower-case start)."""
    op = stmt[0]
    if op == "telling-truth":
        return f"{names[stmt[1]]} is a knight"
    if op == "lying":
        return f"{names[stmt[1]]} is a knave"
    if op == "not":
        inner = stmt[1]
        if inner[0] == "telling-truth":
            return f"{names[inner[1]]} is not a knight"
        if inner[0] == "lying":
            return f"{names[inner[1]]} is not a knave"
    if op in ("and", "or") and len(stmt) == 3:
        return f"{render_claim(stmt[1], names)} {op} {render_claim(stmt[2], names)}"
    if op == "->":
        return f"if {render_claim(stmt[1], names)} then {render_claim(stmt[2], names)}"
    if op == "<=>":
        return f"{render_claim(stmt[1], names)} if and only if {render_claim(stmt[2], names)}"
    raise ValueError(f"statement outside the generator's grammar: {stmt!r}")


def render_quiz(names, statements, rng: random.Random) -> str:
    """The puzzle text: the island rules, who you meet, one sentence per speaker (in order), the question."""
    n = len(names)
    people = " and ".join(names) if n == 2 else ", ".join(names[:-1]) + ", and " + names[-1]
    parts = [
        "On this island every inhabitant is either a knight, who always tells the truth, or a knave, who always "
        f"lies. You meet {n} inhabitants: {people}."
    ]
    for i, stmt in enumerate(statements):
        claim = render_claim(stmt, names)
        parts.append(rng.choice(SPEECH).format(name=names[i], claim=claim, Claim=claim[0].upper() + claim[1:]))
    parts.append("So who is a knight and who is a knave?")
    return " ".join(parts)


def _atom(rng: random.Random, n: int):
    return (rng.choice(("telling-truth", "lying")), rng.randrange(n))


def random_statement(rng: random.Random, n: int):
    """One random statement about people 0..n-1."""
    form = rng.choices(FORMS, weights=FORM_WEIGHTS)[0]
    if form == "atom":
        return _atom(rng, n)
    if form == "not":
        return ("not", _atom(rng, n))
    first = _atom(rng, n)
    second = _atom(rng, n)
    while second[1] == first[1]:  # two different people, so no "X is a knight and X is a knave"
        second = _atom(rng, n)
    return (form, first, second)


def generate_puzzle(rng: random.Random, num_people: int, max_tries: int = 10000):
    """A puzzle with a unique solution: dict with `names`, `statements`, `solution` (tuple of bools), `quiz`."""
    if not MIN_PEOPLE <= num_people <= MAX_PEOPLE:
        raise ValueError(f"number of people must be within {MIN_PEOPLE}..{MAX_PEOPLE}, got {num_people}")
    for _ in range(max_tries):
        statements = tuple(random_statement(rng, num_people) for _ in range(num_people))
        solutions = solve(statements, num_people)
        if len(solutions) == 1:
            names = rng.sample(NAMES, num_people)
            return {"names": names, "statements": statements, "solution": solutions[0],
                    "quiz": render_quiz(names, statements, rng)}
    raise RuntimeError(f"no puzzle with a unique solution in {max_tries} tries for {num_people} people")


def _relabel(stmt, perm):
    if stmt[0] in ("telling-truth", "lying"):
        return (stmt[0], perm[stmt[1]])
    operands = [_relabel(s, perm) for s in stmt[1:]]
    if stmt[0] in ("and", "or", "<=>"):
        operands.sort()
    return (stmt[0],) + tuple(operands)


def canonical_key(statements):
    """The same key for two puzzles that differ only by the order (hence names) of the people and the order of the
    operands of "and", "or", "if and only if". Exact up to EXACT_DEDUP_PEOPLE people (it tries every
    permutation); beyond that the key is the statements themselves, where an accidental repeat is negligible
    (each of 6+ people has over 500 possible statements)."""
    n = len(statements)
    perms = itertools.permutations(range(n)) if n <= EXACT_DEDUP_PEOPLE else [tuple(range(n))]
    best = None
    for perm in perms:
        relabelled = [None] * n
        for i, stmt in enumerate(statements):
            relabelled[perm[i]] = _relabel(stmt, perm)
        key = tuple(relabelled)
        if best is None or key < best:
            best = key
    return best


def generate(num: int, min_people: int, max_people: int, seed: int, max_repeats: int = 10000):
    """`num` puzzles, no two the same up to renaming (see `canonical_key`).

    The number of people of each attempt is uniform in [min_people, max_people]; an attempt that repeats an earlier
    puzzle is dropped, so when a small count runs short of new puzzles (2 people allow only a few hundred), the
    larger counts fill the rest. `max_repeats` consecutive repeats raise RuntimeError instead of looping forever.
    """
    if not MIN_PEOPLE <= min_people <= max_people <= MAX_PEOPLE:
        raise ValueError(f"need {MIN_PEOPLE} <= min_people <= max_people <= {MAX_PEOPLE}, "
                         f"got {min_people}..{max_people}")
    rng = random.Random(seed)
    seen, out, repeats = set(), [], 0
    while len(out) < num:
        puzzle = generate_puzzle(rng, rng.randint(min_people, max_people))
        key = canonical_key(puzzle["statements"])
        if key in seen:
            repeats += 1
            if repeats >= max_repeats:
                raise RuntimeError(f"only {len(out)} distinct puzzles with {min_people}..{max_people} people found; "
                                   f"{max_repeats} attempts in a row repeated earlier ones")
            continue
        repeats = 0
        seen.add(key)
        out.append(puzzle)
    return out


def to_record(puzzle, ident: str):
    return {"src": [build_kk_prompt(puzzle["quiz"])],
            "tgt": [format_kk_solution(puzzle["names"], puzzle["solution"])],
            "solution": list(puzzle["solution"]), "id": ident}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num", type=int, required=True, help="number of puzzles in --output")
    parser.add_argument("--output", required=True, help="output JSONL")
    parser.add_argument("--min-people", type=int, default=2)
    parser.add_argument("--max-people", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-num", type=int, default=0, help="number of further puzzles in --eval-output")
    parser.add_argument("--eval-output", default=None, help="output JSONL for evaluation puzzles (disjoint)")
    args = parser.parse_args(argv)
    if args.num <= 0 or args.eval_num < 0:
        parser.error("--num must be positive and --eval-num non-negative")
    if (args.eval_num > 0) != (args.eval_output is not None):
        parser.error("--eval-num and --eval-output go together")
    if not MIN_PEOPLE <= args.min_people <= args.max_people <= MAX_PEOPLE:
        parser.error(f"need {MIN_PEOPLE} <= --min-people <= --max-people <= {MAX_PEOPLE}")

    puzzles = generate(args.num + args.eval_num, args.min_people, args.max_people, args.seed)
    records = [to_record(p, f"gen_kk:seed{args.seed}:{k}") for k, p in enumerate(puzzles)]
    # Generation exhausts the few 2-person puzzles early; a seeded shuffle spreads every size over both outputs.
    random.Random(args.seed + 1).shuffle(records)
    write_jsonl(args.output, records[:args.num])
    msg = f"wrote {args.num} puzzles to {args.output}"
    if args.eval_output:
        write_jsonl(args.eval_output, records[args.num:])
        msg += f" and {args.eval_num} to {args.eval_output}"
    print(msg, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
