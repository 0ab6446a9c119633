"""Replaying one configuration over batches of chains: the compiled replay when the proposer has
one (compiled.py), else the reference loop (simulate.simulate_chain) chain by chain.

A proposer that shares state across requests (`shares_state`: suffix --cross-request, adaptive)
is one instance for a whole stream, fed its chains in order; any other proposer starts fresh at
each chain, so chains can be replayed anywhere, in any grouping, with the same counts.
Non-goals: reading goldens, sharding, merging (shards.py).
"""

from dataclasses import dataclass

import numpy as np

from kolibri_cli.decode.proposers import (
    AdaptiveProposer,
    GuardProposer,
    HfProposer,
    LlamaCppMapK4vProposer,
    LlamaCppMapKProposer,
    LlamaCppOptions,
    LlamaCppSimpleProposer,
    NgramProposer,
    Proposer,
    SuffixProposer,
    make_proposer,
)
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden
from kolibri_cli.probe.replay import compiled
from kolibri_cli.probe.simulate import Counts, simulate_chain

MAX_VOCAB = 1 << 24  # token ids the suffix replay's dense root tables accept
NGRAM_RULES = {NgramProposer: compiled.VLLM, HfProposer: compiled.HF,
               LlamaCppSimpleProposer: compiled.LLAMACPP}


@dataclass(frozen=True)
class SimConfig:
    """One configuration to simulate: a proposer and its settings."""

    proposer: str  # canonical name
    k: int
    window: tuple[int, int]
    costs: tuple[tuple[int, float], ...] | None = None  # c(n) as (n, c) pairs (adaptive)
    cross_request: bool = False  # suffix: a global tree over the stream's earlier outputs
    index: int = 0  # its place in the probe's list of configurations (reports keep that order)
    llamacpp: LlamaCppOptions | None = None  # llama.cpp's types: min-hits, n-min, cache files

    def make_proposer(self, eos_ids=()):
        costs = None if self.costs is None else dict(self.costs)
        return make_proposer(self.proposer, self.k, self.window, costs, self.cross_request,
                             tuple(eos_ids), self.llamacpp)

    @property
    def ordered(self) -> bool:
        """True when chains must be replayed in order through one proposer (state shared across
        requests)."""
        return self.make_proposer().shares_state


class Chains:
    """A batch of goldens as flat arrays: chain c is tokens[starts[c]:starts[c+1]], its first
    prompt_lens[c] ids the prompt, then the output; its eos ids are eos[eos_starts[c]:...]."""

    def __init__(self, goldens: list[Golden]):
        self.goldens = goldens
        self.ids = [g.id for g in goldens]
        self.categories = [g.category for g in goldens]
        self.seeds = [g.seed if g.sampling else None for g in goldens]  # None: greedy
        flat = []
        for g in goldens:
            flat += g.prompt_ids
            flat += g.output_ids
        try:
            self.tokens = np.array(flat, dtype=np.int64)  # [sum of chain lengths]
        except OverflowError:
            raise KolibriError(f"a token id in golden {_largest(goldens).id!r} does not fit "
                               "64 bits; token ids are a model's vocabulary indices") from None
        self.starts = _offsets([len(g.prompt_ids) + len(g.output_ids) for g in goldens])  # [n+1]
        self.prompt_lens = np.array([len(g.prompt_ids) for g in goldens], dtype=np.int64)  # [n]
        self.eos_starts = _offsets([len(g.eos_ids) for g in goldens])  # int64[n + 1]
        self.eos = np.array([t for g in goldens for t in g.eos_ids], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.goldens)

    @property
    def plain_steps(self) -> int:
        return int(np.maximum(np.diff(self.starts) - self.prompt_lens - 1, 0).sum())


