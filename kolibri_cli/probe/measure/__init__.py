"""The measured probe: run each golden prompt with the model, plain and speculative, and set the
measurement beside the simulation and the cost model's prediction.

Per golden: spec ids must equal plain ids (the lossless law); the model's plain chain is compared
with the golden (first divergent index); the real spec run's counts must equal the simulation's
over that chain; c(n) is measured at the golden's context length and turned into a predicted
speedup from the simulated draft lengths. Like the simulation, a proposer that shares state
across requests is one instance serving every golden in order (two: one for the real spec runs,
one for the simulation over the model's own plain chains), so it sees the same history in both;
any other is fresh for each golden. The guard measures its own costs while it runs, from each
golden's start as `kolibri generate` does per request; its simulation is given the costs the
live run read, in order, so it must decide exactly as the run did.

Several configurations are measured in one run, round by round: each round runs every golden in
turn, one plain run and one spec run per configuration, the order rotating from round to round
and golden to golden so machine noise hits all alike. A golden's rounds are spread over the whole
run, so a load that lasts seconds disturbs one of its rounds, not all. A golden shorter than the
longest runs in more rounds (`rounds_per_golden`), so each is timed over about as many tokens.
Each run's time counts a disturbed decode step at the median of its round's peers
(`undisturbed_times`); a golden's speedup is the median over its rounds of plain / spec within a
round, its times the medians, with a distribution-free 95% interval for that median
(`median_interval`). docs/simulation.md, "Measured speedup", has the definitions.
Non-goals: rendering (report.py, cli/render/probe.py).
"""

import math
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from fractions import Fraction

from kolibri_cli.callbacks import Ticks
from kolibri_cli.costs.model import CostTable, ReplayedCosts, warm_table
from kolibri_cli.costs.timing import verify_costs
from kolibri_cli.decode.generate import GenerationResult, generate_plain, generate_spec
from kolibri_cli.decode.proposers import make_proposer, reads_cost_table
from kolibri_cli.decode.sampling import Sampling
from kolibri_cli.goldens.chains import Golden, first_divergence
from kolibri_cli.probe.answer import RunKey, run_key
from kolibri_cli.probe.result import Measured, MeasuredGolden, timed_only, too_short_to_time
from kolibri_cli.probe.simulate import (
    SimRun,
    div_or_none,
    predicted_speedup,
    simulate_chain,
    spec_time,
)

COST_REPEATS = 3
Statistic = Callable[[list[float]], float]  # a golden's time from its rounds' times
DISTURBED = 1.3  # a step this many times its peers' median was slowed by other work
MORE_ROUNDS = 4  # a short golden runs in at most this many times `repeats` rounds


@dataclass
class _Arm:
    """One configuration under measurement: a (live, simulated) proposer pair per golden and
    round (one per round, for every golden in turn, if the proposer shares state across
    requests), and what each golden gave."""

    run: SimRun
    warm: list | None = None  # the guard's start: the cells earlier runs kept, for every golden
    start: str | None = None  # a measuring guard's: where `warm` came from
    made: dict = field(default_factory=dict)  # (golden or None, round) -> proposer pair
    goldens: list[MeasuredGolden] = field(default_factory=list)
    totals: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.shares = proposer_pair(self.run, self.warm)[0].shares_state

    def pair(self, golden: int, round_: int) -> tuple:
        key = (None if self.shares else golden, round_)
        if key not in self.made:
            self.made[key] = proposer_pair(self.run, self.warm)
        return self.made[key]


@dataclass
class _Timed:
    """One golden's runs, round by round: plain, and per configuration (result, costs read)."""

    plains: list[GenerationResult] = field(default_factory=list)
    specs: list[list[tuple]] = field(default_factory=list)


def _warm_cells(model) -> tuple[list, str]:
    """(the timings a measuring guard starts from, as `kolibri generate` would on this kernel,
    where they came from: "kept", "bench" or "none"); one snapshot for every golden: they may
    run in any order."""
    from kolibri_cli.engine.jit import get_threads

    if getattr(model, "sha256", None) is None:  # a stand-in without an identity kept nothing
        return [], "none"
    table, source = warm_table(model.sha256, model.numerics, get_threads())
    return table.cells(), source


