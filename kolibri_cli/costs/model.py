"""Forward costs: c(n), the cost of an n-token forward relative to a 1-token forward, either
given (a fixed model) or measured while generating (`CostTable`, by rows and context length)."""

import bisect
from collections import deque
from collections.abc import Callable

import numpy as np
from numba import njit

from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))
from kolibri_cli.errors import KolibriError

DEFAULT_COST_SLOPE = 0.06  # c(n) = 1 + slope (n - 1) when nothing was measured: c(6) = 1.30
# The guess: c(n) when no measured c(n) applies (costs/pricing.py; DEFAULT_COST_SLOPE keeps its
# role in CostTable), as measured: the default model (SmolLM2-135M Q4_1) on its default path,
# 2 threads, the c(T) curve of `kolibri bench --profile --repeats 5 --threads 2` (T = 1..8, 16,
# 64; linear between them). Beyond the largest n, cost_model carries the last
# slope on. The one table to re-measure whenever the kernel changes (docs/costs.md says how).
GUESS_HOST = "AMD EPYC (Zen 3, AVX2), 2 threads, the int16 path"  # where it was measured
GUESSED_COSTS = {1: 1.0, 2: 1.08, 3: 1.36, 4: 1.63, 5: 2.22, 6: 2.61, 7: 2.80, 8: 3.16, 16: 6.62,
                 64: 35.18}
KEEP = 15  # samples kept per (context octave, rows) cell: the median of the latest 15
TRUSTED = 3  # a cell is used before a nearer octave's once it holds this many
REFERENCE = 3  # 1-token timings a multi-token pass is compared with: the median of the latest 3
SANE = (0.1, 1e4)  # a kept c(rows) sample outside this was not timed by a forward pass
BENCH_CONTEXT = 100  # `kolibri bench` times c(n) after this many cached tokens (bench/run.py)
REACH = 2  # a measuring table prices rows up to REACH x the most it has timed; beyond: unknown


def cost_model(costs: dict[int, float] | None) -> Callable[[int], float]:
    """c(n), the cost of an n-token forward relative to a 1-token forward, from measured costs
    (any unit; divided by costs[1]): as measured where measured, linear between measured n (a
    curve timed on a grid, e.g. for `probe --concurrency`), the last slope beyond the largest.
    Without measurements: the default model c(n) = 1 + DEFAULT_COST_SLOPE * (n - 1), between the
    target c(6) <= 1.25 set for the float32 kernel and its prototype's measured 1.42."""
    if not costs:
        return lambda n: 1.0 + DEFAULT_COST_SLOPE * (n - 1)
    if 1 not in costs:
        raise KolibriError("costs need c(1), the 1-token forward; measure c(n) from n = 1")
    rel = {n: c / costs[1] for n, c in sorted(costs.items())}
    ns = list(rel)
    top = ns[-1]
    below = ns[-2] if len(ns) > 1 else None
    slope = DEFAULT_COST_SLOPE if below is None else (rel[top] - rel[below]) / (top - below)

    def c(n: int) -> float:
        if n in rel:
            return rel[n]
        if n > top:
            return rel[top] + slope * (n - top)
        hi = bisect.bisect(ns, n)  # ns[hi - 1] < n < ns[hi]
        lo_n, hi_n = ns[hi - 1], ns[hi]
        return rel[lo_n] + (rel[hi_n] - rel[lo_n]) * (n - lo_n) / (hi_n - lo_n)

    return c


def line_slope(costs: dict[int, float]) -> float:
    """The slope a of the least-squares line c(n) = 1 + a (n - 1) through measured `costs` (any
    unit; divided by costs[1]): the line goes through c(1) = 1, which holds by definition."""
    if 1 not in costs:
        raise KolibriError("costs need c(1), the 1-token forward; measure c(n) from n = 1")
    points = [(n - 1, c / costs[1] - 1) for n, c in costs.items() if n > 1]
    if not points:
        return 0.0
    return sum(x * y for x, y in points) / sum(x * x for x, _ in points)


def octave(context: int) -> int:
    """The context-length class a timing belongs to: 0 for 1 token, 1 for 2-3, 2 for 4-7, ..."""
    return max(int(context), 1).bit_length() - 1