@dataclass
class ChainCounts:
    """Counts of each chain of a batch, as columns (cheap to build, sum and ship)."""

    k: int
    scalars: np.ndarray  # int64[n, 5]: compiled.SCALARS per chain
    drafted_at: np.ndarray  # int64[n, k]
    accepted_at: np.ndarray  # int64[n, k]
    pass_starts: np.ndarray  # int64[n + 1]: chain c's passes are [pass_starts[c], ...[c + 1])
    draft_lengths: np.ndarray  # int64[passes]
    accepted_lengths: np.ndarray  # int64[passes]

    @classmethod
    def empty(cls, n: int, k: int, passes: int) -> "ChainCounts":
        zeros = lambda *shape: np.zeros(shape, dtype=np.int64)  # noqa: E731
        return cls(k, zeros(n, 5), zeros(n, k), zeros(n, k), zeros(n + 1), zeros(passes),
                   zeros(passes))

    @classmethod
    def of(cls, counts: list[Counts], k: int) -> "ChainCounts":
        table = cls.empty(len(counts), k, sum(c.verify_passes for c in counts))
        for i, c in enumerate(counts):
            table.scalars[i] = [getattr(c, name) for name in compiled.SCALARS]
            table.drafted_at[i, : len(c.drafted_at)] = c.drafted_at
            table.accepted_at[i, : len(c.accepted_at)] = c.accepted_at
            table.pass_starts[i + 1] = table.pass_starts[i] + c.verify_passes
            passes = slice(table.pass_starts[i], table.pass_starts[i + 1])
            table.draft_lengths[passes] = c.draft_lengths
            table.accepted_lengths[passes] = c.accepted_lengths
        return table

    def chain(self, i: int) -> Counts:
        """Chain i's counts, with its per-pass lists."""
        passes = slice(self.pass_starts[i], self.pass_starts[i + 1])
        counts = Counts(**dict(zip(compiled.SCALARS, self.scalars[i].tolist(), strict=True)))
        counts.drafted_at = self.drafted_at[i].tolist()
        counts.accepted_at = self.accepted_at[i].tolist()
        counts.draft_lengths = self.draft_lengths[passes].tolist()
        counts.accepted_lengths = self.accepted_lengths[passes].tolist()
        return counts

    def sum(self, rows: np.ndarray | slice = slice(None)) -> Counts:
        """The counts of the chains `rows` summed (no per-pass lists)."""
        counts = Counts(**dict(zip(compiled.SCALARS, self.scalars[rows].sum(axis=0).tolist(),
                                   strict=True)))
        counts.drafted_at = self.drafted_at[rows].sum(axis=0).tolist()
        counts.accepted_at = self.accepted_at[rows].sum(axis=0).tolist()
        return counts

    def by_key(self, keys: list) -> dict:
        """Counts summed per key (one per chain, e.g. its category; None: left out), in order of
        first appearance."""
        codes = {}
        index = np.array([-1 if key is None else codes.setdefault(key, len(codes))
                          for key in keys], dtype=np.int64)
        return {key: self.sum(index == code) for key, code in codes.items()}


class Replayer:
    """One configuration replayed over the batches of one stream, in order."""

    def __init__(self, config: SimConfig, fast_path: bool = True):
        self.config = config
        self.proposer = config.make_proposer()
        self.ordered = self.proposer.shares_state
        self._fast = _fast_replay(self.proposer, config) if fast_path else None

    def replay(self, chains: Chains) -> ChainCounts:
        if self._fast is not None:
            return self._fast.replay(chains)
        counts = [simulate_chain(g.prompt_ids, g.output_ids, self._proposer_for(g), self.config.k)
                  for g in chains.goldens]
        return ChainCounts.of(counts, self.config.k)

    def _proposer_for(self, golden: Golden):
        """The stream's one proposer if it shares state across requests, else a fresh one for
        this chain (with the chain's own eos ids)."""
        return self.proposer if self.ordered else self.config.make_proposer(golden.eos_ids)