def proposer_pair(run: SimRun, warm: list | None = None) -> tuple:
    """(for the live spec runs, for the simulation over their chains): fresh proposers. One
    reading a cost table (the guard) without given costs measures its own (logged), from the
    `warm` cells as `kolibri generate` starts from what earlier runs kept; its simulation
    replays what it read."""
    if not reads_cost_table(run.proposer):
        return run.new_proposer(), run.new_proposer()
    table = CostTable.from_costs(run.costs) if run.costs else CostTable.seeded(warm or [])
    table.log = []
    live = make_proposer(run.proposer, run.k, run.window, table)
    return live, make_proposer(run.proposer, run.k, run.window, ReplayedCosts())


def measure_runs(model, goldens: list[Golden], runs: list[SimRun], repeats: int = 1,
                 step: Ticks | None = None, sampling: Sampling | None = None,
                 cost_repeats: int = COST_REPEATS,
                 statistic: Statistic = statistics.median) -> dict[RunKey, Measured]:
    """Measure every configuration over every golden, interleaved; a golden's times are the
    `statistic` of its rounds' undisturbed times (the median; `min` is the least disturbed
    round), its speedup paired within rounds (`paired_speedup`), the overall speedup the sum of
    the goldens' plain times over the sum of plain time / speedup. c(n) for the predictions is
    timed `cost_repeats` times per golden."""
    warm, source = _warm_cells(model)
    arms = [_Arm(run, warm, source if reads_cost_table(run.proposer) and not run.costs else None)
            for run in runs]
    more = not any(arm.shares for arm in arms)  # extra rounds would change a shared history
    rounds = rounds_per_golden(goldens, repeats, more)
    timed = [_Timed(specs=[[] for _ in arms]) for _ in goldens]
    done, total = 0, sum(rounds)
    for r in range(max(rounds, default=0)):
        for i, golden in enumerate(goldens):
            if r < rounds[i]:
                _run_round(model, golden, i, r, arms, timed[i], sampling)
                done += 1
                if step:
                    step(done, total)
    for i, golden in enumerate(goldens):
        _figure_golden(model, golden, i, arms, timed[i], cost_repeats, statistic)
    return {run_key(arm.run): _summary(arm, repeats) for arm in arms}


def rounds_per_golden(goldens: list[Golden], repeats: int, more: bool = True) -> list[int]:
    """Rounds per golden: `repeats` for the longest; a shorter one, whose time a disturbance
    sways more, runs in more (up to MORE_ROUNDS times as many), so each golden is timed over
    about as many tokens (unless `more` is False: `repeats` each)."""
    longest = max((len(g.output_ids) for g in goldens), default=1)
    if not more:
        return [repeats] * len(goldens)
    return [min(math.ceil(repeats * longest / max(len(g.output_ids), 1)), MORE_ROUNDS * repeats)
            for g in goldens]


def measure_run(model, goldens: list[Golden], run: SimRun, step: Ticks | None = None,
                sampling: Sampling | None = None, repeats: int = 1) -> Measured:
    """One configuration over every golden."""
    return measure_runs(model, goldens, [run], repeats, step, sampling)[run_key(run)]


def _run_round(model, golden: Golden, index: int, round_: int, arms: list[_Arm],
               timed: _Timed, sampling: Sampling | None) -> None:
    """One round of a golden: plain and every configuration once, in the `round_order`, so no
    configuration always runs first, or after the same one."""
    n = len(golden.output_ids)
    how = golden.sampler if sampling is None else sampling
    for a in round_order(len(arms), index, round_):
        if a < 0:
            timed.plains.append(generate_plain(model, golden.prompt_ids, n, sampling=how))
        else:
            live = arms[a].pair(index, round_)[0]
            timed.specs[a].append(_spec_run(model, golden, n, live, how))


