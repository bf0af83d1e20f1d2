"""Generate small synthetic news-style documents with reference summaries, as src/tgt JSONL (the project's own
summarization data, for GRPO with an encoder-decoder policy and the `rouge_l` reward).

    python tools/data/gen_summarization.py --num 400 --eval-num 40 --seed 1 \
        --output data/summarization_train.jsonl --eval-output data/summarization_eval.jsonl

Each document reports one main event about made-up people, organisations and towns (names built from syllables this
tool owns, so no model has seen them and a good summary must copy them from the document) with 2-3 detail sentences
about the same event and, in about 60% of the documents, one distractor sentence about an unrelated event elsewhere.
The main event's sentence comes first in 70% of the documents (news lead); otherwise a sentence about the weather or
the press and/or the distractor precede it. The reference summary `tgt` is a compressed one-sentence form of the
main event (who did what, where) that copies the names and most words from the document (a few connecting words
differ: "beat" / "won ... beating"), so ROUGE-L against it rewards picking the right event and the right names.

Fields: `src` (`--prefix` + document; the default "summarize: " is T5's task prefix, use `--prefix ""` for BART),
`tgt`, `id`. Everything is drawn from `random.Random(seed)` (stable methods only), so a seed always gives the same
files for a given Python 3 version; train and eval come from one stream with no document repeated.

Left out on purpose: multi-event summaries, real paraphrase, numbers or dates in summaries, and any real-world
entity.
"""
from __future__ import annotations

import argparse
import os
import random
import sys

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)

from paddle_grpo.data import write_jsonl  # noqa: E402

FIRST_A = ("Ar", "Bel", "Cor", "Dal", "El", "Fen", "Gar", "Hal", "Is", "Jor", "Kel", "Lun", "Mar", "Nim", "Om",
           "Pel", "Quin", "Ros", "Sel", "Tam", "Ul", "Vor", "Wen", "Yar", "Zel")
FIRST_B = ("a", "en", "ion", "or", "is", "wyn", "eth", "ana", "ia", "o", "ric", "elle")
LAST_A = ("Ash", "Bram", "Cald", "Dun", "Fair", "Grim", "Hollo", "Kest", "Mor", "Thorn", "Vell", "Wrens", "Ost",
          "Pim", "Lark")
LAST_B = ("ford", "well", "ley", "wick", "by", "more", "ton", "dale", "hurst", "croft")
TOWN_B = ("ham", "stead", "port", "mouth", "bridge", "holm", "field", "gate")
ORG_KINDS = ("Institute", "Society", "Company", "Foundation", "Guild", "Collective")
TEAM_KINDS = ("Rovers", "United", "Falcons", "Harriers", "Wanderers")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
MONTHS = ("January", "March", "April", "June", "August", "October", "November")
WEATHER = ("cold and windy", "unusually warm", "wet", "foggy", "bright and dry")