class CostTable:
    """c(n) at a context length, either given (`from_costs`: the same numbers everywhere) or
    measured from the passes a generator already runs (`add`).

    Measured: each multi-token pass is compared with the latest 1-token passes (the median of the
    last REFERENCE), which ran moments before at nearly the same context length, so a machine
    whose load drifts cancels out of the ratio; the ratio is one sample of c(rows). Per octave
    of the context length and per row count the table keeps the latest KEEP samples; c(n) for a
    timed n is their median (from the octave nearest the asked context that holds TRUSTED
    samples of n, else the nearest with any), between timed row counts it is interpolated, so a
    kernel whose cost jumps at some row count (register tiles, a small-L path) is priced as it
    runs rather than as a line through long and short passes alike.

    Above the most rows it has timed (m), a measuring table prices up to REACH x m rows at
    c(m) (1 + DEFAULT_COST_SLOPE (n - m)) and calls more unknown (infinite): a request starts
    with a plain step (its 1-token time is the reference), then drafts at most one token, then at
    most 3, 7, 15: each longer draft is tried only once the expected gain at the shorter timed
    cost says so, instead of drafting long on another kernel's costs. A frozen table ignores
    `add` and answers DEFAULT_COST_SLOPE's line when empty: the policy that reads it is then a
    fixed function of the context, which the probe reproduces.
    """

    def __init__(self, frozen: bool = False, log: bool = False):
        self.frozen = frozen
        self.log: list[np.ndarray] | None = [] if log else None  # every answer of `relative`
        self._given: Callable[[int], float] | None = None  # from_costs: c(n), any context
        self._cells: dict[int, dict[int, _Cell]] = {}  # rows -> octave -> latest c(rows)
        self._ones: deque = deque(maxlen=REFERENCE)  # the latest 1-token timings (seconds)
        # per octave asked: `measured` there (kept current by `add`), and c[0..top] for the
        # largest top asked, each c[n] a function of n alone (a smaller top's is a prefix)
        self._measured: dict[int, dict[int, float]] = {}
        self._cache: dict[int, np.ndarray] = {}

    def add(self, rows: int, context: int, seconds: float) -> None:
        """Record one forward of `rows` tokens after `context` cached ones (no-op when frozen)."""
        if self.frozen or not seconds > 0:
            return
        if rows == 1:
            if not self._ones:
                self._cache.clear()  # the first reference: a 1-token draft may now be timed
            self._ones.append(float(seconds))
            return
        if not self._ones:
            return
        ratio, rows, o = seconds / _median(self._ones), int(rows), octave(context)
        if rows not in self._cells:  # a new row count: every octave reads another c(n)
            self._measured.clear()
            self._cache.clear()
        held = self._cells.setdefault(rows, {})
        if o in held:
            held[o].add(ratio)
        else:
            held[o] = _Cell([ratio])
        self._reread(rows)

    def _reread(self, rows: int) -> None:
        """Read c(rows) afresh at every octave asked (a cell reaching TRUSTED samples may be
        read for other octaves too); answers stand where it reads the same."""
        held = self._cells[rows]
        for o, measured in self._measured.items():
            cost = _nearest(held, o)
            if measured.get(rows) != cost:
                measured[rows] = cost
                self._cache.pop(o, None)

    def measured(self, context: int) -> dict[int, float]:
        """c(n) for every row count n timed so far, as read at this context length."""
        target = octave(context)
        return {rows: _nearest(self._cells[rows], target) for rows in sorted(self._cells)}

    def relative(self, context: int, top: int) -> np.ndarray:  # -> float64[top + 1]
        """c[n] for n = 1..top at this context length (c[0] unused, = 0; c[1] = 1)."""
        oct_, top = octave(context), int(top)
        kept = self._cache.get(oct_)
        if kept is None or len(kept) <= top:
            kept = self._cache[oct_] = self._relative(oct_, top)
        answer = kept[: top + 1]  # [top + 1]
        if self.log is not None:
            self.log.append(answer)
        return answer

    def _relative(self, oct_: int, top: int) -> np.ndarray:
        n = np.arange(top + 1, dtype=np.float64)  # [top + 1]
        if self._given is not None:
            c = np.array([0.0, *(self._given(int(m)) for m in n[1:])])
        elif self.frozen and not self._cells:
            c = 1.0 + DEFAULT_COST_SLOPE * (n - 1)
        else:
            if oct_ not in self._measured:
                self._measured[oct_] = self.measured(1 << oct_)
            c = self._interpolated(self._measured[oct_], n)
        c[0] = 0.0
        return c

    def _interpolated(self, measured: dict[int, float], n: np.ndarray) -> np.ndarray:
        """Timed row counts as timed, linear between them, a short reach above (see the class)."""
        if not measured and not self._ones:
            return np.where(n <= 1, 1.0, np.inf)  # no reference yet: a plain step first
        rows = np.array([1, *measured], dtype=np.float64)  # [m] ascending
        return _priced(rows, np.array([1.0, *measured.values()]), len(n) - 1)

    def to_dict(self) -> dict:
        """{"frozen", "ones": [seconds...], "cells": [[octave, rows, [c...]], ...]} — JSON-ready."""
        cells = sorted((o, r) for r, held in self._cells.items() for o in held)
        return {"frozen": self.frozen, "ones": list(self._ones),
                "cells": [[o, r, list(self._cells[r][o].samples)] for o, r in cells]}

    @classmethod
    def from_dict(cls, obj: dict, frozen: bool | None = None) -> "CostTable":
        table = cls(frozen=bool(obj.get("frozen", False)) if frozen is None else frozen)
        table._ones.extend(obj.get("ones", []))
        for o, r, samples in obj.get("cells", []):
            table._cells.setdefault(int(r), {})[int(o)] = _Cell(samples)
        return table

    @classmethod
    def seeded(cls, cells) -> "CostTable":
        """A measuring table starting from earlier runs' samples ([[octave, rows, [c, ...]],
        ...], `to_dict`'s cells); malformed cells are dropped, not trusted."""
        table = cls()
        for cell in cells if isinstance(cells, list) else []:
            if _valid_cell(cell):
                o, r, samples = cell
                table._cells.setdefault(r, {})[o] = _Cell(map(float, samples))
        return table

    def cells(self) -> list:
        """The samples per (octave, rows): what `seeded` starts a later table from."""
        return self.to_dict()["cells"]

    @classmethod
    def from_costs(cls, costs: dict[int, float]) -> "CostTable":
        """A frozen table giving these c(n) at every context length (e.g. `--costs`)."""
        table = cls(frozen=True)
        table._given = cost_model(costs)
        return table

    def freeze(self) -> "CostTable":
        """A frozen copy: the same costs from now on, whatever is added."""
        if self._given is not None:
            return self
        return CostTable.from_dict(self.to_dict(), frozen=True)


