"""The probe's answer: the fastest setting, how much faster than plain it is, how sure that is,
and whether to turn speculation on — ranked by speed, never by the pass ratio.

Scope: the speed of each simulated (and measured) configuration, overall and per golden; the
ranking and "best" (defined here, once); the verdict and its spread (a bootstrap over goldens),
overall and per category. Non-goals: simulating, measuring, rendering, gating (gates.py reads
the verdict's figures).
"""

from dataclasses import dataclass, field

import numpy as np

from kolibri_cli.costs.model import cost_model
from kolibri_cli.probe.simulate import Counts, SimRun, spec_time_by_length

WASH = 0.02  # a best speedup under 1 + WASH pays too little to be worth the risk: a wash
DRAWS = 2000  # bootstrap resamples of the goldens
LEVEL = 0.95  # the interval's coverage
BOOTSTRAP_SEED = 0  # fixed: the same goldens give the same interval on every run
PAYS, WASHES, LOSES = "pays", "a wash", "does not pay"

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


@dataclass(frozen=True)
class Verdict:
    """Whether speculation pays with its fastest setting: PAYS when the interval lies above 1
    and the gain exceeds WASH, LOSES when it lies below 1, else WASHES."""

    answer: str  # PAYS, WASHES or LOSES
    speed: Speed  # the fastest setting's
    scope: str = "all"  # "all", or the category this verdict is for

    @property
    def pays(self) -> bool:
        return self.answer == PAYS


def verdict_of(speed: Speed, scope: str = "all") -> Verdict:
    value, (low, high) = speed.value, speed.interval or (speed.value, speed.value)
    if value is None:
        return Verdict(WASHES, speed, scope)
    if low > 1.0 and value >= 1.0 + WASH:
        return Verdict(PAYS, speed, scope)
    if high < 1.0:
        return Verdict(LOSES, speed, scope)
    return Verdict(WASHES, speed, scope)


# ---- prediction -------------------------------------------------------------------------------


def spec_cost(run: SimRun, counts: Counts) -> float:
    """The verify passes' cost in plain steps: sum over passes of c(1 + len(d)), with the run's
    c(n) (proposer time not included, as in modelled_speedup)."""
    c = cost_model(run.costs)
    by_length = counts.passes_by_draft_length()
    return spec_time_by_length(by_length, {n: c(n) for n in range(1, len(by_length) + 1)}, 0.0)


def _ratio(plain: float, cost: float) -> float | None:
    return plain / cost if cost else None


def bootstrap(plain: np.ndarray, cost: np.ndarray) -> tuple[float, float] | None:
    """The LEVEL percentile interval of sum(plain) / sum(cost) over goldens resampled with
    replacement (plain, cost: [G] per golden); None under two goldens."""
    g = plain.shape[0]
    if g < 2:
        return None
    picks = np.random.default_rng(BOOTSTRAP_SEED).integers(0, g, (DRAWS, g))  # [DRAWS, G]
    cost_sums = cost[picks].sum(axis=1)  # [DRAWS]
    ratios = plain[picks].sum(axis=1) / np.where(cost_sums > 0, cost_sums, np.nan)  # [DRAWS]
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return None
    tail = (1.0 - LEVEL) / 2
    low, high = np.quantile(ratios, [tail, 1.0 - tail])
    return float(low), float(high)


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
    """The run's measured speedup (a probe.report.Measured), with a bootstrap interval over its
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


def category_verdicts(runs: list[SimRun]) -> dict[str, Verdict]:
    """For each golden category, the verdict of the setting fastest on that category's goldens
    (predicted: --measure measures whole runs, not categories)."""
    categories = list(dict.fromkeys(c for r in runs for c in r.by_category()))
    out = {}
    for category in categories:
        def speed(run: SimRun, c=category) -> float:
            counts = run.by_category().get(c)
            return -1.0 if counts is None else _ratio(counts.plain_steps,
                                                      spec_cost(run, counts)) or 0.0

        fastest = max(runs, key=speed)  # ties: the earlier run
        out[category] = verdict_of(predicted_speed(fastest, category), category)
    return out
