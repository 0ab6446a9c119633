"""The exact acceptance simulation of speculation over golden chains, and the cost model.

Greedy acceptance is exact: a draft token is accepted iff it equals the model's argmax, and the
model's greedy chain IS the golden. So replaying the proposer over the golden gives the real spec
run's counts (verify passes, drafts proposed/accepted) without running the model.
Definitions (normative; docs/probe.md): for prompt ids P and output ids G = g1..gN,
g1 from prefill, plain_steps = N - 1 and

    pos = 1
    while pos < N:
        j = min(k, N - pos - 1); d = propose(P + G[:pos], j)  (empty when j = 0)
        a = longest prefix of d equal to G[pos : pos + len(d)]
        one verify pass; drafted_at[i] += 1 for i < len(d); accepted_at[i] += 1 for i < a
        pos += a + 1

A stateful proposer is also told each pass's outcome, `observe(P + G[:pos], len(d), a)` with
pos already advanced, exactly as the speculative generator tells it; one proposer instance serves
every golden of a run, in file order (so `suffix --cross-request` sees earlier goldens' outputs).
Non-goals: running the model, timing (the measured probe does that), rendering.
"""

from dataclasses import dataclass, field

import numpy as np

from kolibri_cli.decode.costs import cost_model
from kolibri_cli.decode.proposers import (
    DEFAULT_PROPOSER,
    Proposer,
    draft,
    format_window,
    make_proposer,
)
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden


@dataclass
class Counts:
    """Counts of one chain, or summed over chains. Lists are indexed by draft position (0 = the
    first drafted token) or by verify pass."""

    plain_steps: int = 0  # N - 1: decode steps plain greedy needs after prefill
    verify_passes: int = 0  # forward passes the spec run needs after prefill
    drafts_proposed: int = 0
    drafts_accepted: int = 0
    passes_with_drafts: int = 0  # passes whose draft was non-empty
    drafted_at: list[int] = field(default_factory=list)  # [k] passes that drafted position i
    accepted_at: list[int] = field(default_factory=list)  # [k] passes that accepted position i
    draft_lengths: list[int] = field(default_factory=list)  # [verify_passes] len(d) per pass
    accepted_lengths: list[int] = field(default_factory=list)  # [verify_passes] a per pass

    @property
    def ratio(self) -> float | None:
        """plain_steps / verify_passes: the speedup if a verify pass cost one decode step."""
        return div_or_none(self.plain_steps, self.verify_passes)

    @property
    def acceptance_rate(self) -> float | None:
        return div_or_none(self.drafts_accepted, self.drafts_proposed)

    @property
    def mean_acceptance_length(self) -> float | None:
        """vLLM's definition: 1 + accepted / passes with drafts (tokens gained per drafted pass)."""
        mean = div_or_none(self.drafts_accepted, self.passes_with_drafts)
        return None if mean is None else 1.0 + mean

    @property
    def accepted_per_position(self) -> list[float | None]:
        """accepted_at[i] / drafted_at[i]; None where nothing was drafted at position i."""
        return [div_or_none(a, d) for a, d in zip(self.accepted_at, self.drafted_at, strict=True)]

    def record_pass(self, drafted: int, accepted: int) -> None:
        self.verify_passes += 1
        self.drafts_proposed += drafted
        self.drafts_accepted += accepted
        self.passes_with_drafts += drafted > 0
        _grow(self.drafted_at, drafted)
        _grow(self.accepted_at, drafted)
        for i in range(drafted):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1
        self.draft_lengths.append(drafted)
        self.accepted_lengths.append(accepted)


@dataclass
class GoldenSim:
    """The simulation of one golden chain."""

    id: str | int
    category: str
    counts: Counts
    seed: int | None = None  # the chain's sampling seed; None when greedy