# The main event kinds. `key`: phrasings of the event sentence (one is drawn); `summary`: the compressed form;
# `details`: sentences about the same event. Slots are filled from one dict per document (see _slots).
EVENTS = (
    {"key": ("On {day}, {role} {person} of the {org} unveiled {thing}, which {purpose}.",
             "{role} {person} of the {org} unveiled {thing} on {day}; it {purpose}."),
     "summary": "{person} of the {org} unveiled {thing}.",
     "details": ("The project took {n} years and cost {m} million crowns.",
                 "{person2}, who leads the {org}, called it the most important work of the decade.",
                 "A first public demonstration is planned for {month}.",
                 "Engineers from {town2} helped to test the early models.")},
    {"key": ("The {team} beat {team2} {s1} to {s2} on {day} to win the {cup}.",
             "On {day} the {team} won the {cup}, beating {team2} {s1} to {s2}."),
     "summary": "The {team} won the {cup}, beating {team2}.",
     "details": ("Captain {person} scored twice in the second half.",
                 "Around {n} thousand supporters watched the match in {town}.",
                 "It is the first title for the {team} since {year}.",
                 "Coach {person2} said the players had earned a long rest.")},
    {"key": ("Voters in {town} elected {person} as mayor on {day}, ending {n} years of rule by {person2}.",
             "{person} was elected mayor of {town} on {day}, replacing {person2} after {n} years."),
     "summary": "{person} was elected mayor of {town}.",
     "details": ("Turnout was the highest the town has recorded.",
                 "{person} promised to rebuild the old bridge over the river.",
                 "{person2} congratulated the winner in a short speech.",
                 "The new council will meet for the first time in {month}.")},
    {"key": ("Researchers at the {org} have discovered a new species of {creature} near {town}.",
             "A new species of {creature} has been discovered near {town} by researchers at the {org}."),
     "summary": "The {org} discovered a new species of {creature} near {town}.",
     "details": ("The team was led by {role} {person}, who has studied the area for {n} years.",
                 "The animal is about the size of a thumb and lives under wet stones.",
                 "{person2} said the find shows how little is known about the valley.",
                 "The species will be named after the town of {town}.")},
    {"key": ("The {org} has agreed to buy the {org2} for {m} million crowns, the two firms said on {day}.",
             "On {day} the {org} agreed to buy the {org2} for {m} million crowns."),
     "summary": "The {org} agreed to buy the {org2}.",
     "details": ("The deal still needs the approval of regulators in {town}.",
                 "{person}, the head of the {org2}, will join the board of the buyer.",
                 "Shares in the {org} rose after the announcement.",
                 "Both firms were founded in {town} more than {n} years ago.")},
    {"key": ("A storm flooded the centre of {town} on {day}, forcing {n} hundred people to leave their homes.",
             "{n} hundred people left their homes in {town} on {day} after a storm flooded the town centre."),
     "summary": "A storm flooded the centre of {town}.",
     "details": ("Emergency teams from {town2} arrived during the night.",
                 "Mayor {person} said the old flood walls had not been repaired since {year}.",
                 "No one was seriously hurt, officials said.",
                 "Schools in {town} will stay closed until {day2}.")},
    {"key": ("{role} {person} has won the {prize} for her work on {topic}, the {org} announced on {day}.",
             "The {org} announced on {day} that {role} {person} has won the {prize} for her work on {topic}."),
     "summary": "{person} won the {prize} for her work on {topic}.",
     "details": ("The prize comes with {m} thousand crowns.",
                 "{person} began her research in {town} {n} years ago.",
                 "{person2}, a former winner, praised the choice.",
                 "The award ceremony will be held in {month}.")},
)

ROLES = ("engineer", "professor", "doctor", "chemist", "biologist", "designer")
THINGS = ("a solar-powered ferry", "a folding bicycle", "a quiet wind turbine", "a water filter",
          "a reading lamp", "a small weather balloon")
PURPOSES = ("runs without fuel", "fits in a backpack", "makes no noise", "cleans river water",
            "needs no battery", "measures rain in the hills")
CREATURES = ("frog", "beetle", "moth", "lizard", "snail", "spider")
PRIZES = ("Golden Quill Prize", "Harbour Medal", "Silver Compass Award", "Lantern Prize")
TOPICS = ("river ecology", "old bridges", "bird migration", "soil chemistry", "glass making")
CUPS = ("Valley Cup", "Northern Shield", "Coast Trophy", "River Cup")

DISTRACTORS = (
    "Meanwhile, in {town3}, {person3} opened a new bakery.",
    "Elsewhere, the {team3} lost their opening match of the season.",
    "In other news, {person3} of {town3} retired after {n2} years as a teacher.",
    "Separately, the {org3} said it would move its offices to {town3}.",
)
GENERIC = (
    "The weather in {town} was {weather} for most of the week.",
    "Local newspapers in {town} covered the story on their front pages.",
)


def _name(rng):
    return rng.choice(FIRST_A) + rng.choice(FIRST_B) + " " + rng.choice(LAST_A) + rng.choice(LAST_B)


def _town(rng):
    return rng.choice(LAST_A) + rng.choice(TOWN_B)


