"""The exact acceptance simulation of speculation over golden chains, and the cost model.

Greedy acceptance is exact: a draft token is accepted iff it equals the model's argmax, and the
model's greedy chain IS the golden. So replaying the proposer over the golden gives the real spec
run's counts (verify passes, drafts proposed/accepted) without running the model.
Definitions (normative; docs/simulation.md): for prompt ids P and output ids G = g1..gN,
g1 from prefill, plain_steps = N - 1 and

    pos = 1
    while pos < N:
        j = min(k, N - pos - 1); d = propose(P + G[:pos], j)  (empty when j = 0)
        a = longest prefix of d equal to G[pos : pos + len(d)]
        one verify pass; drafted_at[i] += 1 for i < len(d); accepted_at[i] += 1 for i < a
        pos += a + 1

A stateful proposer is also told each pass's outcome, `observe(P + G[:pos], len(d), a)` with
pos already advanced, exactly as the speculative generator tells it. Which proposer instance
replays which chain (one per chain, or one per stream for proposers that share state across
requests) is the replay's business (replay/); batches, shards and workers are replay/shards.py's.
Non-goals: running the model, timing (the measured probe does that), rendering.
"""

from dataclasses import dataclass, field

import numpy as np

from kolibri_cli.costs.model import cost_model
from kolibri_cli.decode.proposers import (
    LlamaCppOptions,
    Proposer,
    draft,
    draft_tree,
    format_window,
    make_proposer,
    proposer_class,
)
from kolibri_cli.errors import KolibriError


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
    # per pass, for one chain only (sums over chains leave them empty: memory stays flat)
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

    def passes_by_draft_length(self) -> list[int]:
        """[max len(d) + 1] the number of passes that drafted 0, 1, 2, ... tokens (from
        drafted_at, so sums over chains have it too)."""
        at_least = [self.verify_passes, *self.drafted_at]  # passes drafting >= 0, 1, ... tokens
        counts = [a - b for a, b in zip(at_least, at_least[1:] + [0], strict=True)]
        while len(counts) > 1 and counts[-1] == 0:
            counts.pop()
        return counts

    def add(self, other: "Counts") -> None:
        """Add another chain's or sum's counts (not its per-pass lists)."""
        for name in SUMMED:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        _add_into(self.drafted_at, other.drafted_at)
        _add_into(self.accepted_at, other.accepted_at)

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
    goldens: list[GoldenSim] | None  # per chain, in input order; None when not kept (too many)
    total: Counts  # summed over goldens: ratio = sum plain_steps / sum verify_passes
    costs: dict[int, float] | None = None  # forward costs the run was simulated with (adaptive)
    cross_request: bool = False  # suffix: global tree over earlier goldens' outputs
    eos_ids: tuple[int, ...] = ()  # the goldens' eos ids (hf cuts its drafts before them)
    categories: dict[str, Counts] = field(default_factory=dict)  # summed per category, in order
    chains: int = 0  # goldens simulated
    ordered: bool = False  # the proposer shares state across requests: one stream per file
    streams: int = 0  # ordered: the streams (files) replayed, each in order from a fresh state
    by_seed: dict[int, dict[str, Counts]] | None = None  # sampled chains: per seed, per category
    llamacpp: LlamaCppOptions | None = None  # llama.cpp's per-type options

    @property
    def label(self) -> str:
        extra = self.llamacpp.label() if self.llamacpp and proposer_class(
            self.proposer).llama_server else ""
        return f"k={self.k} window={format_window(self.window)}{extra}"

    @property
    def name(self) -> str:
        """The proposer and its configuration, e.g. "vllm k=5 window=1-4"."""
        return f"{self.proposer} {self.label}"

    def new_proposer(self) -> Proposer:
        """A fresh proposer configured like the one this run simulated."""
        return make_proposer(self.proposer, self.k, self.window, self.costs, self.cross_request,
                             self.eos_ids, self.llamacpp)

    def modelled_speedup(self, counts: Counts | None = None) -> float | None:
        """The cost model's speedup for `counts` (default: the total) with the run's costs, or
        the default c(n) model (proposers.cost_model) when none were measured; proposer time 0."""
        counts = counts or self.total
        c = cost_model(self.costs)
        by_length = counts.passes_by_draft_length()
        relative = {n: c(n) for n in range(1, len(by_length) + 1)}
        return predicted_speedup_by_length(counts.plain_steps, by_length, relative, 0.0)

    def by_category(self) -> dict[str, Counts]:
        """Counts summed per golden category, in order of first appearance."""
        return self.categories


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
    context = chain_context(prompt_ids, output_ids)  # [len(P) + N]
    n = len(output_ids)
    counts = Counts(plain_steps=n - 1, drafted_at=[0] * k, accepted_at=[0] * k)
    proposer.begin(prompt_ids)
    pos = 1
    while pos < n:
        drafted, accepted, pos = next_pass(proposer, context, len(prompt_ids), pos, k, counting)
        counts.record_pass(drafted, accepted)
    return counts