@dataclass
class SimRun:
    """One configuration (proposer, k, window) simulated over every golden."""

    proposer: str  # canonical proposer name, e.g. "vllm"
    k: int
    window: tuple[int, int]  # (min, max) n-gram length
    goldens: list[GoldenSim]
    total: Counts  # summed over goldens: ratio = sum plain_steps / sum verify_passes
    costs: dict[int, float] | None = None  # forward costs the run was simulated with (adaptive)
    cross_request: bool = False  # suffix: global tree over earlier goldens' outputs
    eos_ids: tuple[int, ...] = ()  # the goldens' eos ids (hf cuts its drafts before them)

    @property
    def label(self) -> str:
        return f"k={self.k} window={format_window(self.window)}"

    @property
    def name(self) -> str:
        """The proposer and its configuration, e.g. "vllm k=5 window=1-4"."""
        return f"{self.proposer} {self.label}"

    def new_proposer(self) -> Proposer:
        """A fresh proposer configured like the one this run simulated."""
        return make_proposer(self.proposer, self.k, self.window, self.costs, self.cross_request,
                             self.eos_ids)

    def modelled_speedup(self, counts: Counts | None = None) -> float | None:
        """The cost model's speedup for `counts` (default: the total) with the run's costs, or
        the default c(n) model (proposers.cost_model) when none were measured; proposer time 0."""
        counts = counts or self.total
        c = cost_model(self.costs)
        relative = {n: c(n) for n in range(1, max(counts.draft_lengths, default=0) + 2)}
        return predicted_speedup(counts.plain_steps, counts.draft_lengths, relative, 0.0)

    def by_category(self) -> dict[str, Counts]:
        """Counts summed per golden category, in order of first appearance."""
        groups: dict[str, list[Counts]] = {}
        for g in self.goldens:
            groups.setdefault(g.category, []).append(g.counts)
        return {category: merge_counts(counts, self.k) for category, counts in groups.items()}


@dataclass(frozen=True)
class ServerCounting:
    """How llama-server counts one request's drafts where that differs from the Definitions.
    It budgets every draft from the request's cap, n_predict - generated - 1, not from where the
    chain will end (it cannot know where eos comes), so it drafts past the end of a chain that
    stops on eos; and it does not accept a drafted eos that more drafts follow
    (`common_sampler_sample_and_accept_n`), so acceptance never looks past the chain's end."""

    max_tokens: int  # the request's n_predict
    eos_ids: tuple[int, ...] = ()


def simulate_chain(prompt_ids, output_ids, proposer: Proposer, k: int,
                   counting: ServerCounting | None = None) -> Counts:
    """Replay speculation with `proposer` (draft cap k) over one golden chain P, G; with
    `counting`, count drafts as that server does."""
    context = np.asarray(list(prompt_ids) + list(output_ids), dtype=np.int64)  # [len(P) + N]
    golden = context[len(prompt_ids) :]  # [N] G, a view
    n = len(golden)
    limit, stop_ids = (n, ()) if counting is None else (counting.max_tokens, counting.eos_ids)
    counts = Counts(plain_steps=n - 1, drafted_at=[0] * k, accepted_at=[0] * k)
    observe = getattr(proposer, "observe", None)
    pos = 1
    while pos < n:
        budget = min(k, limit - pos - 1)
        # propose even when budget = 0 (it returns []): the generator does, and stateful
        # proposers must see the same calls in both
        drafted = draft(proposer, context[: len(prompt_ids) + pos], budget)
        accepted = _accepted_prefix(drafted, golden[pos : pos + len(drafted)], stop_ids)
        counts.record_pass(len(drafted), accepted)
        pos += accepted + 1
        if observe is not None:
            observe(context[: len(prompt_ids) + pos], len(drafted), accepted)
    return counts


def simulate(
    goldens: list[Golden], k: int, window: tuple[int, int], proposer: str = DEFAULT_PROPOSER,
    costs: dict[int, float] | None = None, cross_request: bool = False,
) -> SimRun:
    """Simulate one configuration over every golden, with one proposer instance, in order."""
    eos_ids = tuple(sorted({t for g in goldens for t in g.eos_ids}))
    drafter = make_proposer(proposer, k, window, costs, cross_request, eos_ids)
    sims = [
        GoldenSim(g.id, g.category, simulate_chain(g.prompt_ids, g.output_ids, drafter, k), g.seed)
        for g in goldens
    ]
    total = merge_counts([s.counts for s in sims], k)
    return SimRun(proposer=drafter.name, k=k, window=window, goldens=sims, total=total,
                  costs=costs, cross_request=cross_request, eos_ids=eos_ids)


