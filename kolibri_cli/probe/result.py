"""One probe run's result: what was simulated (and measured), ranked by speed, the verdict, where
its c(n) came from, and the gates' outcome. Every output (terminal, JSON, Markdown, PNG) renders
this object; none decides anything of its own.
"""

from dataclasses import dataclass, field

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
from kolibri_cli.probe.simulate import SimRun


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
    said = verdict(runs, fastest, pricing)
    load = None if load is None else measured_at_one(load, said)  # B = 1 reads as the headline
    result = ProbeResult(config, runs, pricing, measured, throughput, ranked, said, compared,
                         category_verdicts(runs, pricing), load, gates_of(config))
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
