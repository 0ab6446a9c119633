"""Speculation under load: B sequences decoded together, and the concurrency where drafting
stops paying.

The step model (docs/load.md): a server under steady load keeps B slots busy; each slot replays
the goldens in its own seeded order, the next joining the moment one ends (its prefill left
out). Every step each slot takes its next verify pass, exactly as the proposer drafts it on
that chain, and the step is one forward over all the tokens in flight, costing c(T) with
T = sum over slots of (1 + drafted). Plain decoding runs B tokens a step at c(B). Each slot
walks every golden exactly once, so spec and plain produce the same tokens and

    throughput speedup = (plain steps of all goldens) x c(B) x B / B  /  sum over steps c(T)

i.e. sum(plain_steps) x c(B) / sum_s c(T_s) per slot, the B = 1 prediction when B = 1.

c(T) is a prompt's curve: one forward of T tokens of one sequence. A plain step of B sequences
reads B caches and runs B attentions, which one B-token prompt does not (llama-server: a batched
decode's c(8) 7.19 where a prompt of 8 tokens costs 4.73). Where the engine's batched decode was
timed (`DecodeCurve`, d(B): B sequences one token each, over one sequence's step), every step at
B is priced d(B) + c(T) - c(B): plain steps at d(B), the drafted rows beyond them at the
prompt curve's price. kolibri's own engine decodes one sequence at a time (serve/worker.py: one
worker, one sequence), so it has no batched decode to time: its load is priced with c(T) alone,
and the report says which curve priced plain decoding.

Proposers whose drafts do not depend on c(n) replay the per-pass rows the B = 1 simulation
kept; those that draft by c(n) (the guard, adaptive) run live, each pass priced at the step's
load: drafting n rows beside T' tokens of the other slots costs c(T' + n) - c(T'), relative to
a plain row's c(T' + 1) - c(T'), with T' the other slots' tokens of the step before.
The verdict per B reads the same rule as at B = 1 (answer.judge), on the same kind of interval:
each step's cost is shared among the slots by their tokens, so every golden has its own cost at
B; the choice is re-made in each bootstrap resample (at B = 1, as the headline) and judged at B
on the goldens it left out, c(T) drawn from their own spread.
Non-goals: prefill, queueing, KV-cache limits, a sequence's own context length in c.
"""

from dataclasses import dataclass, field, replace

import numpy as np

from kolibri_cli.costs.model import CostTable, cost_model
from kolibri_cli.decode.proposers import reads_cost_table
from kolibri_cli.errors import KolibriError
from kolibri_cli.probe.answer import (
    MIN_GOLDENS,
    PAYS,
    TOO_FEW,
    Interval,
    judge,
    length_weights,
    priced_curves,
    spread_of,
)
from kolibri_cli.probe.simulate import SimRun, chain_context, next_pass

ORDER_SEED = 0  # slot b replays the goldens in permutation b of this seed
MAX_CONCURRENCY = 4096


@dataclass(frozen=True)
class LoadPoint:
    """One configuration at concurrency B."""

    concurrency: int  # B
    speedup: float  # throughput (and per-sequence) speed of spec over plain at this B
    tokens_per_step: float  # spec: new tokens per step, all slots
    in_flight: float  # spec: tokens per forward (sum of 1 + drafted), mean over steps
    acceptance: float | None  # accepted / drafted over every pass of the window
    per_sequence: float  # spec speed of one sequence, relative to plain decoding alone (B = 1)
    interval: Interval | None = None  # of `speedup` on new traffic (the module's docstring)
    answer: str = ""  # answer.judge's: PAYS, WASHES, LOSES or TOO_FEW ("": not judged)
    basis: str = "predicted"  # "measured": B = 1 of a measured run, the headline's own figures

    @property
    def pays(self) -> bool:
        return self.answer == PAYS

    def to_json(self) -> dict:
        return dict(self.__dict__) | {"interval": None if self.interval is None
                                      else list(self.interval)}


