"""Conditions a user writes, checked and evaluated by numexpr: `--gate` over the answer's figures
(gates.py) and `--where` over the goldens' columns (where.py) take this one path.

An expression is untrusted input: it is parsed here into a whitelisted tree (names of the
columns given, numbers, a quoted word compared with == or != to a text column, comparisons,
+ - * /, and/or/not or & | ~, parentheses), written out fully parenthesised, and only then
handed to numexpr, with its sanitizer on. Non-goals: what the columns hold, printing.
"""

import ast
import math
import re
from dataclasses import dataclass

import numpy as np

from kolibri_cli.errors import KolibriError
from kolibri_cli.text import shown

MAX_LENGTH = 200  # characters of one expression
MAX_NUMBER = 1e6  # the largest number an expression may name
WORD = re.compile(r"[\w .:/+-]{1,64}", re.ASCII)  # a quoted word: a category's name
_COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
            ast.NotEq: "!="}
_ARITH = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_WORDS = {"&": " and ", "|": " or ", "~": " not "}


@dataclass(frozen=True)
class Grammar:
    """What one kind of expression may name, and how its errors read."""

    what: str  # "gate", "--where": the errors' first word
    flag: str  # the option that takes it
    columns: tuple[str, ...]  # the names it may read
    texts: tuple[str, ...] = ()  # of those, the text columns (compared to a quoted word)
    example: str = ""  # a valid expression, for the errors
    noun: str = "figures"  # what a column is called in the errors


@dataclass(frozen=True)
class Expression:
    """An expression as given, the numexpr text it runs as, and the names it reads."""

    text: str
    numexpr: str
    names: tuple[str, ...]