@njit(cache=True)
def _priced(rows, costs, top):  # rows, costs: float64[m], rows ascending from 1 -> float64[top + 1]
    """c[0..top] from the timed row counts: np.interp(n, rows, costs) with numpy's arithmetic
    (the same bits), c_top (1 + DEFAULT_COST_SLOPE (n - m)) above the most rows timed (m), inf
    above REACH m. One compiled call: a measuring table prices afresh after most drafted passes."""
    c, m = np.empty(top + 1), rows.shape[0]  # [top + 1]
    most, c_top = rows[m - 1], costs[m - 1]
    j = 0
    for n in range(top + 1):
        x = float(n)
        if x < rows[0]:
            c[n] = costs[0]
        elif x == most:
            c[n] = c_top
        elif x > most:
            c[n] = np.inf if x > REACH * most else c_top * (1.0 + DEFAULT_COST_SLOPE * (x - most))
        else:
            while rows[j + 1] <= x:
                j += 1
            c[n] = costs[j] if rows[j] == x else _between(x, rows[j], rows[j + 1], costs[j],
                                                          costs[j + 1])
    return c


@njit(cache=True)
def _between(x, x0, x1, y0, y1):  # -> float
    """numpy's interp between two points (x0 < x < x1), its NaN fallbacks included."""
    slope = (y1 - y0) / (x1 - x0)
    y = slope * (x - x0) + y0
    if y != y:
        y = slope * (x - x1) + y1
        if y != y and y0 == y1:
            y = y0
    return y


