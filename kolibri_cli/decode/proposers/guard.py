"""The guard: draft only where the expected gain is positive, from forward costs measured at the
running context and acceptance learned online for this request."""

import math
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from numba import njit

from kolibri_cli.costs.model import CostTable
from kolibri_cli.decode.proposers.ngram import longest_match
from kolibri_cli.decode.proposers.protocol import CostsKind, Proposer
from kolibri_cli.decode.proposers.settings import validate_k, validate_window
from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))

# state: the previous candidate predicted every token produced since it was made, or every token
# it had (drafted whole, accepted whole, the pass's own token past its end)
RUN = 0
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
    # In a run that has predicted r tokens in a row, start from (r + 2 p) / (r + 2) instead of
    # the run state's rate: a run of one token continues less often than a run of twenty. p is
    # the estimated rate of the first token of the fresh match that started the run (the rule of
    # succession's uniform prior, p = 1/2, centred on that match's evidence instead): a run
    # started by a 1-gram coincidence is not yet sure of its next token.
    succession: bool = False

    def table(self, states: int, k: int) -> np.ndarray:  # -> float64[states, k]
        """The rates as an array, the last state and position repeated to fill (states, k)."""
        rows = [self.rates[min(s, len(self.rates) - 1)] for s in range(states)]
        return np.array([[r[min(i, len(r) - 1)] for i in range(k)] for r in rows])


# The guard's candidates: one row per candidate, the latest candidate_rows(k) of this
# request (a candidate is finished k tokens after it was made, and the context grows between
# calls, so at most k + 1 are ever pending), each k tokens long. Columns:
# context index its tokens are read from: the continuation of the match, repeating from SOURCE
# again where it reaches MADE (a match d tokens back predicts the text repeats with period d;
# while the candidate agrees, the produced token at SOURCE + i is the one it predicted there)
SOURCE = 0
MADE = 1  # context length when it was made: the index its first token predicts
STATE = 2  # RUN or the match length
RAN = 3  # tokens the candidates before it predicted in a row (0: a fresh match)
CHECKED = 4  # positions compared with the tokens produced so far
ALIVE = 5  # 1 while every compared position agreed
START = 6  # the match length that started its run (its own STATE when fresh)
COLUMNS = 7
# the guard's book: the context length at its last call, candidates made in this request, and
# whether the last call made one
SEEN, MADE_SO_FAR, HAS_LAST = 0, 1, 2
# A request's ledger, its account with plain decoding in plain steps at the running context:
# the context length at its first pass; what its settled passes produced less what they cost (a
# plain step adds 0, an accepted draft its saving, a rejected one minus its extra cost); the
# pass under way, (context length, relative cost), OPEN_AT -1 when none.
ORIGIN, GAIN, OPEN_AT, OPEN_COST = 0, 1, 2, 3


_SEARCH = np.array([-2, 0], np.int64)  # propose_grown's match: not known, search it


def candidate_rows(k: int) -> int:
    return k + 2


@dataclass
class Acceptance:
    """P(draft position i accepted | positions before it accepted), per state, learned from
    every candidate of this request — drafted or not: the tokens the model produces anyway show
    how far each candidate would have been accepted (choosing a token depends only on its
    position, never on the drafts), so skipping a draft loses no evidence.

    The rates are computed by compiled loops (one call per guard step, not dozens of Python
    and numpy ones on <= 16 floats): the same IEEE operations in the same order as the array
    formulas in the docstrings, so the same numbers bit for bit."""

    prior: AcceptancePrior
    states: int
    k: int
    tried: np.ndarray = field(init=False)  # [states, k] positions compared
    accepted: np.ndarray = field(init=False)  # [states, k] ... and agreed

    def __post_init__(self):
        self.weighted = self.prior.table(self.states, self.k) * self.prior.weight  # [states, k]
        self.tried = np.zeros((self.states, self.k))
        self.accepted = np.zeros((self.states, self.k))

    def rates(self, state: int, run: int = 0, start: int = 0) -> list[float]:  # -> [k]
        """Per position: (accepted + prior rate * weight) / (tried + weight). In a run, a
        position starts from the run's pooled rate instead: a run is the text repeating, which
        every position shares, so deep positions need not wait for evidence of their own. `run`:
        the tokens the run has predicted in a row, `start` the length of the match that began
        it (the prior's `succession`; 0: unknown, the rule of succession's 1/2)."""
        return _per_position(*self._estimates(), state, run, start, False).tolist()

    def cautious(self, state: int, run: int = 0, start: int = 0) -> list[float]:  # -> [k]
        """`rates` less CAUTION standard deviations, clipped to [0, 1], with the prior counted
        as `weight` observations (a Beta posterior's spread, rate (1 - rate) / (tried + weight
        + 1)): drafting waits for evidence."""
        return _per_position(*self._estimates(), state, run, start, True).tolist()

    def _estimates(self) -> tuple:
        return (self.weighted, self.prior.weight, self.prior.succession, self.tried,
                self.accepted)


