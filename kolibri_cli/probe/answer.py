"""The probe's answer: the fastest setting, how much faster than plain it is, how sure that is,
and whether to turn speculation on — ranked by speed, never by the pass ratio.

Scope: the speed of each simulated (and measured) configuration, overall and per golden; the
ranking and "best" (defined here, once); the verdict and its spread, overall and per category:
the choice of the fastest setting re-made in each bootstrap resample of the goldens and judged on
the goldens it left out, and c(n) drawn from their own uncertainty. The one verdict rule (`judge`)
is read at B = 1 and under load (load.py) alike. Non-goals: simulating, measuring, rendering,
gating (gates.py reads the verdict's figures).
"""

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from kolibri_cli.costs.model import cost_model
from kolibri_cli.probe.simulate import Counts, SimRun, spec_time_by_length

WASH = 0.02  # a best speedup under 1 + WASH pays too little to be worth the risk: a wash
DRAWS = 2000  # bootstrap resamples of the goldens
LEVEL = 0.95  # the interval's coverage
BOOTSTRAP_SEED = 0  # fixed: the same goldens give the same interval on every run
MIN_GOLDENS = 5  # fewer goldens than this give no interval worth the name: TOO_FEW
PAYS, WASHES, LOSES, TOO_FEW = "pays", "a wash", "does not pay", "too few goldens"

RunKey = tuple[str, int, tuple[int, int]]  # (proposer, k, window)


def run_key(run: SimRun) -> RunKey:
    return run.proposer, run.k, run.window


@dataclass(frozen=True)
class Speed:
    """One configuration's speedup over plain decode: the figure the ranking reads (measured
    where measured, else predicted), its interval, and per golden."""

    run: SimRun
    predicted: float | None  # the cost model's speedup over every golden
    measured: float | None = None  # --measure's speedup, when this run was measured
    interval: tuple[float, float] | None = None  # of `value`, LEVEL bootstrap over goldens
    per_golden: list[tuple[str | int, float | None]] = field(default_factory=list)  # of `value`

    @property
    def value(self) -> float | None:
        return self.predicted if self.measured is None else self.measured

    @property
    def basis(self) -> str:
        return "predicted" if self.measured is None else "measured"

    @property
    def faster(self) -> int:
        """Goldens on which this setting beats plain decode."""
        return sum(1 for _, s in self.per_golden if s is not None and s > 1.0)

    @property
    def worst(self) -> tuple[str | int, float] | None:
        """(id, speedup) of the golden it fares worst on."""
        known = [(g, s) for g, s in self.per_golden if s is not None]
        return min(known, key=lambda x: x[1]) if known else None


Interval = tuple[float, float]


@dataclass(frozen=True)
class Spread:
    """How sure the fastest setting's speed is on new traffic of the same kind (LEVEL intervals):
    `goldens`, the fastest setting chosen afresh in each bootstrap resample of the goldens and
    judged on the goldens that resample left out (out-of-bag), so a setting that won by luck is
    not priced on the goldens that chose it; `costs`, the setting priced on every golden with
    c(n) drawn from their own spread; `combined`, both at once: what the verdict reads."""

    goldens: Interval | None
    costs: Interval | None
    combined: Interval | None

    def to_json(self) -> dict:
        return {name: None if v is None else list(v) for name, v in self.__dict__.items()}


@dataclass(frozen=True)
class Verdict:
    """Whether speculation pays with its fastest setting (`judge`)."""

    answer: str  # PAYS, WASHES, LOSES or TOO_FEW
    speed: Speed  # the fastest setting's
    scope: str = "all"  # "all", or the category this verdict is for
    spread: Spread | None = None  # predicted: the interval of what a user will get
    goldens: int | None = None  # how many goldens it rests on (None: not kept)
    slice: str | None = None  # --where: the expression that chose its goldens

    @property
    def pays(self) -> bool:
        return self.answer == PAYS

    @property
    def interval(self) -> Interval | None:
        """The interval the answer reads: the combined spread, else the speed's own."""
        if self.spread is not None and self.spread.combined is not None:
            return self.spread.combined
        return self.speed.interval


