"""The guard: draft only where the expected gain is positive, from forward costs measured at the
running context and acceptance learned online for this request."""

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from numba import njit

from kolibri_cli.decode.costs import CostTable
from kolibri_cli.decode.proposers.ngram import longest_match
from kolibri_cli.decode.proposers.settings import validate_k, validate_window
from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))

RUN = 0  # state: the previous candidate predicted every token produced since it was made
# Drafts are chosen on each rate's estimate less CAUTION standard deviations of it: a rejected
# draft's cost is certain, its gain is not, and a request of a few dozen tokens cannot average
# out a draft made on thin evidence. With evidence the bound closes on the estimate. Chosen on
# the tune split of Spec-Bench prompts (docs/guard.md), never on the shipped goldens.
CAUTION = 0.5
# The most a request may fall behind plain decoding on drafts the guard is not sure of, by its
# own costs: with every such draft rejected it still costs at most 1 + RISK plain steps per token
# produced (>= 0.97x of plain). Not tuned: the "never hurts" target itself.
RISK = 0.03
# A draft whose first token is, cautiously, more likely right than wrong is not held to that
# budget (the text is copying: the first ten tokens of a copied answer are where drafts pay
# most, and a request has no budget yet). On the tune split 0.4 and 0.5 model the same, 0.6 lower.
SURE = 0.5


@dataclass(frozen=True)
class AcceptancePrior:
    """Where acceptance estimates start for a new request: per state (0 = run, m = a fresh
    match of length m) and draft position, the probability that the position is accepted given
    the ones before it were, worth `weight` observations."""

    rates: tuple[tuple[float, ...], ...]  # [states][positions]
    weight: float
    # In a run that has predicted r tokens in a row, start from (r + 1) / (r + 2) (Laplace's
    # rule of succession) instead of the run state's rate: a run of one token continues less
    # often than a run of twenty.
    succession: bool = False

    def table(self, states: int, k: int) -> np.ndarray:  # -> float64[states, k]
        """The rates as an array, the last state and position repeated to fill (states, k)."""
        rows = [self.rates[min(s, len(self.rates) - 1)] for s in range(states)]
        return np.array([[r[min(i, len(r) - 1)] for i in range(k)] for r in rows])


@dataclass
class _Candidate:
    start: int  # context index of its first token
    tokens: list[int]  # the full candidate (up to k tokens), drafted or not
    state: int
    run: int = 0  # tokens the candidates before it predicted in a row (0: a fresh match)
    checked: int = 0  # positions compared with the tokens produced so far
    alive: bool = True  # every compared position agreed


@dataclass
class Acceptance:
    """P(draft position i accepted | positions before it accepted), per state, learned from
    every candidate of this request — drafted or not: the tokens the model produces anyway show
    how far each candidate would have been accepted (choosing a token depends only on its
    position, never on the drafts), so skipping a draft loses no evidence.

    Rates are computed on plain Python floats: a guard call works on k <= 16 of them, where each
    numpy call would cost more than the arithmetic (the same IEEE operations in the same order,
    so the same numbers bit for bit as the array formulas in the docstrings)."""

    prior: AcceptancePrior
    states: int
    k: int
    tried: np.ndarray = field(init=False)  # [states, k] positions compared
    accepted: np.ndarray = field(init=False)  # [states, k] ... and agreed
    pending: list[_Candidate] = field(init=False, default_factory=list)

    def __post_init__(self):
        self._prior = (self.prior.table(self.states, self.k) * self.prior.weight).tolist()
        self.tried = np.zeros((self.states, self.k))
        self.accepted = np.zeros((self.states, self.k))

    def rates(self, state: int, run: int = 0) -> list[float]:  # -> [k]
        """Per position: (accepted + prior rate * weight) / (tried + weight). In a run, a
        position starts from the run's pooled rate instead: a run is the text repeating, which
        every position shares, so deep positions need not wait for evidence of their own. `run`:
        the tokens the run has predicted in a row (the prior's `succession`)."""
        weight = self.prior.weight
        prior = self._prior[state]  # [k] prior rate * weight
        if state == RUN:
            start = (run + 1) / (run + 2) * weight if self.prior.succession else prior[0]
            # sums of counts: whole numbers, exact in any order
            pooled = (sum(self.accepted[RUN].tolist()) + start) / (sum(self.tried[RUN].tolist())
                                                                  + weight)
            prior = [pooled * weight] * self.k
        return [(a + p) / (t + weight)
                for a, p, t in zip(self.accepted[state].tolist(), prior,
                                   self.tried[state].tolist(), strict=True)]

    def cautious(self, state: int, run: int = 0) -> list[float]:  # -> [k]
        """`rates` less CAUTION standard deviations, clipped to [0, 1], with the prior counted
        as `weight` observations (a Beta posterior's spread, rate (1 - rate) / (tried + weight
        + 1)): drafting waits for evidence."""
        weight = self.prior.weight
        return [_clip(r - CAUTION * _sqrt(r * (1.0 - r) / (t + weight + 1.0)))
                for r, t in zip(self.rates(state, run), self.tried[state].tolist(), strict=True)]

    def add(self, candidate: _Candidate) -> None:
        self.pending.append(candidate)

    def learn(self, context: np.ndarray) -> None:
        """Compare pending candidates with the tokens produced since; drop finished ones."""
        if not self.pending:
            return
        first = min(c.start + c.checked for c in self.pending)
        produced = context[first:].tolist()  # the tokens no pending candidate has seen yet
        for c in self.pending:
            tried, accepted = self.tried[c.state], self.accepted[c.state]  # [k] views
            while c.alive and c.checked < len(c.tokens) and c.start + c.checked < len(context):
                i = c.checked
                tried[i] += 1.0
                c.alive = c.tokens[i] == produced[c.start + i - first]
                accepted[i] += c.alive
                c.checked += 1
        self.pending = [c for c in self.pending if c.alive and c.checked < len(c.tokens)]


