"""Problems of the arithmetic quickstarts: (a, b) operand pairs with fixed held-out sets.

`OperandPairs(a_range, b_range, eval_seed, validation_seed)` draws `(randint(*a_range), randint(*b_range))` pairs:
the evaluation set and SFT's validation set are fixed and distinct whatever the run's seed, and training problems
never hold one of them. quickstart.py (a+b) and quickstart_tools.py (a*b) each keep one instance.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, List, Tuple

Problem = Tuple[int, int]


@dataclass(frozen=True)
class OperandPairs:
    a_range: Tuple[int, int]
    b_range: Tuple[int, int]
    eval_seed: int
    validation_seed: int

    def draw(self, rng: random.Random) -> Problem:
        return rng.randint(*self.a_range), rng.randint(*self.b_range)

    def distinct(self, rng: random.Random, n: int, exclude: Iterable[Problem] = ()) -> List[Problem]:
        """`n` distinct pairs drawn with `rng`, none in `exclude`."""
        out, seen = [], set(exclude)
        while len(out) < n:
            p = self.draw(rng)
            if p not in seen:
                seen.add(p)
                out.append(p)
        return out

    def eval_problems(self, n: int) -> List[Problem]:
        """The fixed held-out problems: `n` distinct pairs, the same for every run."""
        return self.distinct(random.Random(self.eval_seed), n)

    def validation_problems(self, n: int, eval_size: int) -> List[Problem]:
        """SFT's own held-out problems: fixed, distinct, disjoint from `eval_problems(eval_size)`."""
        return self.distinct(random.Random(self.validation_seed), n, exclude=self.eval_problems(eval_size))

    def train_problems(self, n: int, seed: int, held_out: Iterable[Problem]) -> List[Problem]:
        """`n` problems drawn with `seed` (repeats allowed), never one of `held_out`."""
        exclude, rng, out = set(held_out), random.Random(seed), []
        while len(out) < n:
            p = self.draw(rng)
            if p not in exclude:
                out.append(p)
        return out