def _distinct(rng, make, n):
    out = []
    while len(out) < n:
        x = make(rng)
        if x not in out:
            out.append(x)
    return out


def _slots(rng):
    """One document's names, places and numbers (all distinct where they must be told apart)."""
    people = _distinct(rng, _name, 3)
    towns = _distinct(rng, _town, 3)
    orgs = _distinct(rng, lambda r: f"{r.choice(LAST_A)}{r.choice(LAST_B)} {r.choice(ORG_KINDS)}", 3)
    teams = _distinct(rng, lambda r: f"{_town(r)} {r.choice(TEAM_KINDS)}", 3)
    days = _distinct(rng, lambda r: r.choice(DAYS), 2)
    s1 = rng.randint(2, 5)
    i = rng.randrange(len(THINGS))
    return {
        "person": people[0], "person2": people[1], "person3": people[2],
        "town": towns[0], "town2": towns[1], "town3": towns[2],
        "org": orgs[0], "org2": orgs[1], "org3": orgs[2],
        "team": teams[0], "team2": teams[1], "team3": teams[2],
        "day": days[0], "day2": days[1], "month": rng.choice(MONTHS), "year": rng.randint(1950, 2015),
        "n": rng.randint(3, 12), "n2": rng.randint(20, 40), "m": rng.randint(2, 90),
        "s1": s1, "s2": rng.randint(0, s1 - 1),
        "role": rng.choice(ROLES), "thing": THINGS[i], "purpose": PURPOSES[i], "creature": rng.choice(CREATURES),
        "prize": rng.choice(PRIZES), "topic": rng.choice(TOPICS), "cup": rng.choice(CUPS),
        "weather": rng.choice(WEATHER),
    }


def _capitalize(sentence):
    return sentence[0].upper() + sentence[1:]


def make_document(rng):
    """One (document, summary) pair."""
    event = rng.choice(EVENTS)
    slots = _slots(rng)
    key = _capitalize(rng.choice(event["key"]).format(**slots))
    details = [d.format(**slots) for d in rng.sample(event["details"], rng.randint(2, 3))]
    # Sentences that make sense before the main event (they do not refer back to it).
    lead = rng.sample([rng.choice(GENERIC).format(**slots), rng.choice(DISTRACTORS).format(**slots)],
                      0 if rng.random() < 0.7 else rng.randint(1, 2))
    if not any(d.format(**slots) in lead for d in DISTRACTORS) and rng.random() < 0.5:
        details.insert(rng.randint(1, len(details)), rng.choice(DISTRACTORS).format(**slots))
    return " ".join(lead + [key] + details), _capitalize(event["summary"].format(**slots))


def generate(num, seed, prefix="summarize: ", start_id=0):
    """`num` records with distinct documents, drawn from random.Random(seed)."""
    rng = random.Random(seed)
    records, seen = [], set()
    while len(records) < num:
        doc, summary = make_document(rng)
        if doc in seen:
            continue
        seen.add(doc)
        records.append({"src": prefix + doc, "tgt": summary, "id": f"summ-{start_id + len(records)}"})
    return records


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num", type=int, required=True, help="training records")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--output", required=True)
    p.add_argument("--eval-num", type=int, default=0, help="evaluation records (disjoint from training)")
    p.add_argument("--eval-output", default=None)
    p.add_argument("--prefix", default="summarize: ", help="text before each document (T5's task prefix)")
    args = p.parse_args(argv)
    if args.num <= 0 or args.eval_num < 0:
        p.error("--num must be positive and --eval-num non-negative")
    if args.eval_num and not args.eval_output:
        p.error("--eval-num needs --eval-output")
    records = generate(args.num + args.eval_num, args.seed, prefix=args.prefix)
    write_jsonl(args.output, records[:args.num])
    if args.eval_num:
        write_jsonl(args.eval_output, records[args.num:])
    print(f"wrote {args.num} records to {args.output}"
          + (f" and {args.eval_num} to {args.eval_output}" if args.eval_num else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