@njit(cache=True)
def _rate(weighted, weight, tried, accepted, state, i, pooled):  # -> float
    """Acceptance.rates at position i (pooled: the run's pooled rate * weight, in RUN)."""
    prior = pooled if state == RUN else weighted[state, i]
    return (accepted[state, i] + prior) / (tried[state, i] + weight)


@njit(cache=True)
def _pooled(weighted, weight, succession, tried, accepted, run, began):  # -> float
    """The run state's pooled rate * weight: every position's prior in a run (began: the
    match length that started it, 0 unknown)."""
    p = 0.5 if began <= 0 else _rate(weighted, weight, tried, accepted, began, 0, 0.0)
    start = (run + 2.0 * p) / (run + 2) * weight if succession else weighted[RUN, 0]
    hits, seen = 0.0, 0.0  # sums of counts: whole numbers, exact in any order
    for i in range(tried.shape[1]):
        hits += accepted[RUN, i]
        seen += tried[RUN, i]
    return (hits + start) / (seen + weight) * weight


@njit(cache=True)
def _cautious_rate(weighted, weight, tried, accepted, state, i, pooled):  # -> float
    """Acceptance.cautious at position i: np.clip(rate - CAUTION sqrt(rate (1 - rate) /
    (tried + weight + 1)), 0, 1) with np.sqrt's and np.clip's NaN and -0.0 rules."""
    r = _rate(weighted, weight, tried, accepted, state, i, pooled)
    spread = r * (1.0 - r) / (tried[state, i] + weight + 1.0)
    x = r - CAUTION * (math.sqrt(spread) if spread >= 0.0 else math.nan)
    if 0.0 < x < 1.0 or x != x:
        return x
    return 0.0 if x <= 0.0 else 1.0


@njit(cache=True)
def _per_position(weighted, weight, succession, tried, accepted, state, run, began, cautious):
    """Acceptance.rates or .cautious, all k positions. -> float64[k]"""
    pooled = (_pooled(weighted, weight, succession, tried, accepted, run, began)
              if state == RUN else 0.0)
    out = np.empty(tried.shape[1])  # [k]
    for i in range(out.shape[0]):
        if cautious:
            out[i] = _cautious_rate(weighted, weight, tried, accepted, state, i, pooled)
        else:
            out[i] = _rate(weighted, weight, tried, accepted, state, i, pooled)
    return out


@njit(cache=True)
def _choose(c, weighted, weight, succession, tried, accepted, state, run, began, limit, ledger,
            context, sure, risk):  # c: float64[>= limit + 2], ledger: float64[4] -> int
    """argmax over j = 0..limit of (1 + sum_{i<j} prod_{l<=i} p[l]) / c[j + 1], p the cautious
    rates: expected tokens per unit cost; the first maximum (the shorter draft on ties), or the
    first NaN. A draft not sure of its first token (p[0] < sure) is held to the ledger's
    allowance, RISK (context - origin + 1) + gain: longer drafts cost more still, so the search
    stops at the first that costs more above a plain step. Opens the ledger's pass."""
    pooled = (_pooled(weighted, weight, succession, tried, accepted, run, began)
              if state == RUN else 0.0)
    first = _cautious_rate(weighted, weight, tried, accepted, state, 0, pooled)
    budget = np.inf if first >= sure else (
        risk * (context - ledger[ORIGIN] + 1.0) + ledger[GAIN])
    best, where = 1.0 / c[1], 0
    nan = best != best
    reach, product = 0.0, 1.0
    for j in range(limit):
        if c[j + 2] - c[1] > budget:
            break  # longer drafts cost more still (a draft of j + 1 tokens is not chosen)
        product *= _cautious_rate(weighted, weight, tried, accepted, state, j, pooled)
        reach += product
        value = (1.0 + reach) / c[j + 2]
        if not nan and value != value:
            nan, where = True, j + 1
        if not nan and value > best:
            best, where = value, j + 1
    ledger[OPEN_AT], ledger[OPEN_COST] = context, c[where + 1]
    return where