def sweep(
    goldens: list[Golden], ks: list[int], windows: list[tuple[int, int]],
    proposers: str | list[str] = DEFAULT_PROPOSER, costs: dict[int, float] | None = None,
    cross_request: bool = False,
) -> list[SimRun]:
    """Every (proposer, k, window), proposer-major then k-major:
    [(p1, k1, w1), (p1, k1, w2), ..., (p1, k2, w1), ..., (p2, k1, w1), ...]."""
    names = [proposers] if isinstance(proposers, str) else proposers
    return [
        simulate(goldens, k, window, name, costs, cross_request)
        for name in names for k in ks for window in windows
    ]


def best_run(runs: list[SimRun]) -> SimRun:
    """The run with the highest total ratio; ties go to the earlier run (smaller k first)."""
    return max(runs, key=lambda run: run.total.ratio or 0.0)


def best_per_proposer(runs: list[SimRun]) -> list[SimRun]:
    """Each proposer's run with the highest modelled speedup (ties: the earlier run), in the order
    the proposers were given. The ratio alone would always favour the longest drafts."""
    groups: dict[str, list[SimRun]] = {}
    for run in runs:
        groups.setdefault(run.proposer, []).append(run)
    return [max(group, key=lambda r: r.modelled_speedup() or 0.0) for group in groups.values()]


SUMMED = ("plain_steps", "verify_passes", "drafts_proposed", "drafts_accepted")
SUMMED += ("passes_with_drafts",)


def merge_counts(counts: list[Counts], k: int = 0) -> Counts:
    """Sum counts over chains; per-pass lists are concatenated in chain order."""
    total = Counts(drafted_at=[0] * k, accepted_at=[0] * k)
    for c in counts:
        for name in SUMMED:
            setattr(total, name, getattr(total, name) + getattr(c, name))
        _add_into(total.drafted_at, c.drafted_at)
        _add_into(total.accepted_at, c.accepted_at)
        total.draft_lengths += c.draft_lengths
        total.accepted_lengths += c.accepted_lengths
    return total


def spec_time(
    draft_lengths: list[int], costs: dict[int, float], proposer_s_per_pass: float
) -> float:
    """Predicted time of the verify passes: sum of cost(1 + len(d)) plus the proposer per pass.

    `costs[n]` is the time of an n-token forward, in the same unit as `proposer_s_per_pass`
    (seconds); relative costs c(n) with costs[1] = 1 work too if the proposer time is relative.
    """
    missing = sorted({1 + d for d in draft_lengths} - costs.keys())
    if missing:
        raise KolibriError(f"no forward cost measured for n = {missing} tokens; measure c(n) first")
    passes = sum(costs[1 + d] for d in draft_lengths)
    return passes + proposer_s_per_pass * len(draft_lengths)


def predicted_speedup(
    plain_steps: int, draft_lengths: list[int], costs: dict[int, float], proposer_s_per_pass: float
) -> float | None:
    """plain_steps * cost(1) / (sum over passes of cost(1 + len(d)) + proposer time).

    With relative costs c(n) = cost(n) / cost(1) this is the Definitions' formula
    plain_steps / sum c(1 + len(d)), plus the proposer's time.
    """
    if 1 not in costs:
        raise KolibriError("no forward cost measured for n = 1 token; measure c(n) first")
    return div_or_none(plain_steps * costs[1], spec_time(draft_lengths, costs, proposer_s_per_pass))


def _accepted_prefix(draft: list[int], truth, stop_ids=()) -> int:
    """Length of the longest prefix of `draft` equal to `truth` (greedy acceptance); a token in
    `stop_ids` is accepted only as the draft's last (ServerCounting)."""
    for i, tok in enumerate(draft):
        if i >= len(truth) or tok != truth[i]:
            return i
        if tok in stop_ids and i + 1 < len(draft):
            return i
    return len(draft)


def _grow(values: list[int], length: int) -> None:
    values.extend([0] * (length - len(values)))


def _add_into(total: list[int], values: list[int]) -> None:
    _grow(total, len(values))
    for i, v in enumerate(values):
        total[i] += v


def div_or_none(num: float, den: float) -> float | None:
    return num / den if den else None