def judge(value: float | None, interval: Interval | None, goldens: int | None = None) -> str:
    """The one verdict rule, at B = 1 and at every B under load: TOO_FEW under MIN_GOLDENS
    goldens; PAYS when the interval lies above 1.00x and the speedup is at least 1 + WASH; LOSES
    when it lies below 1.00x; else WASHES (no interval: the figure alone)."""
    if goldens is not None and goldens < MIN_GOLDENS:
        return TOO_FEW
    if value is None:
        return WASHES
    low, high = interval or (value, value)
    if low > 1.0 and value >= 1.0 + WASH:
        return PAYS
    if high < 1.0:
        return LOSES
    return WASHES


def verdict_of(speed: Speed, scope: str = "all", spread: Spread | None = None,
               goldens: int | None = None) -> Verdict:
    verdict = Verdict(WASHES, speed, scope, spread, goldens)
    return Verdict(judge(speed.value, verdict.interval, goldens), speed, scope, spread, goldens)


# ---- prediction -------------------------------------------------------------------------------


def spec_cost(run: SimRun, counts: Counts) -> float:
    """The verify passes' cost in plain steps: sum over passes of c(1 + len(d)), with the run's
    c(n) (proposer time not included, as in modelled_speedup)."""
    c = cost_model(run.costs)
    by_length = counts.passes_by_draft_length()
    return spec_time_by_length(by_length, {n: c(n) for n in range(1, len(by_length) + 1)}, 0.0)


def _ratio(plain: float, cost: float) -> float | None:
    return plain / cost if cost else None


def _picks(g: int) -> np.ndarray:  # -> int[DRAWS, G]
    """The goldens of each resample (seeded: the same for every interval of a run)."""
    return np.random.default_rng(BOOTSTRAP_SEED).integers(0, g, (DRAWS, g))


def _percentiles(values: np.ndarray) -> Interval | None:
    values = values[np.isfinite(values)]
    if values.size == 0:
        return None
    tail = (1.0 - LEVEL) / 2
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return float(low), float(high)


def _ratios(top: np.ndarray, bottom: np.ndarray) -> np.ndarray:
    return top / np.where(bottom > 0, bottom, np.nan)


def bootstrap(plain: np.ndarray, cost: np.ndarray) -> Interval | None:
    """The LEVEL percentile interval of sum(plain) / sum(cost) over goldens resampled with
    replacement (plain, cost: [G] per golden); None under two goldens."""
    g = plain.shape[0]
    if g < 2:
        return None
    picks = _picks(g)  # [DRAWS, G]
    return _percentiles(_ratios(plain[picks].sum(axis=1), cost[picks].sum(axis=1)))


# Forwards by row count: a setting's time on a golden is weights @ c, weights [G, N] counting
# the forwards of n = 0..N-1 tokens (at B > 1: each step's share, load.py), c [N] = c(0..N-1).
Weights = Callable[[int], tuple[np.ndarray, np.ndarray]]  # setting -> (plain [G, N], spec [G, N])