class NgramReplay:
    """vllm, hf and llamacpp-simple, compiled (compiled.ngram_replay)."""

    def __init__(self, proposer):
        self.rule = NGRAM_RULES[type(proposer)]
        self.k, self.window = proposer.k, (proposer.window_min, proposer.window_max)

    def replay(self, chains: Chains) -> ChainCounts:
        longest = int(np.diff(chains.starts).max(initial=0))
        if longest > compiled.MAX_CHAIN:
            raise KolibriError(f"a chain of {longest:,} ids is longer than the n-gram replay "
                               f"takes ({compiled.MAX_CHAIN:,}); split the golden")
        out = ChainCounts.empty(len(chains), self.k, chains.plain_steps)
        compiled.ngram_replay(chains.tokens, chains.starts, chains.prompt_lens, chains.eos,
                          chains.eos_starts, self.rule, self.k, *self.window, _columns(out))
        return _trimmed(out)


class SuffixReplay:
    """SuffixProposer compiled (compiled.suffix_replay): its tries live here, on arrays, and carry
    over from batch to batch (the global one with --cross-request)."""

    def __init__(self, proposer: SuffixProposer):
        self.proposer = proposer
        self.depth = proposer.max_depth
        self.params = np.array([proposer.max_spec_factor, proposer.max_spec_offset,
                                proposer.min_token_prob], dtype=np.float64)
        self.local = _new_trie(1024, self.depth)
        self.global_ = _new_trie(1024 if proposer.cross_request else 1, self.depth)
        self.state = np.zeros(2, dtype=np.int64)  # length of the context last seen, requests
        self.last = np.zeros(0, dtype=np.int64)  # the context last seen

    def replay(self, chains: Chains) -> ChainCounts:
        p = self.proposer
        out = ChainCounts.empty(len(chains), p.k, chains.plain_steps)
        self._fit(chains)
        first = 0
        while first < len(chains):
            first = compiled.suffix_replay(chains.tokens, chains.starts, chains.prompt_lens, p.k,
                                       self.depth, self.params, p.cross_request, self.local,
                                       self.global_, self.state, self.last, _columns(out), first)
            if first < len(chains):  # a trie might overflow: make room, go on from that chain
                room = int(np.diff(chains.starts)[first]) * self.depth
                self.local = _with_room(self.local, room)
                if p.cross_request:
                    self.global_ = _with_room(self.global_, room)
        return _trimmed(out)

    def _fit(self, chains: Chains) -> None:
        """Room for this batch's token ids in the root tables and for its longest context."""
        vocab = int(chains.tokens.max(initial=0)) + 1
        if vocab > MAX_VOCAB:
            raise KolibriError(f"token id {vocab - 1} is too large for the suffix replay's "
                               f"tables (at most {MAX_VOCAB - 1}: a model's vocabulary)")
        self.local = _with_vocab(self.local, vocab)
        self.global_ = _with_vocab(self.global_, vocab)
        self.last = _padded(self.last, int(np.diff(chains.starts).max(initial=0)), 0)


class IndexedReplay:
    """guard, adaptive, llamacpp-map-k(4v): the reference loop over the proposer's own code,
    told what walking one chain makes cheap: the longest match at every prefix, from one pass of
    compiled.longest_matches (guard, adaptive search the whole context at each call), that each
    context extends the last (the guard compares them otherwise), the chain as one list (map-k
    lists the context at each call). Linear in a chain's length; the same counts."""

    def __init__(self, config: SimConfig, proposer):
        self.config, self.proposer = config, proposer

    def replay(self, chains: Chains) -> ChainCounts:
        counts = []
        for c, g in enumerate(chains.goldens):
            ctx = chains.tokens[chains.starts[c] : chains.starts[c + 1]]  # [T]
            proposer = self.proposer if self.proposer.shares_state else (
                self.config.make_proposer(g.eos_ids))
            walk = _ChainWalk(proposer, ctx, len(g.prompt_ids))
            counts.append(simulate_chain(g.prompt_ids, g.output_ids, walk, self.config.k))
        return ChainCounts.of(counts, self.config.k)