def round_order(arms: int, golden: int, round_: int) -> list[int]:
    """Who runs when in one round: -1 for plain, else a configuration's index. Rounds come in
    pairs, an order then its reverse (a drift in speed between them cancels out); each pair
    rotates by one, starting from a place that moves from golden to golden."""
    order, shift = [-1, *range(arms)], (golden + round_ // 2) % (arms + 1)
    order = order[shift:] + order[:shift]
    return order[::-1] if round_ % 2 else order


def _figure_golden(model, golden: Golden, index: int, arms: list[_Arm], timed: _Timed,
                   cost_repeats: int, statistic: Statistic) -> None:
    n = len(golden.output_ids)
    top = max(arm.run.k for arm in arms) + 1
    rel = verify_costs(model.transformer, top, len(golden.prompt_ids) + n // 2, cost_repeats)
    plain_u, spec_u = _undisturbed_by_round(timed)
    for a, (arm, rounds) in enumerate(zip(arms, timed.specs, strict=True)):
        pairs = [arm.pair(index, r) for r in range(len(rounds))]
        m, t = _golden_figures(golden, index, arm, timed.plains, rounds, pairs, rel,
                               (plain_u, [u[a] for u in spec_u]), statistic)
        arm.goldens.append(m)
        arm.totals.append(t)


def _undisturbed_by_round(timed: _Timed) -> tuple[list[float], list[list[float]]]:
    """(plain's undisturbed time per round, every configuration's per round): a step's peers
    are the steps of its round (plain's and every configuration's), which ran moments apart,
    at one speed of a shared machine."""
    plain_u, spec_u = [], []
    for r, plain in enumerate(timed.plains):
        u = undisturbed_times([plain, *(runs[r][0] for runs in timed.specs)])
        plain_u.append(u[0])
        spec_u.append(u[1:])
    return plain_u, spec_u


def paired_speedup(plain_u: list[float], spec_u: list[float], statistic: Statistic) -> float:
    """A golden's speedup: the median over rounds of plain / spec within a round (the two ran
    moments apart, so a load that lasts seconds slows both); with another statistic (`min`),
    the ratio of the rounds' statistics."""
    if statistic is statistics.median:
        return statistics.median(paired_ratios(plain_u, spec_u))
    spec_s = statistic(spec_u)
    return statistic(plain_u) / spec_s if spec_s else 0.0


def paired_ratios(plain_u: list[float], spec_u: list[float]) -> list[float]:
    """Each round's plain / spec (0 for a spec time of 0)."""
    return [p / s if s else 0.0 for p, s in zip(plain_u, spec_u, strict=True)]


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free interval for the median of `values` (independent draws): the
    order statistics x(l) and x(n + 1 - l), with l the largest such that P(Binomial(n, 1/2) <
    l) <= (1 - level) / 2, so the interval holds the true median with probability >= `level`
    whatever the noise's shape. None with too few values (under 6 for 95%)."""
    n, tail = len(values), Fraction((1.0 - level) / 2.0)
    below, low = 0, 0  # 2**n P(Binomial(n, 1/2) <= low - 1): whole numbers, exact for any n
    while low < n and Fraction(below + math.comb(n, low), 2**n) <= tail:
        below += math.comb(n, low)
        low += 1
    if low == 0:
        return None
    ordered = sorted(values)
    return ordered[low - 1], ordered[n - low]


def undisturbed_times(runs: list[GenerationResult]) -> list[float]:
    """Each run's decode time with every disturbed step counted at its peers' median instead.

    Other work on the machine only ever adds time, and adds it in bursts: a step DISTURBED times
    the median of its peers (the steps with as many rows in all `runs`: one round of a golden,
    plain and every configuration) was slowed by it. Every configuration and plain get the same
    rule. A run without step times counts its decode_s."""
    pool = defaultdict(list)
    for run in (run for run in runs if run.step_s):
        for rows, s in zip(run.step_rows, run.step_s, strict=True):
            pool[rows].append(s)
    typical = {rows: statistics.median(times) for rows, times in pool.items()}
    return [sum(s if s <= DISTURBED * typical[rows] else typical[rows]
                for rows, s in zip(run.step_rows, run.step_s, strict=True))
            if run.step_s else run.decode_s for run in runs]


def _spec_run(model, golden: Golden, n: int, proposer, how: Sampling) -> tuple:
    """The spec run and the costs the proposer read during it (a logging table's answers)."""
    log = proposer.costs.log if proposer.costs_kind == "table" else None
    start = len(log) if log is not None else 0
    result = generate_spec(model, golden.prompt_ids, n, proposer, sampling=how)
    return result, ([] if log is None else log[start:])


def _golden_figures(golden: Golden, index: int, arm: _Arm, plains: list[GenerationResult],
                    rounds: list[tuple], pairs: list[tuple], rel: dict[int, float],
                    undisturbed: tuple, statistic: Statistic = statistics.median) -> tuple:
    run, sim_counts = arm.run, arm.run.goldens[index].counts
    specs = [result for result, _ in rounds]
    plain_s, spec_s = statistic(undisturbed[0]), statistic(undisturbed[1])
    steps = max(plains[0].new_tokens - 1, 1)
    costs = {m: c * plain_s / steps for m, c in rel.items()}  # seconds per m-token forward
    matches = [_counts_match(golden, p, s, read, sim, run.k)
               for p, (s, read), (_, sim) in zip(plains, rounds, pairs, strict=True)]
    stats = specs[0].spec_stats()
    per_pass = sum(s.proposer_s for s in specs) / max(sum(len(s.passes) for s in specs), 1)
    lengths = sim_counts.draft_lengths
    measured = MeasuredGolden(
        id=golden.id,
        plain_tokens_per_s=steps / plain_s if plain_s else 0.0,
        spec_tokens_per_s=steps / spec_s if spec_s else 0.0,
        speedup=paired_speedup(*undisturbed, statistic),
        speedup_interval=median_interval(paired_ratios(*undisturbed))
        if statistic is statistics.median else None,
        predicted_speedup=predicted_speedup(sim_counts.plain_steps, lengths, costs, per_pass),
        spec_equals_plain=all(s.output_ids == p.output_ids
                              for p, s in zip(plains, specs, strict=True)),
        first_divergence=first_divergence(plains[0].output_ids, golden.output_ids),
        counts_match_simulation=all(matches),
        verify_passes=stats["verify_passes"],
        drafts_proposed=stats["drafts_proposed"],
        drafts_accepted=stats["drafts_accepted"],
        too_short=too_short_to_time(plains[0].new_tokens - 1),
    )
    paired_s = plain_s / measured.speedup if measured.speedup else spec_s
    totals = {"plain_s": plain_s, "spec_s": spec_s, "paired_spec_s": paired_s, "tokens": steps,
              "predicted_plain_s": sim_counts.plain_steps * costs[1],
              "predicted_spec_s": spec_time(lengths, costs, per_pass),
              "rel_costs": rel, "proposer_s": per_pass * len(specs[0].passes),
              "passes": len(specs[0].passes)}
    return measured, totals


def _counts_match(golden: Golden, plain: GenerationResult, spec: GenerationResult,
                  read: list, sim, k: int) -> bool:
    """The live run's counts == the simulation's over the model's own chain (a replayed guard is
    first given the costs its live twin read during this run)."""
    if isinstance(sim.costs, ReplayedCosts):
        sim.costs.extend(read)
    stats = spec.spec_stats()
    own = simulate_chain(golden.prompt_ids, plain.output_ids, sim, k)
    return (stats["verify_passes"], stats["drafts_proposed"], stats["drafts_accepted"]) == (
        own.verify_passes, own.drafts_proposed, own.drafts_accepted)


def _summary(arm: _Arm, repeats: int) -> Measured:
    """Overall figures over the goldens long enough to time (over all when none is). The
    speedup is paired as each golden's is: the goldens' plain times over the spec times their
    own speedups give (plain_s / speedup), so a load that slowed one arm's median of a golden
    moves the overall no more than that golden's paired ratio; spec tok/s stays the medians'."""
    timed = timed_only(arm.totals, arm.goldens)
    total = lambda key: sum(t[key] for t in timed)  # noqa: E731
    plain_s, spec_s = total("plain_s"), total("spec_s")
    return Measured(
        plain_tokens_per_s=total("tokens") / plain_s if plain_s else 0.0,
        spec_tokens_per_s=total("tokens") / spec_s if spec_s else 0.0,
        speedup=plain_s / paired_s if (paired_s := total("paired_spec_s")) else 0.0,
        predicted_speedup=div_or_none(total("predicted_plain_s"), total("predicted_spec_s")),
        costs=_median_costs([t["rel_costs"] for t in arm.totals], arm.run.k + 1),
        proposer_s_per_pass=total("proposer_s") / max(total("passes"), 1),
        spec_equals_plain=all(m.spec_equals_plain for m in arm.goldens),
        counts_match_simulation=all(m.counts_match_simulation for m in arm.goldens),
        goldens=arm.goldens,
        repeats=repeats,
        left_out=len(arm.totals) - len(timed),
        guard_costs_from=arm.start,
    )


def _median_costs(costs: list[dict[int, float]], top: int) -> dict[int, float]:
    if not costs:
        return {}
    return {n: statistics.median(c[n] for c in costs) for n in costs[0] if n <= top}


def live_runs(runs: list, pricing) -> list:
    """The runs as --measure runs them live: one reading a cost table (the guard) not given
    --costs times its own costs as it runs, as `kolibri generate --spec` does (its simulation
    then replays what it read)."""
    if pricing.source == "given":
        return runs
    return [replace(r, costs=None) if reads_cost_table(r.proposer) else r for r in runs]