@njit(cache=True)
def _advance(tokens, seen, book, candidates, tried, accepted, ledger, k, window_min,
             window_max, known, vouched):
    """One guard step before pricing: recognise a new request (the context is not the last one
    grown by 1..k + 1 tokens: the estimates and the ledger restart) or learn from the tokens
    produced since and settle the last pass; match; enter the candidate (none: the ledger opens
    a plain step). -> (source, length, state, run, began), source -1 when nothing matched
    (began: the match length that started the run, the state itself when fresh).
    tokens: int64[T]; seen: int64[>= T] the context at the last call; book: int64[3];
    candidates: int64[rows, COLUMNS]; tried, accepted: float64[states, k]; ledger: float64[4];
    known: int64[2] longest_match(tokens, ...) if known[0] >= -1, else it is searched here;
    vouched: the caller knows the context starts with the last one (not compared again)."""
    total, had = tokens.shape[0], book[SEEN]
    grown = 0 < had < total <= had + k + 1
    for i in range(had if grown and not vouched else 0):
        if tokens[i] != seen[i]:
            grown = False
            break
    if grown:
        _learn(tokens, book[MADE_SO_FAR], candidates, tried, accepted)
        if ledger[OPEN_AT] >= 0:  # the pass under way produced the tokens the context grew by
            ledger[GAIN] += (total - ledger[OPEN_AT]) - ledger[OPEN_COST]
    else:
        tried[:, :] = 0.0
        accepted[:, :] = 0.0
        book[MADE_SO_FAR], book[HAS_LAST], had = 0, 0, 0
        ledger[ORIGIN], ledger[GAIN] = total, 0.0
    ledger[OPEN_AT] = -1
    seen[had:total] = tokens[had:]
    book[SEEN] = total
    source, n = known[0], known[1]
    if source < -1:
        source, n = longest_match(tokens, window_min, window_max)
    if source < 0:
        book[HAS_LAST] = 0
        ledger[OPEN_AT], ledger[OPEN_COST] = total, 1.0
        return -1, 0, 0, 0, 0
    state, run, rows = min(n, window_max), 0, candidates.shape[0]
    began = state
    if book[HAS_LAST]:
        last = candidates[(book[MADE_SO_FAR] - 1) % rows]  # [COLUMNS]
        if last[ALIVE] and 0 < last[CHECKED] and (total - last[MADE] == last[CHECKED]
                                                   or last[CHECKED] == k):
            state, run, began = RUN, last[RAN] + last[CHECKED], last[START]
    row = candidates[book[MADE_SO_FAR] % rows]  # [COLUMNS]
    row[SOURCE], row[MADE] = source, total
    row[STATE], row[RAN], row[CHECKED], row[ALIVE] = state, run, 0, 1
    row[START] = began
    book[MADE_SO_FAR] += 1
    book[HAS_LAST] = 1
    return source, k, state, run, began


@njit(cache=True)
def _learn(tokens, made, candidates, tried, accepted):
    """Compare the pending candidates (the latest rows, alive, not fully checked) with the
    tokens produced since they were made."""
    total, rows, k = tokens.shape[0], candidates.shape[0], tried.shape[1]
    for c in range(max(made - rows, 0), made):
        row = candidates[c % rows]  # [COLUMNS]
        state = row[STATE]
        while row[ALIVE] and row[CHECKED] < k and row[MADE] + row[CHECKED] < total:
            i = row[CHECKED]
            tried[state, i] += 1.0
            row[ALIVE] = tokens[row[SOURCE] + i] == tokens[row[MADE] + i]
            accepted[state, i] += row[ALIVE]
            row[CHECKED] += 1


def warm_up() -> None:
    """Compile (a machine's first run) or load from numba's cache this module's kernels."""
    guard = GuardProposer(2, 1, 2, costs=CostTable.from_costs({1: 1.0, 2: 1.0}))
    for n in range(3, 7):
        guard.propose([1, 2] * n, 2)
    guard._acceptance.rates(1)
    table = CostTable()  # a measuring table's pricing
    table.add(1, 8, 1.0)
    table.add(2, 8, 1.2)
    table.relative(8, 3)


