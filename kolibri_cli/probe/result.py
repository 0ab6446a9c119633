"""One probe run's result: what was simulated (and measured), ranked by speed, the verdict, where
its c(n) came from, and the gates' outcome; and the result types its producers fill (`Measured`
and `MeasuredGolden` by measure/, a chain's counts as JSON by replay/). Every output (terminal,
JSON, Markdown, PNG) renders these objects; none decides anything of its own.
"""

from dataclasses import dataclass, field, replace

from kolibri_cli.probe.answer import (
    Speed,
    Verdict,
    category_verdicts,
    fastest_per_proposer,
    predicted_verdict,
    ranking,
    run_key,
    verdict_of,
    with_interval,
)
from kolibri_cli.probe.gates import Gate, failure, holds, shorthand
from kolibri_cli.probe.simulate import Counts, SimRun

MIN_TIMED_STEPS = 4  # decode steps: 1-3 last a few ms, where scheduling noise alone gave
# "speedups" of 1.29x-1.43x on 1-2 token chains


def too_short_to_time(decode_steps: int) -> bool:
    """A golden of so few decode steps that its measured speedup is timing noise."""
    return decode_steps < MIN_TIMED_STEPS


def timed_only(items: list, goldens: list["MeasuredGolden"]) -> list:
    """Of `items` (one per golden), those of the goldens long enough to time, or all of them
    when none is: what the overall figures are taken over."""
    return [x for x, g in zip(items, goldens, strict=True) if not g.too_short] or items


@dataclass
class MeasuredGolden:
    """One golden run with the model, plain and speculative (filled by the measuring probe)."""

    id: str | int
    plain_tokens_per_s: float  # decode tok/s, prefill excluded
    spec_tokens_per_s: float
    speedup: float  # spec_tokens_per_s / plain_tokens_per_s
    predicted_speedup: float | None  # cost model over this golden's simulated draft lengths
    spec_equals_plain: bool  # spec output ids == plain output ids
    first_divergence: int | None  # first index where the model's plain ids differ from the golden
    counts_match_simulation: bool  # verify passes, drafts proposed/accepted == simulated
    verify_passes: int  # of the real spec run
    drafts_proposed: int
    drafts_accepted: int
    simulated_proposed: int | None = None  # a server's run: kolibri's simulated counts, which
    simulated_accepted: int | None = None  # must equal the server's own counters above
    too_short: bool = False  # under MIN_TIMED_STEPS decode steps: its speedup is timing noise,
    # left out of the overall figures and the worst (kolibri's measurement and a server's)
    # (low, high): a distribution-free 95% interval for `speedup`, the median of the rounds'
    # paired ratios (`median_interval`); None with too few rounds or another statistic
    speedup_interval: tuple[float, float] | None = None


@dataclass
class Measured:
    """A configuration run with the model over every golden (filled by the measuring probe)."""

    plain_tokens_per_s: float  # over all goldens: new tokens / decode seconds
    spec_tokens_per_s: float
    speedup: float  # spec / plain
    predicted_speedup: float | None  # cost model over all goldens
    costs: dict[int, float]  # c(n) = time(n-token forward) / time(1-token forward), n = 1..k+1
    proposer_s_per_pass: float  # measured proposer time per verify pass
    spec_equals_plain: bool  # on every golden
    counts_match_simulation: bool  # on every golden
    goldens: list[MeasuredGolden] = field(default_factory=list)
    engine: str = "kolibri"  # or the server measured: "llama-server", a URL
    repeats: int = 1  # plain/spec runs per golden (alternating; medians)
    speedup_range: tuple[float, float] | None = None  # min, max of the per-repeat speedups
    # the prediction again with c(n) on the least-squares line 1 + cost_slope (n - 1) through
    # the measured c(n): shows how much of the prediction rests on one noisy c(n)
    predicted_on_line: float | None = None
    cost_slope: float | None = None
    # ms per n-token pass in each c(n) round (a server kolibri timed): the spread behind c(n)
    cost_ms_rounds: dict[int, list[float]] = field(default_factory=dict)
    left_out: int = 0  # goldens too short to time, not in the overall figures nor the worst
    # a guard measuring its own costs started from: "kept" (timings earlier runs of this kernel
    # kept), "bench" (kolibri bench's c(n)) or "none" (it calibrated); None: not such a guard
    guard_costs_from: str | None = None

    @property
    def worst(self) -> MeasuredGolden | None:
        """The golden where speculation fared worst against plain (the guard's figure), of those
        long enough to time."""
        return min((g for g in self.goldens if not g.too_short), key=lambda g: g.speedup,
                   default=None)

    @property
    def prediction_error(self) -> float | None:
        """predicted / measured - 1 (0.1 = the cost model promised 10% too much)."""
        if self.predicted_speedup is None or not self.speedup:
            return None
        return self.predicted_speedup / self.speedup - 1.0

    def to_json(self) -> dict:
        doc = {name: getattr(self, name) for name in self.__dataclass_fields__}
        doc["costs"] = {str(n): c for n, c in sorted(self.costs.items())}
        doc["cost_ms_rounds"] = {str(n): ms for n, ms in sorted(self.cost_ms_rounds.items())}
        doc["prediction_error"] = self.prediction_error
        doc["goldens"] = [vars(g).copy() for g in self.goldens]
        worst = self.worst
        doc["worst"] = None if worst is None else {"id": worst.id, "speedup": worst.speedup,
                                                   "interval": worst.speedup_interval}
        return doc