class _ChainWalk(Proposer):
    """One proposer walking the prefixes of one chain, in order (IndexedReplay)."""

    def __init__(self, proposer, ctx: np.ndarray, n_prompt: int):
        self.inner, self.name, self.k = proposer, proposer.name, proposer.k
        self.window_min, self.window_max = proposer.window_min, proposer.window_max
        self.observes, self.shares_state = proposer.observes, proposer.shares_state
        if isinstance(proposer, LlamaCppMapKProposer):
            self.ids = ctx.tolist()
        else:
            self.matches = compiled.longest_matches(ctx, n_prompt + 1, self.window_min,
                                                    self.window_max)  # [T + 1, 2]

    def begin(self, prompt_ids) -> None:
        self.inner.begin(prompt_ids)

    def propose(self, context, max_tokens: int) -> list[int]:
        if isinstance(self.inner, GuardProposer):
            return self.inner.propose_grown(context, max_tokens, self.matches[len(context)], True)
        if isinstance(self.inner, AdaptiveProposer):
            return self.inner.propose_matched(context, max_tokens, self.matches[len(context)])
        return self.inner.propose_listed(self.ids, len(context), max_tokens)

    def observe(self, context, drafted: int, accepted: int) -> None:
        self.inner.observe(context, drafted, accepted)


INDEXED = (GuardProposer, AdaptiveProposer, LlamaCppMapKProposer, LlamaCppMapK4vProposer)


def _fast_replay(proposer, config: SimConfig | None = None):
    """The compiled (or indexed) replay of this exact proposer type, or None (the generic
    path)."""
    if type(proposer) in NGRAM_RULES:
        return NgramReplay(proposer)
    if type(proposer) is SuffixProposer:
        return SuffixReplay(proposer)
    if type(proposer) in INDEXED and config is not None:
        return IndexedReplay(config, proposer)
    return None


def _columns(out: ChainCounts) -> tuple:
    return (out.scalars, out.drafted_at, out.accepted_at, out.draft_lengths,
            out.accepted_lengths, out.pass_starts)


def _trimmed(out: ChainCounts) -> ChainCounts:
    passes = int(out.pass_starts[-1])
    out.draft_lengths = out.draft_lengths[:passes]
    out.accepted_lengths = out.accepted_lengths[:passes]
    return out


def _new_trie(capacity: int, depth: int) -> tuple:
    """A trie with its root only (compiled.py's layout: nodes, root table, meta)."""
    nodes = np.full((capacity, 6), -1, dtype=np.int64)  # [capacity, 6]
    nodes[0, compiled.COUNT] = 0
    meta = np.zeros(2 + depth, dtype=np.int64)  # nodes used, live suffixes, their nodes
    meta[0] = 1
    return nodes, np.zeros(0, dtype=np.int64), meta


def _with_room(trie: tuple, room: int) -> tuple:
    """The trie with room for `room` more nodes (its node table at least doubled). The new rows
    are left unwritten (compiled._add_child writes a node's row when it makes it): room is sized
    for the worst case, chain length x depth, and only the rows used take memory."""
    nodes, root, meta = trie
    needed = int(meta[0]) + room
    if needed <= nodes.shape[0]:
        return trie
    bigger = np.empty((max(needed, 2 * nodes.shape[0]), nodes.shape[1]), dtype=np.int64)
    bigger[: int(meta[0])] = nodes[: int(meta[0])]
    return bigger, root, meta


def _with_vocab(trie: tuple, vocab: int) -> tuple:
    nodes, root, meta = trie
    return nodes, _padded(root, vocab, -1), meta


def _padded(values: np.ndarray, size: int, fill: int) -> np.ndarray:
    if size <= values.shape[0]:
        return values
    return np.concatenate([values, np.full(size - values.shape[0], fill, dtype=np.int64)])


def _largest(goldens: list[Golden]) -> Golden:
    return max(goldens, key=lambda g: max(g.prompt_ids + g.output_ids))


def _offsets(sizes: list[int]) -> np.ndarray:
    return np.concatenate(([0], np.cumsum(sizes, dtype=np.int64))).astype(np.int64)