@njit(cache=True)
def _starts_with(tokens, prefix):  # tokens: int64[T], prefix: int64[P <= T] -> bool
    """np.array_equal(tokens[:P], prefix) without its temporaries (a guard call's biggest cost
    once the context runs to hundreds of tokens)."""
    for i in range(prefix.shape[0]):
        if tokens[i] != prefix[i]:
            return False
    return True


def _sqrt(x: float) -> float:
    """np.sqrt on one float: NaN below zero (math.sqrt raises)."""
    return math.sqrt(x) if x >= 0.0 else math.nan


def _clip(x: float) -> float:
    """np.clip(x, 0.0, 1.0) on one float: NaN stays NaN, -0.0 becomes 0.0."""
    if 0.0 < x < 1.0 or x != x:
        return x
    return 0.0 if x <= 0.0 else 1.0


def _first_max(values: list[float]) -> int:
    """np.argmax: the first maximum, or the first NaN if any."""
    best, where = values[0], 0
    if best != best:
        return 0
    for i, v in enumerate(values):
        if v != v:
            return i
        if v > best:
            best, where = v, i
    return where


@dataclass
class GuardProposer:
    """vLLM's match (longest n in the window, leftmost occurrence) gives up to k candidate tokens;
    the guard drafts the prefix length j in 0..k maximising the expected tokens per unit cost,

        (1 + sum_{i<=j} prod_{l<i} p[s][l]) / c(1 + j, context),

    with p from `Acceptance`, taken cautiously (state s: RUN when the previous candidate is still
    right, else the match length) and c from the cost table at the running context length.
    j = 0 — a plain step — whenever no draft is expected to pay for itself; ties go to the
    shorter draft. The choice is a function of the context and the table only: with a frozen
    table the probe's simulation reproduces it exactly; `kolibri generate` feeds the table with
    its own forward timings.

    A new request is recognised when the context is not the previous one grown by at most
    k + 1 tokens; the acceptance estimates then restart from the prior.
    """

    k: int
    window_min: int
    window_max: int
    costs: CostTable = field(default_factory=CostTable)
    prior: AcceptancePrior | None = None
    name: ClassVar[str] = "guard"
    # acceptance and measured costs are this request's own (the probe gives each golden a
    # fresh guard; a given table is frozen), so goldens may be replayed anywhere
    shares_state: ClassVar[bool] = False

    def __post_init__(self):
        validate_k(self.k)
        validate_window(self.window_min, self.window_max)
        self.prior = self.prior or DEFAULT_PRIOR
        self._seen = np.zeros(0, dtype=np.int64)  # [T] the context at the last call
        self._last: _Candidate | None = None
        self._acceptance = self._new_acceptance()
        self._ledger = Ledger()

    def propose(self, context, max_tokens: int) -> list[int]:
        tokens = np.ascontiguousarray(context, dtype=np.int64)  # [T]
        self._sync(tokens)
        start, n = longest_match(tokens, self.window_min, self.window_max)
        if start < 0:
            self._last = None
            self._ledger.open(len(tokens), 1.0)
            return []
        state = self._state(n, len(tokens))
        run = self._last.run + self._last.checked if state == RUN else 0
        candidate = _Candidate(len(tokens), tokens[start : start + self.k].tolist(), state, run)
        self._acceptance.add(candidate)
        self._last = candidate
        limit = min(len(candidate.tokens), max(max_tokens, 0))
        length, cost = self._choose(candidate.state, limit, len(tokens), run)
        self._ledger.open(len(tokens), cost)
        return candidate.tokens[:length]

    def best_length(self, state: int, limit: int, context: int, run: int = 0) -> int:
        """The draft length in 0..limit with the most expected tokens per unit of cost among
        those the request can afford."""
        return self._choose(state, limit, context, run)[0]

    def _choose(self, state: int, limit: int, context: int, run: int = 0) -> tuple:
        """(the draft length in 0..limit with the most expected tokens per unit of cost among
        those the request can afford, its c(1 + length) relative to a plain step)"""
        if limit == 0:
            return 0, 1.0
        c = self.costs.relative(context, limit + 1).tolist()  # [limit + 2]
        rates = self._acceptance.cautious(state, run)
        budget = math.inf if rates[0] >= SURE else self._ledger.allowance(context)
        # expected[j] = 1 + sum_{i<j} prod_{l<=i} rates[l]: tokens per pass drafting j
        value, reach, product = [1.0 / c[1]], 0.0, 1.0  # [limit + 1] tokens per unit cost
        for j in range(limit):
            if c[j + 2] - c[1] > budget:
                break  # longer drafts cost more still (a draft of j + 1 tokens is not chosen)
            product *= rates[j]
            reach += product
            value.append((1.0 + reach) / c[j + 2])
        length = _first_max(value)  # first maximum: the shorter draft on ties
        return length, c[length + 1]

    def _state(self, n: int, produced: int) -> int:
        """RUN if the last candidate agreed with every token produced since it was made."""
        last = self._last
        if last is not None and last.alive and 0 < produced - last.start == last.checked:
            return RUN
        return min(n, self.window_max)

    def _sync(self, tokens: np.ndarray) -> None:
        seen = len(self._seen)
        grown = 0 < seen < len(tokens) <= seen + self.k + 1
        if not (grown and _starts_with(tokens, self._seen)):
            self._acceptance, self._last = self._new_acceptance(), None
            self._ledger = Ledger(origin=len(tokens))
        else:
            self._acceptance.learn(tokens)
            self._ledger.settle(len(tokens))
        self._seen = tokens.copy()

    def _new_acceptance(self) -> Acceptance:
        return Acceptance(self.prior, self.window_max + 1, self.k)

    @property
    def window(self) -> tuple[int, int]:
        return self.window_min, self.window_max