def parse(text: str, grammar: Grammar) -> Expression:
    """`text` checked against `grammar` and translated; anything else is one KolibriError."""
    what = grammar.what
    if not isinstance(text, str) or not text.strip():
        raise KolibriError(f"{what} {shown(text)} is empty; e.g. {grammar.flag} "
                           f"'{grammar.example}'")
    if len(text) > MAX_LENGTH:
        raise KolibriError(f"{what} is {len(text)} characters long; at most {MAX_LENGTH}")
    # & | ~ bind more tightly than comparisons in Python: spelled as words, they bind as a
    # reader of "speedup >= 1.1 & worst >= 0.97" means them (pandas.eval reads them so too)
    words = re.sub(r"[&|~]", lambda m: _WORDS[m.group()], text)
    try:
        tree = ast.parse(words.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise KolibriError(f"{what} {shown(text)} is not an expression; e.g. "
                           f"'{grammar.example}'") from None
    names: list[str] = []
    expr = _Emitter(text, grammar, names).emit(tree, 0)
    if not isinstance(tree, ast.BoolOp | ast.Compare) and not _is_not(tree):
        raise KolibriError(f"{what} {shown(text)} is not a condition: compare a "
                           f"{grammar.noun[:-1]}, e.g. '{grammar.example}'")
    parsed = Expression(text.strip(), expr, tuple(dict.fromkeys(names)))
    trial = {n: np.array([b"x"] if n in grammar.texts else [1.0]) for n in parsed.names}
    evaluate(parsed, trial, grammar)  # what numexpr refuses (-True, a literal / 0) fails now
    return parsed


def evaluate(expr: Expression, columns: dict, grammar: Grammar) -> np.ndarray:
    """numexpr's value of `expr` over `columns` (arrays, or 0-d for figures); an operation it
    has no code for is one KolibriError line."""
    import numexpr

    try:
        return numexpr.evaluate(expr.numexpr, local_dict=columns, global_dict={},
                                sanitize=True)
    except (ArithmeticError, NotImplementedError, TypeError, ValueError) as e:
        raise KolibriError(f"{grammar.what} {shown(expr.text)}: numexpr cannot evaluate it "
                           f"({e})") from None


def _is_not(tree) -> bool:
    return isinstance(tree, ast.UnaryOp) and isinstance(tree.op, ast.Not)


@dataclass
class _Emitter:
    text: str
    grammar: Grammar
    names: list[str]

    def fail(self, why: str):
        raise KolibriError(f"{self.grammar.what} {shown(self.text)}{why}")

    def emit(self, node, depth: int) -> str:
        """The numexpr text of a whitelisted node, every operation in parentheses."""
        if depth > 32:
            self.fail(" is nested too deeply")
        go = lambda n: self.emit(n, depth + 1)  # noqa: E731
        if isinstance(node, ast.BoolOp):
            op = " & " if isinstance(node.op, ast.And) else " | "
            return "(" + op.join(go(v) for v in node.values) + ")"
        if _is_not(node):
            return f"(~{go(node.operand)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            return f"({'-' if isinstance(node.op, ast.USub) else '+'}{go(node.operand)})"
        if isinstance(node, ast.Compare) and all(type(o) in _COMPARE for o in node.ops):
            if self._texts_in(node):
                return self.text_compare(node)
            sides = [go(node.left), *(go(c) for c in node.comparators)]
            pairs = [f"({a} {_COMPARE[type(o)]} {b})" for a, o, b in
                     zip(sides, node.ops, sides[1:], strict=False)]
            return "(" + " & ".join(pairs) + ")"
        if isinstance(node, ast.BinOp) and type(node.op) in _ARITH:
            return f"({go(node.left)} {_ARITH[type(node.op)]} {go(node.right)})"
        if isinstance(node, ast.Name) and node.id in self.grammar.texts:
            self.fail(f": {node.id} is text; compare it with == or != to a quoted name, e.g. "
                      f"{node.id} == 'code'")
        if isinstance(node, ast.Name) and node.id in self.grammar.columns:
            self.names.append(node.id)
            return node.id
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return self.number(node.value)
        if isinstance(node, ast.Name):
            self.fail(f" names {shown(node.id)}; it may name {', '.join(self.grammar.columns)}")
        self.fail(f": only {self.grammar.noun}, numbers, comparisons, + - * /, & | ~ (and, or, "
                  "not) and parentheses are allowed"
                  + (", and quoted names compared to " + ", ".join(self.grammar.texts)
                     if self.grammar.texts else ""))

    def _texts_in(self, node: ast.Compare) -> bool:
        if not self.grammar.texts:  # a quoted word is then no more than any other bad token
            return False
        sides = [node.left, *node.comparators]
        return any(isinstance(s, ast.Constant) and isinstance(s.value, str) or
                   isinstance(s, ast.Name) and s.id in self.grammar.texts for s in sides)

    def text_compare(self, node: ast.Compare) -> str:
        """`category == 'code'`: one text column, == or !=, one quoted word (as UTF-8 bytes,
        numexpr's strings)."""
        sides = [node.left, *node.comparators]
        names = [s for s in sides if isinstance(s, ast.Name) and s.id in self.grammar.texts]
        words = [s for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)]
        if (len(sides), len(names), len(words)) != (2, 1, 1) or \
                type(node.ops[0]) not in (ast.Eq, ast.NotEq):
            self.fail(f": a quoted name compares with == or != to "
                      f"{' or '.join(self.grammar.texts)}, e.g. {self.grammar.texts[0]} == 'code'")
        word = words[0].value
        if not WORD.fullmatch(word):
            self.fail(f": {shown(word)} is not a name (letters, digits, space . : / + - _; at "
                      "most 64)")
        self.names.append(names[0].id)
        return f"({names[0].id} {_COMPARE[type(node.ops[0])]} {word.encode()!r})"

    def number(self, value) -> str:
        number = float(value)
        if not math.isfinite(number) or abs(number) > MAX_NUMBER:
            self.fail(f": numbers must lie within ±{MAX_NUMBER:g}")
        return repr(number)