@dataclass
class GuardProposer(Proposer):
    """vLLM's match (longest n in the window, leftmost occurrence) gives k candidate tokens (its
    continuation, repeating from the occurrence again where it reaches the context's end);
    the guard drafts the prefix length j in 0..k maximising the expected tokens per unit cost,

        (1 + sum_{i<=j} prod_{l<i} p[s][l]) / c(1 + j, context),

    with p from `Acceptance`, taken cautiously (state s: RUN when the previous candidate is still
    right, else the match length) and c from the cost table at the running context length.
    j = 0 — a plain step — whenever no draft is expected to pay for itself; ties go to the
    shorter draft. A draft whose first token is cautiously less likely right than SURE is held
    to the request's ledger: with all of it rejected the request must still have cost at most
    1 + RISK plain steps per token produced. The choice is a function of the context and the
    table only: with a frozen
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
    costs_kind: ClassVar[CostsKind] = "table"  # read every pass, timed into while generating
    # acceptance and measured costs are this request's own (the probe gives each golden a
    # fresh guard; a given table is frozen), so goldens may be replayed anywhere
    shares_state: ClassVar[bool] = False

    def __post_init__(self):
        validate_k(self.k)
        validate_window(self.window_min, self.window_max)
        self.prior = self.prior or DEFAULT_PRIOR
        self._seen = np.zeros(256, dtype=np.int64)  # [>= T] the context at the last call
        self._book = np.zeros(3, dtype=np.int64)  # SEEN, MADE_SO_FAR, HAS_LAST
        self._candidates = np.zeros((candidate_rows(self.k), COLUMNS), dtype=np.int64)
        self._ledger = np.array([0.0, 0.0, -1.0, 0.0])  # ORIGIN, GAIN, OPEN_AT, OPEN_COST
        self._acceptance = Acceptance(self.prior, self.window_max + 1, self.k)

    def propose(self, context, max_tokens: int) -> list[int]:
        return self.propose_grown(context, max_tokens, _SEARCH, False)

    def propose_grown(self, context, max_tokens: int, match: np.ndarray,
                      vouched: bool) -> list[int]:
        """`propose`, given the context's longest_match (int64[2]; _SEARCH: search it) and,
        if `vouched`, the caller's word that the context extends the last call's (a replay
        walking one chain): each call then costs what the context grew by, not its length."""
        # one compiled call for the bookkeeping and the match: a guard step runs right after
        # a forward has evicted the caches, where every Python and numpy call is slow
        tokens = np.ascontiguousarray(context, dtype=np.int64)  # [T]
        if len(tokens) > len(self._seen):  # room for this context and as much again
            self._seen = np.concatenate([self._seen, np.zeros(len(tokens), np.int64)])
        a = self._acceptance
        source, limit, state, run, began = _advance(
            tokens, self._seen, self._book, self._candidates, a.tried, a.accepted, self._ledger,
            self.k, self.window_min, self.window_max, match, vouched)
        if source < 0:
            return []
        length = self._choose(state, min(limit, max(max_tokens, 0)), len(tokens), run,
                              self._ledger, began)
        period = len(tokens) - source  # the match's continuation, repeated past the end
        return [int(tokens[source + i % period]) for i in range(length)]

    def best_length(self, state: int, limit: int, context: int, run: int = 0,
                    began: int = 0) -> int:
        """The draft length in 0..limit with the most expected tokens per unit of cost among
        those the request can afford (began: the match length that started the run)."""
        return self._choose(state, limit, context, run, self._ledger.copy(), began)

    def _choose(self, state: int, limit: int, context: int, run: int, ledger,
                began: int = 0) -> int:
        """best_length, opening the pass in `ledger` (float64[4])."""
        if limit == 0:
            ledger[OPEN_AT], ledger[OPEN_COST] = context, 1.0
            return 0
        c = self.costs.relative(context, limit + 1)  # [limit + 2]
        return _choose(c, *self._acceptance._estimates(), state, run, began, limit, ledger,
                       context, SURE, RISK)

    @property
    def last_run(self) -> int | None:
        """The run of the last call's candidate (None: it made none)."""
        return self._last(RAN)

    @property
    def last_began(self) -> int | None:
        """The match length that began the last call's candidate's run (None: it made none)."""
        return self._last(START)

    def _last(self, column: int) -> int | None:
        """A column of the last call's candidate (None: it made none)."""
        if not self._book[HAS_LAST]:
            return None
        return int(self._candidates[(self._book[MADE_SO_FAR] - 1) % len(self._candidates),
                                    column])

    @property
    def window(self) -> tuple[int, int]:
        return self.window_min, self.window_max


# Worth 4 passes, so this request's own evidence soon outweighs it. Chosen on the held-out tune
# split of Spec-Bench prompts by modelled speedup under a flat and a steep c(n) — never on the
# shipped goldens (docs/guard.md). The run state starts by succession (its 0.8 is unused).
DEFAULT_PRIOR = AcceptancePrior(rates=((0.8,), (0.3,), (0.4,), (0.5,), (0.6,)), weight=4.0,
                                succession=True)