@dataclass
class Ledger:
    """A request's account with plain decoding, in plain steps at the running context: what its
    settled passes produced less what they cost (a plain step adds 0, an accepted draft its
    saving, a rejected one minus its extra cost)."""

    origin: int = 0  # context length at the request's first pass
    gain: float = 0.0
    _open: tuple[int, float] | None = None  # (context length, relative cost) of the pass under way

    def allowance(self, context: int) -> float:
        """The most the next pass may cost above a plain step: with every token it drafts
        rejected, the request has still cost at most 1 + RISK plain steps per token produced."""
        return RISK * (context - self.origin + 1) + self.gain

    def open(self, context: int, cost: float) -> None:
        self._open = (context, cost)

    def settle(self, context: int) -> None:
        """The pass under way produced the tokens the context grew by."""
        if self._open is not None:
            start, cost = self._open
            self.gain += (context - start) - cost
            self._open = None


# Worth 4 passes, so this request's own evidence soon outweighs it. Chosen on the held-out tune
# split of Spec-Bench prompts by modelled speedup under a flat and a steep c(n) — never on the
# shipped goldens (docs/guard.md). The run state starts by succession (its 0.8 is unused).
DEFAULT_PRIOR = AcceptancePrior(rates=((0.8,), (0.3,), (0.4,), (0.5,), (0.6,)), weight=4.0,
                                succession=True)