class _Cell:
    """The latest KEEP samples of c(rows) at one (octave, rows), and their median."""

    __slots__ = ("samples", "median")

    def __init__(self, samples):
        self.samples = deque(samples, maxlen=KEEP)
        self.median = _median(self.samples)

    def add(self, sample: float) -> None:
        self.samples.append(sample)
        self.median = _median(self.samples)


def _nearest(held: dict[int, _Cell], target: int) -> float:
    """The median of the cell nearest octave `target` among one row count's cells (octave ->
    cell), a cell holding TRUSTED samples before any that holds fewer."""
    trusted = [o for o, cell in held.items() if len(cell.samples) >= TRUSTED]
    o = min(trusted or held, key=lambda o: (abs(o - target), o))
    return held[o].median


def _median(samples) -> float:
    """statistics.median (sorted, the middle one or the mean of the middle two), without its
    overhead: the same number for the <= KEEP samples of a cell."""
    ordered = sorted(samples)
    half = len(ordered) // 2
    return ordered[half] if len(ordered) % 2 else (ordered[half - 1] + ordered[half]) / 2


def _valid_cell(cell) -> bool:
    """[octave 0..63, rows 2..4096, [ratios within SANE, ...]]; bools and huge ints refused"""
    if not (type(cell) is list and len(cell) == 3 and type(cell[2]) is list):
        return False
    o, r, samples = cell
    return (type(o) is int and type(r) is int and 0 <= o < 64 and 2 <= r <= 4096
            and bool(samples) and all(type(x) in (int, float) and SANE[0] <= x <= SANE[1]
                                      for x in samples))


def warm_table(model_sha256: str, numerics: str, threads: int) -> tuple[CostTable, str]:
    """(a measuring table for the guard, where its start came from): the samples the guard kept
    from earlier runs of this kernel ("kept"), else the c(n) `kolibri bench` timed for it with
    this kolibri on this CPU, one sample per row count ("bench"), else empty: the request
    calibrates ("none")."""
    from kolibri_cli.costs import samples as guardcosts
    from kolibri_cli.costs import store as benchcosts

    cells = guardcosts.load(guardcosts.kernel_key(model_sha256, numerics, threads))
    if cells:
        table = CostTable.seeded(cells)
        if table.cells():
            return table, "kept"
    try:
        found = benchcosts.find(benchcosts.load(), model_sha256, numerics, threads)
    except (KolibriError, OverflowError, TypeError):
        found = None
    if found is not None and benchcosts.timed_here(found):
        o = octave(BENCH_CONTEXT)
        return CostTable.seeded([[o, n, [c]] for n, c in found.costs.items() if n > 1]), "bench"
    return CostTable(), "none"


def keep_table(table: CostTable, model_sha256: str, numerics: str, threads: int) -> None:
    """Keep a measuring table's samples for the next run of this kernel (a frozen one: nothing)."""
    from kolibri_cli.costs import samples as guardcosts

    cells = table.cells() if isinstance(table, CostTable) and not table.frozen else []
    if cells:
        guardcosts.save(guardcosts.kernel_key(model_sha256, numerics, threads), cells)


class ReplayedCosts:
    """The answers a logging CostTable gave a live run, given again in the same order: a
    simulation of that run then decides exactly as the run did, whatever the timings were."""

    frozen = True

    def __init__(self):
        self._answers: list[np.ndarray] = []
        self._next = 0

    def extend(self, answers: list[np.ndarray]) -> None:
        self._answers.extend(answers)

    def add(self, rows: int, context: int, seconds: float) -> None:
        pass

    def relative(self, context: int, top: int) -> np.ndarray:
        if self._next >= len(self._answers) or len(self._answers[self._next]) != top + 1:
            raise KolibriError("the simulation asked for costs the live run did not (the "
                               "policy is not a function of the context and the costs)")
        self._next += 1
        return self._answers[self._next - 1]