def chain_context(prompt_ids, output_ids) -> np.ndarray:  # -> int64[len(P) + N]
    """P + G as one array: every pass's context is a prefix of it."""
    return np.asarray(list(prompt_ids) + list(output_ids), dtype=np.int64)


def next_pass(proposer: Proposer, context: np.ndarray, prompt_len: int, pos: int, k: int,
              counting: ServerCounting | None = None) -> tuple[int, int, int]:
    """One verify pass of the Definitions at output position `pos` of the chain `context`
    (chain_context): (drafted, accepted, the next pos); a stateful proposer observes it."""
    golden = context[prompt_len:]  # [N] G, a view
    limit, stop_ids = (len(golden), ()) if counting is None else (counting.max_tokens,
                                                                  counting.eos_ids)
    budget = min(k, limit - pos - 1)
    # propose even when budget = 0 (it returns []): the generator does, and stateful proposers
    # must see the same calls in both
    drafted, accepted = _pass(proposer, context[: prompt_len + pos], budget, golden, pos,
                              stop_ids)
    pos += accepted + 1
    if proposer.observes:
        proposer.observe(context[: prompt_len + pos], drafted, accepted)
    return drafted, accepted, pos


def _pass(proposer: Proposer, context, budget: int, golden, pos: int,
          stop_ids=()) -> tuple[int, int]:
    """(drafts verified, drafts accepted) in one pass: a chain's accepted prefix, or a tree's
    nodes and its longest accepted branch (the golden picks the child at every depth; past the
    chain's end nothing is accepted)."""
    if proposer.trees:
        tree = draft_tree(proposer, context, budget)
        depths = tree.depths()

        def next_token(node: int) -> int:
            at = pos + (depths[node] if node >= 0 else 0)
            return int(golden[at]) if at < len(golden) else -1

        return len(tree), len(tree.accepted_path(next_token))
    drafted = draft(proposer, context, budget)
    return len(drafted), _accepted_prefix(drafted, golden[pos : pos + len(drafted)], stop_ids)


SUMMED = ("plain_steps", "verify_passes", "drafts_proposed", "drafts_accepted")
SUMMED += ("passes_with_drafts",)


def merge_counts(counts: list[Counts], k: int = 0) -> Counts:
    """Sum counts over chains (per-pass lists are not kept: passes_by_draft_length has them
    summed)."""
    total = Counts(drafted_at=[0] * k, accepted_at=[0] * k)
    for c in counts:
        total.add(c)
    return total


def spec_time(
    draft_lengths: list[int], costs: dict[int, float], proposer_s_per_pass: float
) -> float:
    """Predicted time of the verify passes: sum of cost(1 + len(d)) plus the proposer per pass.

    `costs[n]` is the time of an n-token forward, in the same unit as `proposer_s_per_pass`
    (seconds); relative costs c(n) with costs[1] = 1 work too if the proposer time is relative.
    """
    return spec_time_by_length(_by_length(draft_lengths), costs, proposer_s_per_pass)


def spec_time_by_length(
    passes_by_length: list[int], costs: dict[int, float], proposer_s_per_pass: float
) -> float:
    """spec_time with the passes counted by draft length: passes_by_length[d] passes drafted d
    tokens (the same sum, in the order of d, whatever the chains' order)."""
    missing = sorted({1 + d for d, n in enumerate(passes_by_length) if n} - costs.keys())
    if missing:
        raise KolibriError(f"no forward cost measured for n = {missing} tokens; measure c(n) first")
    passes = sum(n * costs[1 + d] for d, n in enumerate(passes_by_length) if n)
    return passes + proposer_s_per_pass * sum(passes_by_length)


def predicted_speedup(
    plain_steps: int, draft_lengths: list[int], costs: dict[int, float], proposer_s_per_pass: float
) -> float | None:
    """plain_steps * cost(1) / (sum over passes of cost(1 + len(d)) + proposer time).

    With relative costs c(n) = cost(n) / cost(1) this is the Definitions' formula
    plain_steps / sum c(1 + len(d)), plus the proposer's time.
    """
    return predicted_speedup_by_length(plain_steps, _by_length(draft_lengths), costs,
                                       proposer_s_per_pass)


def predicted_speedup_by_length(
    plain_steps: int, passes_by_length: list[int], costs: dict[int, float],
    proposer_s_per_pass: float,
) -> float | None:
    """predicted_speedup with the passes counted by draft length (spec_time_by_length)."""
    if 1 not in costs:
        raise KolibriError("no forward cost measured for n = 1 token; measure c(n) first")
    spec = spec_time_by_length(passes_by_length, costs, proposer_s_per_pass)
    return div_or_none(plain_steps * costs[1], spec)


def _by_length(draft_lengths: list[int]) -> list[int]:
    counts = [0] * (max(draft_lengths, default=0) + 1)
    for d in draft_lengths:
        counts[d] += 1
    return counts


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