@dataclass
class LoadCurve:
    """One configuration over the concurrencies asked for."""

    run: SimRun
    points: list[LoadPoint] = field(default_factory=list)

    def at(self, concurrency: int) -> LoadPoint:
        return next(p for p in self.points if p.concurrency == concurrency)


@dataclass(frozen=True)
class DecodeCurve:
    """d(B): one decode step of B sequences, one token each, each at its own context, over one
    sequence's step (d(1) = 1; linear between the B timed), and what timed it."""

    costs: dict[int, float]  # B -> d(B)
    source: str  # e.g. "llama-server -np 8, timed in this run"

    def __call__(self, b: int) -> float:
        return cost_model(self.costs)(b)


PROMPT_PRICED = ("as one B-token forward (a prompt's c(T); on llama-server that underpriced a "
                 "batched decode of 8 sequences by 34%: c(8) 4.73 against 7.19)")


def plain_priced(decode: DecodeCurve | None) -> str:
    """Which curve priced plain decoding of B sequences, in a few words."""
    if decode is None:
        return f"plain decoding of B sequences priced {PROMPT_PRICED}"
    return f"plain decoding of B sequences priced by its batched decode ({decode.source})"


def decode_offset(c, b: int, decode: DecodeCurve | None) -> float:
    """What every step at B costs beyond c(T): d(B) - c(B) (0 without a decode curve)."""
    return 0.0 if decode is None else decode(b) - c(b)


def slot_orders(goldens: int, concurrency: int) -> list[np.ndarray]:
    """[B] permutations of range(goldens): slot b's order of the goldens (slot 0: as given)."""
    rng = np.random.default_rng(ORDER_SEED)
    return [np.arange(goldens)] + [rng.permutation(goldens) for _ in range(concurrency - 1)]


def load_point(run: SimRun, concurrency: int, c, goldens: list | None = None,
               decode: DecodeCurve | None = None) -> LoadPoint:
    """The configuration `run` at concurrency B under c(T) (a function of tokens in flight) and
    the engine's batched decode d(B) if timed; `goldens` (the Golden chains) are needed to run a
    cost-driven proposer live."""
    drafted, accepted, _ = _passes(run, concurrency, c, goldens)
    return _point(run, concurrency, c, drafted, accepted, decode_offset(c, concurrency, decode))


def _passes(run: SimRun, concurrency: int, c, goldens: list | None):
    """drafted, accepted, golden index: [B, S] each, every slot's passes step by step."""
    if run.goldens is None:
        raise KolibriError("--concurrency needs every golden's passes: too many chains to keep "
                           "in memory for this; pick some with --limit or --category")
    if reads_cost_table(run.proposer):
        if goldens is None:
            raise KolibriError(f"{run.proposer} drafts by c(n): its load simulation runs it live "
                               "and needs the goldens")
        return _live(run, concurrency, c, goldens)
    return _replayed(run, concurrency)


def step_weights(run: SimRun, b: int, c, goldens: list | None) -> tuple[np.ndarray, np.ndarray]:
    """At concurrency B, per golden: plain [G, N] (its plain steps, each a B-token step's 1/B
    share, B slots: plain_steps forwards of B tokens) and spec [G, N] (each step's forward shared
    among the slots by their tokens, summed over the B slots' walks of the golden), N = the
    most tokens a step holds + 1: time = weights @ c(0..N-1), and the speedup at B over all
    goldens = sum(plain @ c) / sum(spec @ c) (`_point`'s)."""
    drafted, _, golden = _passes(run, b, c, goldens)  # [B, S] each
    rows = 1 + drafted  # [B, S]
    in_flight = rows.sum(axis=0)  # [S]
    g, n = len(run.goldens), int(in_flight.max(initial=b)) + 1
    spec = np.bincount((golden * n + in_flight[None, :]).ravel(), (rows / in_flight).ravel(),
                       minlength=g * n).reshape(g, n)  # [G, N]
    plain = np.zeros((g, n))  # [G, N]
    plain[:, b] = [x.counts.plain_steps for x in run.goldens]
    return plain, spec