def spread_of(choose: np.ndarray, plain: np.ndarray, weights: Weights, first: int,
              base: np.ndarray, curves: np.ndarray) -> Spread | None:
    """The Spread of setting `first`: in each resample the fastest setting on the resampled
    goldens (choose [R, G]: each setting's priced cost per golden; plain [G]: plain's) is judged
    on the goldens left out, its time weights(r) @ c — c the priced curve (base [N']) for
    `goldens`, a drawn one (curves [DRAWS, N']) for `combined`; `costs`: `first` on every golden
    under each drawn curve. None under two goldens."""
    g = plain.shape[0]
    if g < 2:
        return None
    picks = _picks(g)  # [DRAWS, G]
    mult = np.bincount((np.arange(DRAWS)[:, None] * g + picks).ravel(),
                       minlength=DRAWS * g).reshape(DRAWS, g).astype(np.float64)  # [DRAWS, G]
    spec = mult @ choose.T  # [DRAWS, R]
    speed = np.where(spec > 0, (mult @ plain)[:, None] / np.where(spec > 0, spec, 1.0), -np.inf)
    chosen = np.argmax(speed, axis=1)  # [DRAWS] ties: the earlier setting, as the ranking
    left_out = (mult == 0).astype(np.float64)  # [DRAWS, G]
    held, combined = np.full(DRAWS, np.nan), np.full(DRAWS, np.nan)  # [DRAWS]
    for r in np.unique(chosen):
        rows = np.flatnonzero(chosen == r)
        wp, ws = weights(int(r))  # [G, N] each
        n = wp.shape[1]
        p, s = left_out[rows] @ wp, left_out[rows] @ ws  # [d, N]
        held[rows] = _ratios(p @ base[:n], s @ base[:n])
        c = curves[rows, :n]  # [d, N]
        combined[rows] = _ratios((p * c).sum(axis=1), (s * c).sum(axis=1))
    wp, ws = weights(first)
    c = curves[:, :wp.shape[1]]  # [DRAWS, N]
    costs = _ratios(c @ wp.sum(axis=0), c @ ws.sum(axis=0))  # [DRAWS]
    return Spread(_percentiles(held), _percentiles(costs), _percentiles(combined))