def counts_json(counts: Counts, per_pass: bool = False) -> dict:
    """The counts block shared by totals, categories and goldens."""
    doc = {
        "plain_steps": counts.plain_steps,
        "verify_passes": counts.verify_passes,
        "ratio": counts.ratio,
        "drafts_proposed": counts.drafts_proposed,
        "drafts_accepted": counts.drafts_accepted,
        "passes_with_drafts": counts.passes_with_drafts,
        "acceptance_rate": counts.acceptance_rate,
        "mean_acceptance_length": counts.mean_acceptance_length,
        "drafted_at": counts.drafted_at,
        "accepted_at": counts.accepted_at,
        "accepted_per_position": counts.accepted_per_position,
    }
    if per_pass:
        doc["draft_lengths"] = counts.draft_lengths
        doc["accepted_lengths"] = counts.accepted_lengths
    return doc


@dataclass
class ProbeResult:
    config: object  # the ProbeConfig the run was made with
    runs: list[SimRun]  # in configuration order (proposer-major, then k, then window)
    pricing: object  # the Pricing (c(n) and where it came from) every prediction used
    measured: dict = field(default_factory=dict)  # RunKey -> Measured (--measure)
    throughput: object = None  # how fast the simulation ran (shards.Throughput)
    ranked: list[Speed] = field(default_factory=list)  # every configuration, fastest first
    verdict: Verdict | None = None  # of the fastest setting, with the interval it reads
    compared: list[Speed] = field(default_factory=list)  # each proposer's fastest (with spread)
    categories: dict[str, Verdict] = field(default_factory=dict)  # per golden category
    load: object = None  # --concurrency: a load.LoadReport
    gates: list[Gate] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # one line per failed gate

    @property
    def best(self) -> SimRun:
        """The fastest configuration: the one every output stars and recommends."""
        return self.verdict.speed.run

    def speed_of(self, run: SimRun) -> Speed:
        return next(s for s in self.ranked if s.run is run)

    def figures(self) -> dict[str, float | None]:
        """The named figures of the fastest setting that gates read (gates.COLUMNS)."""
        speed, counts = self.verdict.speed, self.best.total
        low, high = self.verdict.interval or (None, None)
        worst = speed.worst
        m = self.measured.get(run_key(self.best))
        law = lambda name: None if m is None else float(getattr(m, name))  # noqa: E731
        return {"speedup": speed.value, "predicted": speed.predicted, "measured": speed.measured,
                "expected": m and m.predicted_speedup,
                "spec_equals_plain": law("spec_equals_plain"),
                "counts_match_simulation": law("counts_match_simulation"),
                "low": low, "high": high, "worst": worst and worst[1],
                "faster": speed.faster / len(speed.per_golden) if speed.per_golden else None,
                "ratio": counts.ratio, "acceptance": counts.acceptance_rate,
                "mean_len": counts.mean_acceptance_length, "goldens": len(speed.per_golden)
                or self.best.chains,
                "crossover": None if self.load is None else self.load.crossover}


def build_result(config, runs: list[SimRun], pricing, measured: dict | None = None,
                 throughput=None, load=None) -> ProbeResult:
    """Rank the runs by speed, draw the verdict (overall and per category), apply the gates."""
    from kolibri_cli.probe.load import measured_at_one

    measured = measured or {}
    ranked = ranking(runs, measured)
    fastest = with_interval(ranked[0])
    ranked[0] = fastest
    compared = [with_interval(s) for s in fastest_per_proposer(runs, ranked)]
    sliced = lambda v: replace(v, slice=config.where)  # noqa: E731
    said = sliced(verdict(runs, fastest, pricing))
    load = None if load is None else measured_at_one(load, said)  # B = 1 reads as the headline
    result = ProbeResult(config, runs, pricing, measured, throughput, ranked, said, compared,
                         {c: sliced(v) for c, v in category_verdicts(runs, pricing).items()},
                         load, gates_of(config))
    result.failures = check(result)
    return result


def verdict(runs: list[SimRun], fastest: Speed, pricing) -> Verdict:
    """The fastest setting's verdict: measured, on its timed goldens' interval; predicted, on
    the interval that re-makes the choice and draws c(n) (answer.predicted_verdict)."""
    if fastest.measured is None:
        return predicted_verdict(runs, fastest.run, pricing, speed=fastest)
    return verdict_of(fastest, goldens=len(fastest.per_golden) or None)


def gates_of(config) -> list[Gate]:
    """The gates a run asked for: the shorthands first, then each --gate expression."""
    from kolibri_cli.probe.gates import parse_gate

    short = [("min-speedup", "speedup", config.min_speedup),
             ("min-ratio", "ratio", config.min_ratio),
             ("min-acceptance", "acceptance", config.min_acceptance)]
    gates = [shorthand(option, figure, value) for option, figure, value in short
             if value is not None]
    return gates + [parse_gate(text) for text in config.gate or []]


def check(result: ProbeResult) -> list[str]:
    """One line per failed gate, naming the figures it read and the setting."""
    figures = result.figures()
    basis = result.verdict.speed.basis
    return [failure(g, figures, result.best.name, basis) for g in result.gates
            if not holds(g, figures)]
