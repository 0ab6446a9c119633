"""`--where EXPR`: the probe answers for a slice of the traffic, the goldens whose columns meet
EXPR, e.g. `output_tokens >= 200 & category != 'chat'`.

The expression is checked by expression.py (the path gates take too) and evaluated by numexpr
over a batch's columns as arrays, one boolean per golden: the same on a list in memory and on
millions of chains read piece by piece in workers (replay/shards.py). Non-goals: filtering by
what the simulation found (acceptance, speedup): a slice chosen by its outcome would answer for
traffic no one can route to it.
"""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from kolibri_cli.goldens.chains import Golden
from kolibri_cli.probe.expression import Expression, Grammar, evaluate, parse

BATCH = 4096  # goldens evaluated per numexpr call

# name -> (what it is, its value for one golden); "category" is text (UTF-8 bytes for numexpr)
COLUMNS: dict[str, tuple[str, Callable[[Golden], object]]] = {
    "prompt_tokens": ("the prompt's length in tokens", lambda g: len(g.prompt_ids)),
    "output_tokens": ("the recorded output's length in tokens (before --max-tokens)",
                      lambda g: len(g.output_ids)),
    "category": ("the golden's category, compared to a quoted name: category == 'code'",
                 lambda g: g.category.encode()),
    "chat": ("1 if the prompt went through the chat template, else 0", lambda g: int(g.chat)),
    "temperature": ("the recorded sampling temperature (0: greedy)",
                    lambda g: float(g.sampling.get("temperature") or 0.0)),
}
GRAMMAR = Grammar("--where", "--where", tuple(COLUMNS), texts=("category",),
                  example='output_tokens >= 200 & category != "chat"', noun="columns")


@dataclass(frozen=True)
class Where:
    """A checked `--where` expression."""

    expression: Expression

    @property
    def text(self) -> str:
        return self.expression.text

    def mask(self, goldens: list[Golden]) -> np.ndarray:
        """[N] bool: which of `goldens` the expression keeps."""
        columns = {name: _column(name, goldens) for name in self.expression.names}
        kept = evaluate(self.expression, columns, GRAMMAR)
        return np.broadcast_to(np.asarray(kept, dtype=bool), (len(goldens),))

    def select(self, goldens: Iterable[Golden]) -> Iterator[Golden]:
        """The goldens kept, in order, evaluated BATCH at a time (memory stays flat)."""
        batch: list[Golden] = []
        for g in goldens:
            batch.append(g)
            if len(batch) == BATCH:
                yield from self._kept(batch)
                batch = []
        yield from self._kept(batch)

    def _kept(self, batch: list[Golden]) -> list[Golden]:
        return [g for g, keep in zip(batch, self.mask(batch), strict=True) if keep] if batch \
            else []


def parse_where(text: str) -> Where:
    """`text` checked (one KolibriError line naming the column or operator)."""
    return Where(parse(text, GRAMMAR))


def _column(name: str, goldens: list[Golden]) -> np.ndarray:
    """[N]: one column of a batch (int64, float64, or bytes for category)."""
    value = COLUMNS[name][1]
    if name == "category":
        return np.array([value(g) for g in goldens] or [b""], dtype=bytes)[:len(goldens)]
    return np.array([value(g) for g in goldens], dtype=np.float64 if name == "temperature"
                    else np.int64)


def help_text() -> str:
    """The columns as --help and docs list them."""
    return "; ".join(f"{name}: {what}" for name, (what, _) in COLUMNS.items())