def length_weights(runs: list[SimRun], goldens: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """At B = 1: plain [G, N] (every step one 1-token forward) and spec [R, G, N] (each verify
    pass one forward of 1 + drafted tokens) of the goldens at these indices."""
    lengths = [[r.goldens[i].counts.passes_by_draft_length() for i in goldens] for r in runs]
    n = 2 + max(len(x) for per in lengths for x in per)
    spec = np.zeros((len(runs), len(goldens), n))  # [R, G, N]
    for r, per in enumerate(lengths):
        for j, by_length in enumerate(per):
            spec[r, j, 1:1 + len(by_length)] = by_length
    plain = np.zeros((len(goldens), n))  # [G, N]
    plain[:, 1] = [runs[0].goldens[i].counts.plain_steps for i in goldens]
    return plain, spec


def choice_spread(runs: list[SimRun], first: SimRun, pricing=None,
                  category: str | None = None) -> Spread | None:
    """The Spread of `first`, the fastest of `runs` (over one category's goldens if named);
    None without per-golden rows."""
    if any(r.goldens is None for r in runs):
        return None
    picked = [i for i, g in enumerate(runs[0].goldens) if category in (None, g.category)]
    plain, spec = length_weights(runs, picked)  # [G, N], [R, G, N]
    base, curves = priced_curves(first, pricing, plain.shape[1] - 1)
    choose = spec @ base  # [R, G]
    return spread_of(choose, plain[:, 1], lambda r: (plain, spec[r]),
                     next(i for i, r in enumerate(runs) if r is first), base, curves)


def priced_curves(run: SimRun, pricing, top: int) -> tuple[np.ndarray, np.ndarray]:
    """c(0..top) as priced ([top + 1]) and as drawn from their own spread ([DRAWS, top + 1]; no
    Pricing: the priced curve every time)."""
    c = cost_model(run.costs)
    base = np.array([0.0, *(c(n) for n in range(1, top + 1))])  # [top + 1]
    if pricing is None:
        return base, np.tile(base, (DRAWS, 1))
    return base, pricing.curves(top, DRAWS, BOOTSTRAP_SEED)


def predicted_speed(run: SimRun, category: str | None = None) -> Speed:
    """The run's predicted speedup (over one category's goldens if named), with its interval and
    per golden; without per-golden rows (too many chains) no interval."""
    counts = run.total if category is None else run.by_category().get(category, Counts())
    goldens = [g for g in run.goldens or [] if category is None or g.category == category]
    plain = np.array([g.counts.plain_steps for g in goldens], dtype=np.float64)  # [G]
    cost = np.array([spec_cost(run, g.counts) for g in goldens], dtype=np.float64)  # [G]
    per = [(g.id, _ratio(p, c)) for g, p, c in zip(goldens, plain, cost, strict=True)]
    return Speed(run, _ratio(counts.plain_steps, spec_cost(run, counts)),
                 interval=bootstrap(plain, cost), per_golden=per)


def measured_speed(run: SimRun, measured) -> Speed:
    """The run's measured speedup (a probe.result.Measured), with a bootstrap interval over its
    timed goldens weighted by their plain time, as the overall figure is."""
    timed = [g for g in measured.goldens if not g.too_short] or measured.goldens
    steps = {g.id: g.counts.plain_steps for g in run.goldens or []}
    plain = np.array([steps.get(g.id, 0) / g.plain_tokens_per_s if g.plain_tokens_per_s else 0.0
                      for g in timed], dtype=np.float64)  # [G] plain decode seconds
    spec = np.array([p / g.speedup if g.speedup else 0.0 for p, g in zip(plain, timed,
                                                                       strict=True)])  # [G]
    predicted = predicted_speed(run)
    return Speed(run, predicted.predicted, measured.speedup, bootstrap(plain, spec),
                 [(g.id, g.speedup) for g in measured.goldens])


# ---- ranking ----------------------------------------------------------------------------------


def ranking(runs: list[SimRun], measured: dict | None = None) -> list[Speed]:
    """Every configuration, fastest first: the measured ones by measured speedup, then the rest
    by predicted speedup (ties: the earlier run). What "best" means everywhere: ranking[0]."""
    measured = measured or {}
    speeds = [measured_speed(r, measured[run_key(r)]) if run_key(r) in measured
              else _quick(r) for r in runs]
    order = sorted(range(len(runs)), key=lambda i: (speeds[i].measured is None,
                                                    -(speeds[i].value or 0.0), i))
    return [speeds[i] for i in order]


def _quick(run: SimRun) -> Speed:
    """The predicted speedup alone (intervals are drawn for the settings reported in full)."""
    return Speed(run, _ratio(run.total.plain_steps, spec_cost(run, run.total)))


def best(runs: list[SimRun], measured: dict | None = None) -> SimRun:
    """The fastest configuration (ranking's first)."""
    return ranking(runs, measured)[0].run


def fastest_per_proposer(runs: list[SimRun], ranked: list[Speed]) -> list[Speed]:
    """Each proposer's fastest configuration, in the order the proposers were given."""
    firsts: dict[str, Speed] = {}
    for speed in ranked:
        firsts.setdefault(speed.run.proposer, speed)
    return [firsts[p] for p in dict.fromkeys(r.proposer for r in runs)]


def with_interval(speed: Speed) -> Speed:
    """The speed with its interval and per-golden figures (a measured one has them already)."""
    if speed.measured is not None or speed.per_golden:
        return speed
    return predicted_speed(speed.run)


# ---- per category -----------------------------------------------------------------------------


def category_verdicts(runs: list[SimRun], pricing=None) -> dict[str, Verdict]:
    """For each golden category, the verdict of the setting fastest on that category's goldens
    (predicted: --measure measures whole runs, not categories), read as the overall one is."""
    categories = list(dict.fromkeys(c for r in runs for c in r.by_category()))
    out = {}
    for category in categories:
        def speed(run: SimRun, c=category) -> float:
            counts = run.by_category().get(c)
            return -1.0 if counts is None else _ratio(counts.plain_steps,
                                                      spec_cost(run, counts)) or 0.0

        fastest = max(runs, key=speed)  # ties: the earlier run
        out[category] = predicted_verdict(runs, fastest, pricing, category)
    return out


def predicted_verdict(runs: list[SimRun], fastest: SimRun, pricing=None,
                      category: str | None = None, speed: Speed | None = None) -> Verdict:
    """The verdict of `fastest` (the predicted fastest of `runs`), overall or on one category,
    from its choice-and-c(n) spread; under MIN_GOLDENS goldens: TOO_FEW."""
    speed = speed or predicted_speed(fastest, category)
    goldens = None if fastest.goldens is None else len(speed.per_golden)
    spread = choice_spread(runs, fastest, pricing, category) \
        if goldens is not None and goldens >= MIN_GOLDENS else None
    return verdict_of(speed, category or "all", spread, goldens)