def _point(run: SimRun, b: int, c, drafted: np.ndarray, accepted: np.ndarray,
           offset: float = 0.0) -> LoadPoint:
    plain_steps = sum(g.counts.plain_steps for g in run.goldens)  # per slot
    in_flight = (1 + drafted).sum(axis=0)  # [S] tokens per step
    priced = np.array([c(t) for t in range(int(in_flight.max(initial=0)) + 1)])  # c(0..max T)
    step_costs = priced[in_flight] + offset  # [S]
    spec_cost, plain_cost = float(step_costs.sum()), plain_steps * (c(b) + offset)
    tokens = float((1 + accepted).sum())  # == b * plain_steps
    proposed = int(drafted.sum())
    return LoadPoint(
        concurrency=b, speedup=plain_cost / spec_cost if spec_cost else 1.0,
        tokens_per_step=tokens / in_flight.size, in_flight=float(in_flight.mean()),
        acceptance=float(accepted.sum()) / proposed if proposed else None,
        per_sequence=plain_steps * c(1) / spec_cost if spec_cost else 1.0)


def _replayed(run: SimRun, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each slot's passes, goldens in its order, from the rows the simulation kept."""
    rows = [(np.asarray(g.counts.draft_lengths, dtype=np.int64),
             np.asarray(g.counts.accepted_lengths, dtype=np.int64)) for g in run.goldens]
    orders = slot_orders(len(rows), b)
    drafted = np.stack([np.concatenate([rows[i][0] for i in o]) for o in orders])  # [B, S]
    accepted = np.stack([np.concatenate([rows[i][1] for i in o]) for o in orders])  # [B, S]
    golden = np.stack([np.concatenate([np.full(len(rows[i][0]), i) for i in o])
                       for o in orders])  # [B, S]
    return drafted, accepted, golden


def marginal_costs(c, others: int, top: int) -> dict[int, float]:
    """c(n) of one slot's n rows beside `others` tokens of the other slots, relative to one
    plain row there: (c(others + n) - c(others)) / (c(others + 1) - c(others)), n = 1..top."""
    base = c(others) if others else 0.0
    one = c(others + 1) - base
    if one <= 0:
        return {n: 1.0 for n in range(1, top + 1)}
    return {n: max((c(others + n) - base) / one, 1e-9) for n in range(1, top + 1)}


def _live(run: SimRun, b: int, c, goldens: list) -> tuple[np.ndarray, np.ndarray]:
    """Run a cost-driven proposer live in every slot, step by step, each pass priced by the
    marginal cost of its rows at the previous step's load."""
    by_id = {g.id: g for g in goldens}
    chains = [by_id[g.id] for g in run.goldens]
    slots = [_Slot(run, [(i, chains[i]) for i in order])
             for order in slot_orders(len(chains), b)]
    drafted, accepted, golden, last = [], [], [], [1] * b
    while slots[0].busy:
        total = sum(last)
        golden.append([s.index for s in slots])
        rows = [s.step(marginal_costs(c, total - last[i], run.k + 1))
                for i, s in enumerate(slots)]
        last = [1 + d for d, _ in rows]
        drafted.append([d for d, _ in rows])
        accepted.append([a for _, a in rows])
    return (np.array(drafted, dtype=np.int64).T, np.array(accepted, dtype=np.int64).T,
            np.array(golden, dtype=np.int64).T)  # [B, S] each


class _Slot:
    """One slot: its goldens in order ((index, chain) each), a fresh proposer per chain, one pass
    per step."""

    def __init__(self, run: SimRun, chains: list):
        self.run, self.chains, self.pos, self.chain, self.index = run, list(chains), 1, None, -1
        self.proposer = None
        self._next_chain()

    @property
    def busy(self) -> bool:
        return self.chain is not None

    def _next_chain(self) -> None:
        while self.chains:
            (self.index, self.chain), self.pos = self.chains.pop(0), 1
            if len(self.chain.output_ids) > 1:  # a chain of 1 token has no decode step
                self.context = chain_context(self.chain.prompt_ids, self.chain.output_ids)
                self.proposer = self.run.new_proposer()
                self.proposer.begin(self.chain.prompt_ids)
                return
        self.chain = None

    def step(self, costs: dict[int, float]) -> tuple[int, int]:
        self.proposer.costs = CostTable.from_costs(costs)
        drafted, accepted, self.pos = next_pass(self.proposer, self.context,
                                                len(self.chain.prompt_ids), self.pos, self.run.k)
        if self.pos >= len(self.chain.output_ids):
            self._next_chain()
        return drafted, accepted


def load_curve(run: SimRun, concurrencies: list[int], costs: dict[int, float] | None,
               goldens: list | None = None, decode: DecodeCurve | None = None) -> LoadCurve:
    """The configuration at every concurrency asked for, under c(T) = `costs` (and d(B))."""
    c = cost_model(costs)
    return LoadCurve(run, [load_point(run, b, c, goldens, decode) for b in concurrencies])


def crossover(curve: LoadCurve) -> int | None:
    """The largest concurrency asked for up to which drafting pays (answer.judge's PAYS at it
    and at every smaller one asked for; a point not judged: speedup >= 1.02x); None when it does
    not pay even at the smallest."""
    paying = None
    for point in sorted(curve.points, key=lambda p: p.concurrency):
        if not (point.pays if point.answer else judge(point.speedup, None) == PAYS):
            break
        paying = point.concurrency
    return paying


@dataclass
class LoadReport:
    """Every configuration over the concurrencies asked for, and the answer: up to which B the
    fastest setting (at B = 1) pays, and which setting is fastest at each B."""

    concurrencies: list[int]  # ascending
    curves: list[LoadCurve]  # one per configuration, in run order
    fastest: LoadCurve  # the curve of the B = 1 verdict's setting
    crossover: int | None  # of `fastest`
    best_at: list[LoadCurve]  # per concurrency (same order): the configuration fastest there
    best_crossover: int | None  # how far drafting pays choosing the setting per B
    best_judged: list[LoadPoint] = field(default_factory=list)  # best_at's points, judged with
    # the choice re-made at B
    decode: DecodeCurve | None = None  # the engine's batched decode, where it was timed
    pricing: object = None  # the Pricing of c(T), where it is not the run's (a server's own)

    @property
    def plain_priced(self) -> str:
        return plain_priced(self.decode)

    @property
    def best_points(self) -> list[LoadPoint]:
        return [curve.at(b) for curve, b in zip(self.best_at, self.concurrencies, strict=True)]


def load_report(runs: list[SimRun], fastest: SimRun, concurrencies: list[int],
                costs: dict[int, float] | None, goldens: list | None,
                pricing=None, decode: DecodeCurve | None = None) -> LoadReport:
    """Every configuration at every concurrency under c(T) = `costs` (and the engine's batched
    decode d(B), if timed), the fastest setting (at B = 1) and the fastest at each B judged per
    B (answer.judge, `pricing` drawing c(T))."""
    concurrencies = sorted(set(concurrencies))
    curves = [load_curve(run, concurrencies, costs, goldens, decode) for run in runs]
    best_at = [max(curves, key=lambda c, b=b: c.at(b).speedup) for b in concurrencies]
    judged = _Judge(runs, costs, goldens, pricing, concurrencies, decode)
    shown = {id(fastest)} | {id(c.run) for c in best_at}  # the curves the report judges
    curves = [LoadCurve(c.run, [judged(c.run, p, "chosen at 1" if c.run is fastest else "fixed")
                                for p in c.points]) if id(c.run) in shown else c
              for c in curves]
    best_at = [next(c for c in curves if c.run is best.run) for best in best_at]
    headline = next(c for c in curves if c.run is fastest)
    envelope = LoadCurve(fastest, [judged(c.run, c.at(b), "chosen at B")
                                   for c, b in zip(best_at, concurrencies, strict=True)])
    return LoadReport(concurrencies, curves, headline, crossover(headline), best_at,
                      crossover(envelope), envelope.points, decode)


def measured_at_one(report: LoadReport, verdict) -> LoadReport:
    """A measured run's load, agreeing with its headline: the fastest setting's B = 1 point is
    the measured verdict's own speedup, interval and answer (labelled measured), the crossover
    read again. Unchanged when the verdict is predicted, is another setting's, or B = 1 was not
    asked for."""
    speed = verdict.speed
    if speed.measured is None or speed.run is not report.fastest.run \
            or 1 not in report.concurrencies:
        return report
    headline = LoadCurve(report.fastest.run, [
        replace(p, speedup=speed.measured, per_sequence=speed.measured,
                interval=verdict.interval, answer=verdict.answer, basis="measured")
        if p.concurrency == 1 else p for p in report.fastest.points])
    swap = lambda c: headline if c is report.fastest else c  # noqa: E731
    return replace(report, curves=[swap(c) for c in report.curves], fastest=headline,
                   crossover=crossover(headline), best_at=[swap(c) for c in report.best_at])


class _Judge:
    """A point's interval and answer (the module's docstring), judged at B on the goldens each
    resample left out: "chosen at 1", the fastest setting's choice re-made at B = 1 in each
    resample (the headline's, so B = 1 reads exactly as the verdict); "chosen at B", re-made at
    B itself (the fastest setting at B); "fixed", the setting alone."""

    def __init__(self, runs: list[SimRun], costs, goldens, pricing, concurrencies: list[int],
                 decode: DecodeCurve | None = None):
        self.runs, self.goldens, self.c, self.decode = runs, goldens, cost_model(costs), decode
        self.count = None if runs[0].goldens is None else len(runs[0].goldens)
        self.cache: dict = {}
        if self.count is None or self.count < MIN_GOLDENS:
            return
        plain, spec = length_weights(runs, list(range(self.count)))  # [G, N], [R, G, N]
        top = max(concurrencies) * (2 + max(r.k for r in runs))
        self.base, self.curves = priced_curves(runs[0], pricing, top)  # [T], [draws, T]
        self.plain, self.choose = plain[:, 1], spec @ self.base[:spec.shape[2]]  # [G], [R, G]

    def weights(self, r: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        if (r, b) not in self.cache:
            self.cache[r, b] = step_weights(self.runs[r], b, self.c, self.goldens)
        return self.cache[r, b]

    def __call__(self, run: SimRun, point: LoadPoint, mode: str) -> LoadPoint:
        if self.count is None or self.count < MIN_GOLDENS:
            answer = TOO_FEW if self.count is not None else judge(point.speedup, None)
            return replace(point, answer=answer)
        b, first = point.concurrency, self.runs.index(run)
        plain, choose, among = self.plain, self.choose, list(range(len(self.runs)))
        offset = decode_offset(self.c, b, self.decode)  # every step at B: c(T) + offset
        base, curves = self.base.copy(), self.curves.copy()
        base[1:] += offset
        curves[:, 1:] += offset
        if mode == "chosen at B":  # the choice among the settings as priced at B
            ws = [self.weights(r, b) for r in among]
            plain = ws[0][0] @ base[:ws[0][0].shape[1]]
            choose = np.array([s @ base[:s.shape[1]] for _, s in ws])  # [R, G]
        elif mode == "fixed":
            choose, among = choose[[first]], [first]
        spread = spread_of(choose, plain, lambda r: self.weights(among[r], b),
                           among.index(first), base, curves)
        interval = None if spread is None else spread.combined
        return replace(point, interval=interval,
                       answer=judge(point.speedup, interval, self.count))


# What each engine calls the setting that turns n-gram drafting off above a concurrency, as its
# docs name it: kolibri says which value the simulation gives it.
ENGINE_SETTINGS = {
    "vLLM": "speculative_config {\"disable_by_batch_size\": B} (older releases: "
            "--speculative-disable-by-batch-size B): no drafting while more than B requests run",
}
