"""CI gates: expressions over the figures of the probe's answer, evaluated by numexpr.

`--gate "speedup >= 1.15 & worst >= 0.97"` holds when the fastest setting (the verdict's) meets
it; `--min-speedup Z`, `--min-ratio X` and `--min-acceptance Y` are shorthands for
`speedup >= Z`, `ratio >= X` and `acceptance >= Y`. A gate is untrusted input, checked by
expression.py (names of COLUMNS, numbers, comparisons, arithmetic, and/or/not) as `--where` is.
Non-goals: computing the figures (answer.py), printing.
"""

from dataclasses import dataclass

import numpy as np

from kolibri_cli.probe.expression import Expression, Grammar, evaluate, parse

COLUMNS = {
    "speedup": "the fastest setting's speedup over plain (measured with --measure, else "
               "predicted)",
    "predicted": "its predicted speedup (the cost model over the goldens)",
    "measured": "its measured speedup (needs --measure)",
    "expected": "with --measure: the speedup that c(n) timed in that run on this host predict "
                "(the measured table's predicted)",
    "spec_equals_plain": "with --measure: 1 if spec ids == plain ids on every golden, else 0",
    "counts_match_simulation": "with --measure: 1 if the real verify passes, drafts and "
                               "acceptances == the simulation's on every golden, else 0",
    "low": "the lower end of the speedup's 95% interval",
    "high": "the upper end of the speedup's 95% interval",
    "worst": "the speedup of the golden it fares worst on",
    "faster": "the share of goldens it makes faster (0-1)",
    "ratio": "plain steps / verify passes",
    "acceptance": "accepted / drafted tokens (0-1)",
    "mean_len": "1 + accepted / passes with drafts",
    "goldens": "the goldens it was measured or simulated on",
    "crossover": "with --concurrency: the largest concurrency asked for up to which it pays",
}
GRAMMAR = Grammar("gate", "--gate", tuple(COLUMNS), example="speedup >= 1.1 & worst >= 0.97")


@dataclass(frozen=True)
class Gate:
    """One gate: its expression as given, the numexpr text it runs as, the names it reads, and
    for a shorthand (`--min-ratio 2`) its option and the one figure it compares."""

    text: str
    numexpr: str
    names: tuple[str, ...]
    option: str | None = None  # "min-ratio 2" for a shorthand
    figure: str | None = None  # the column a shorthand compares

    def to_json(self) -> dict:
        return {"gate": self.text, "option": self.option}


def parse_gate(text: str) -> Gate:
    """A gate expression checked and translated (expression.parse); anything else is one
    KolibriError line."""
    expr = parse(text, GRAMMAR)
    return Gate(expr.text, expr.numexpr, expr.names)


def shorthand(option: str, figure: str, threshold: float) -> Gate:
    """`--min-ratio 2` as the gate `ratio >= 2`."""
    gate = parse_gate(f"{figure} >= {threshold!r}")
    return Gate(gate.text, gate.numexpr, gate.names, f"{option} {threshold:g}", figure)


def holds(gate: Gate, figures: dict[str, float | None]) -> bool:
    """Whether the gate holds for these figures (a figure that is n/a fails every comparison)."""
    values = {n: np.float64(np.nan if figures.get(n) is None else figures[n]) for n in gate.names}
    return bool(evaluate(Expression(gate.text, gate.numexpr, gate.names), values, GRAMMAR))


def failure(gate: Gate, figures: dict[str, float | None], label: str, basis: str) -> str:
    """One line saying how the gate failed, with the figures it read and the setting (`basis`:
    "predicted" or "measured", what "speedup" was)."""
    def value(name: str) -> str:
        v = figures.get(name)
        return "n/a" if v is None or v != v else f"{v:.3f}"

    if gate.option is not None:
        names = {"speedup": f"{basis} speedup", "acceptance": "acceptance rate"}
        return (f"{names.get(gate.figure, gate.figure)} {value(gate.figure)} < {gate.option} "
                f"({label})")
    read = ", ".join(f"{n} {value(n)}" for n in gate.names)
    return f"{gate.text} is false: {read} ({label})"
