"""CI gates: expressions over the figures of the probe's answer, evaluated by numexpr.

`--gate "speedup >= 1.15 & worst >= 0.97"` holds when the fastest setting (the verdict's) meets
it; `--min-speedup Z`, `--min-ratio X` and `--min-acceptance Y` are shorthands for
`speedup >= Z`, `ratio >= X` and `acceptance >= Y`. A gate is untrusted input: it is parsed
here into a whitelisted tree (names of COLUMNS, numbers, comparisons, + - * /, and/or/not or
& | ~, parentheses), written out fully parenthesised, and only then handed to numexpr, with its
sanitizer on. Non-goals: computing the figures (answer.py), printing.
"""

import ast
import math
import re
from dataclasses import dataclass

import numpy as np

from kolibri_cli.errors import KolibriError
from kolibri_cli.text import shown

MAX_LENGTH = 200  # characters of one gate expression
MAX_NUMBER = 1e6  # the largest number a gate may name
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
_COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
            ast.NotEq: "!="}
_ARITH = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_WORDS = {"&": " and ", "|": " or ", "~": " not "}


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
    """A gate expression checked and translated; anything else is one KolibriError line."""
    if not isinstance(text, str) or not text.strip():
        raise KolibriError(f"gate {shown(text)} is empty; e.g. --gate 'speedup >= 1.1'")
    if len(text) > MAX_LENGTH:
        raise KolibriError(f"gate is {len(text)} characters long; at most {MAX_LENGTH}")
    # & | ~ bind more tightly than comparisons in Python: spelled as words, they bind as a
    # reader of "speedup >= 1.1 & worst >= 0.97" means them (pandas.eval reads them so too)
    words = re.sub(r"[&|~]", lambda m: _WORDS[m.group()], text)
    try:
        tree = ast.parse(words.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise KolibriError(f"gate {shown(text)} is not an expression; e.g. "
                           "'speedup >= 1.1 & worst >= 0.97'") from None
    names: list[str] = []
    expr = _emit(tree, text, names, depth=0)
    if not isinstance(tree, ast.BoolOp | ast.Compare) and not _is_not(tree):
        raise KolibriError(f"gate {shown(text)} is not a condition: compare a figure, e.g. "
                           "'speedup >= 1.1'")
    return Gate(text.strip(), expr, tuple(dict.fromkeys(names)))


def shorthand(option: str, figure: str, threshold: float) -> Gate:
    """`--min-ratio 2` as the gate `ratio >= 2`."""
    gate = parse_gate(f"{figure} >= {threshold!r}")
    return Gate(gate.text, gate.numexpr, gate.names, f"{option} {threshold:g}", figure)


def _is_not(tree) -> bool:
    return isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Not)


def _emit(node, text: str, names: list[str], depth: int) -> str:
    """The numexpr text of a whitelisted node, every operation in parentheses."""
    if depth > 32:
        raise KolibriError(f"gate {shown(text)} is nested too deeply")
    go = lambda n: _emit(n, text, names, depth + 1)  # noqa: E731
    if isinstance(node, ast.BoolOp):
        op = " & " if isinstance(node.op, ast.And) else " | "
        return "(" + op.join(go(v) for v in node.values) + ")"
    if _is_not(node):
        return f"(~{go(node.operand)})"
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        return f"({'-' if isinstance(node.op, ast.USub) else '+'}{go(node.operand)})"
    if isinstance(node, ast.Compare) and all(type(o) in _COMPARE for o in node.ops):
        sides = [go(node.left), *(go(c) for c in node.comparators)]
        pairs = [f"({a} {_COMPARE[type(o)]} {b})" for a, o, b in
                 zip(sides, node.ops, sides[1:], strict=False)]
        return "(" + " & ".join(pairs) + ")"
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
        return f"({go(node.left)} {_ARITH[type(node.op)]} {go(node.right)})"
    if isinstance(node, ast.Name) and node.id in COLUMNS:
        names.append(node.id)
        return node.id
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _number(node.value, text)
    if isinstance(node, ast.Name):
        raise KolibriError(f"gate {shown(text)} names {shown(node.id)}; it may name "
                           f"{', '.join(COLUMNS)}")
    raise KolibriError(f"gate {shown(text)}: only figures, numbers, comparisons, + - * /, "
                       "& | ~ (and, or, not) and parentheses are allowed")


def _number(value, text: str) -> str:
    number = float(value)
    if not math.isfinite(number) or abs(number) > MAX_NUMBER:
        raise KolibriError(f"gate {shown(text)}: numbers must lie within ±{MAX_NUMBER:g}")
    return repr(number)


def holds(gate: Gate, figures: dict[str, float | None]) -> bool:
    """Whether the gate holds for these figures (a figure that is n/a fails every comparison)."""
    import numexpr

    values = {n: np.float64(np.nan if figures.get(n) is None else figures[n]) for n in gate.names}
    return bool(numexpr.evaluate(gate.numexpr, local_dict=values, global_dict={},
                                 sanitize=True))


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
