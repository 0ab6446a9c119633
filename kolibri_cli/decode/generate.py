"""The two generators — plain and n-gram speculative — on the one forward kernel.

Speculation never changes the text: the token at every position is chosen from that position's
logits by a rule that depends only on the position (decode/sampling.py), the kernel is
batch-invariant, and a draft token is accepted only if it equals the token chosen at its
position. So both generators emit the same ids, greedy or sampled, and stop at the same token.
"""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from kolibri_cli.decode.proposers import (
    DraftTree,
    Proposer,
    draft,
    draft_tree,
    warm_up,
)
from kolibri_cli.decode.sampling import GREEDY, Logprobs, Sampler, Sampling
from kolibri_cli.decode.stops import Stops
from kolibri_cli.errors import KolibriError

OnTokens = Callable[[list[int]], None]  # called with the ids each step adds


@dataclass
class VerifyPass:
    pos: int  # output index of the first token this pass produces
    drafted: int  # drafts run through the pass (a tree's nodes)
    accepted: int  # drafts equal to the token chosen at their position (longest prefix/branch)
    depths: tuple[int, ...] = ()  # a tree's node depths (empty: a chain)

    def aimed_before(self, offset: int) -> int:
        """Drafts aimed at output positions pos .. pos + offset - 1 (a chain's first `offset`;
        a tree's nodes at depth <= offset)."""
        if self.depths:
            return sum(d <= offset for d in self.depths)
        return min(self.drafted, offset)


@dataclass
class KVState:
    """A KV cache kept across generations (a chat): `ids` are the tokens whose keys and values
    it holds at positions 0..len(ids)-1, so the next prompt's common prefix is not recomputed."""

    cache: object  # engine KVCache
    ids: list[int] = field(default_factory=list)


@dataclass
class GenerationResult:
    prompt_ids: list[int]
    output_ids: list[int]  # includes the token generation stopped on (eos, stop string)
    text: str  # the output's text, cut before a stop string
    prefill_s: float
    decode_s: float
    forward_passes: int  # prefill included
    mode: str = "plain"
    passes: list[VerifyPass] = field(default_factory=list)  # spec only, one per verify pass
    proposer_s: float = 0.0
    sampling: Sampling = GREEDY
    stop_reason: str = "length"  # "eos", "stop" (a stop string) or "length" (max tokens)
    sample_s: float = 0.0  # of decode_s: time spent choosing tokens from logits
    step_s: list[float] = field(default_factory=list)  # decode_s by step: a plain step or a
    # verify pass with its drafting and choosing (sum == decode_s); the probe's timings use them
    logprobs: list | None = None  # asked for: per output token, its Logprobs row

    @property
    def step_rows(self) -> list[int]:
        """Tokens each decode step ran through the forward, one per `step_s`."""
        if self.mode == "spec":
            return [1 + p.drafted for p in self.passes]
        return [1] * len(self.step_s)

    @property
    def new_tokens(self) -> int:
        return len(self.output_ids)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens after the first (which prefill produces) per second of decoding."""
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0

    def counted(self) -> list[tuple[int, int]]:
        """(drafted, accepted) per pass, counting only drafts aimed at positions before the final
        token — the probe's definition, so a simulation over this chain gives the same counts.
        Drafts past the end (verified, then cut by eos) cost time but are not counted."""
        last = len(self.output_ids) - 1
        return [(p.aimed_before(last - p.pos), min(p.accepted, last - p.pos))
                for p in self.passes]

    def to_dict(self, model_name: str, numerics: str | None = None) -> dict:
        """The `kolibri generate --json` object; `numerics`: the numeric path the kernel ran
        (None: a server's, not known)."""
        stats = {
            "prompt_tokens": len(self.prompt_ids),
            "new_tokens": self.new_tokens,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            # one new token is prefill's: no decode speed (null, as the text says n/a)
            "decode_tokens_per_s": self.decode_tokens_per_s if self.new_tokens > 1 else None,
            "forward_passes": self.forward_passes,
        }
        if self.mode == "spec":
            stats |= self.spec_stats() | {"proposer_s": self.proposer_s}
        stats["sample_s"] = self.sample_s
        return {"model": model_name, "numerics": numerics, "mode": self.mode,
                "sampling": self.sampling.to_dict(), "prompt_ids": self.prompt_ids,
                "output_ids": self.output_ids, "text": self.text,
                "stop_reason": self.stop_reason, "stats": stats}

    def spec_stats(self) -> dict:
        counted = self.counted()
        drafted = sum(d for d, _ in counted)
        accepted = sum(a for _, a in counted)
        width = max((d for d, _ in counted), default=0)
        return {
            "verify_passes": len(self.passes),
            "drafts_proposed": drafted,
            "drafts_accepted": accepted,
            "acceptance_rate": accepted / drafted if drafted else 0.0,
            "accepted_per_position": [sum(a > i for _, a in counted) for i in range(width)],
            "drafted_per_position": [sum(d > i for d, _ in counted) for i in range(width)],
        }


@dataclass
class Comparison:
    """Plain then speculative decoding of one prompt: the same ids (the law), and how much
    faster speculation decoded."""

    plain: GenerationResult
    spec: GenerationResult

    @property
    def identical(self) -> bool:
        return self.plain.output_ids == self.spec.output_ids

    @property
    def speedup(self) -> float | None:
        """spec / plain decode speed; None when plain decoded nothing after prefill (one new
        token: prefill's)."""
        plain = self.plain.decode_tokens_per_s
        return self.spec.decode_tokens_per_s / plain if plain > 0 else None

    def check(self) -> None:
        if not self.identical:
            raise KolibriError("speculative output differs from plain output (a kernel or "
                               "sampler bug)")


def compare(model, prompt_ids: Sequence[int], max_tokens: int, proposer: Proposer, *,
            sampling: Sampling = GREEDY, stop: Sequence[str] = ()) -> Comparison:
    """Both generators on the same prompt, plain first."""
    how = {"sampling": sampling, "stop": stop}
    return Comparison(generate_plain(model, prompt_ids, max_tokens, **how),
                      generate_spec(model, prompt_ids, max_tokens, proposer, **how))


def generate_plain(model, prompt_ids: Sequence[int], max_tokens: int,
                   on_tokens: OnTokens | None = None, *, sampling: Sampling = GREEDY,
                   stop: Sequence[str] = (), kv: KVState | None = None,
                   logprobs: Logprobs | None = None) -> GenerationResult:
    run = _Run(model, prompt_ids, max_tokens, sampling, stop, kv, logprobs=logprobs)
    run.commit([run.prefill()], on_tokens)
    marks = [time.perf_counter()]  # each decode step's end, after the start
    while not run.done:
        logits = run.tf.forward([run.out[-1]], run.last_pos, run.cache)  # [1, V]
        run.commit([run.pick(logits[0], len(run.out))], on_tokens)
        marks.append(time.perf_counter())
    return run.result("plain", marks, forward_passes=len(run.out))


def generate_spec(model, prompt_ids: Sequence[int], max_tokens: int, proposer: Proposer,
                  on_tokens: OnTokens | None = None, *, sampling: Sampling = GREEDY,
                  stop: Sequence[str] = (), kv: KVState | None = None,
                  logprobs: Logprobs | None = None) -> GenerationResult:
    warm_up()
    proposer.begin(prompt_ids)
    trees = proposer.trees
    run = _Run(model, prompt_ids, max_tokens, sampling, stop, kv, proposer.k if trees else 0,
               logprobs)
    run.commit([run.prefill()], on_tokens)
    passes, proposer_s = [], 0.0
    # looked up once: each step runs right after a forward evicted the caches
    drafter, verify = (draft_tree, run.verify_tree) if trees else (draft, run.verify)
    timed, observe = _timer(proposer), proposer.observe if proposer.observes else None
    marks = [time.perf_counter()]  # each verify pass's end, after the start
    while not run.done:
        tp, budget, context = time.perf_counter(), max_tokens - len(run.out) - 1, run.context()
        drafts = drafter(proposer, context, budget)
        proposer_s += time.perf_counter() - tp
        a, new = verify(drafts)
        if timed is not None:
            timed(1 + len(drafts), len(context), run.forward_s)
        passes.append(VerifyPass(len(run.out), len(drafts), a,
                                 tuple(drafts.depths()) if trees else ()))
        produced = run.commit(new, on_tokens)
        if observe is not None:
            proposer_s += _observe(observe, run.context(), passes[-1], run.done, produced)
        marks.append(time.perf_counter())
    result = run.result("spec", marks, forward_passes=1 + len(passes))
    result.passes, result.proposer_s = passes, proposer_s
    return result


class _Run:
    """What both generators share: the cache, the ids so far, choosing and committing tokens."""

    def __init__(self, model, prompt_ids, max_tokens: int, sampling: Sampling, stop, kv,
                 tree_rows: int = 0, logprobs: Logprobs | None = None):
        self.model, self.tf, self.kv = model, model.transformer, kv
        self.tree_rows = tree_rows  # cache rows past the end a tree's nodes may need
        self.sampler = Sampler(sampling, logprobs, len(prompt_ids))
        self.stops = Stops(model.eos_ids, stop, model.tokenizer)
        self.n, self.max_tokens = len(prompt_ids), max_tokens
        self.ids = np.empty(self.n + max_tokens, dtype=np.int64)  # prompt, then output
        self.ids[: self.n] = prompt_ids
        self.out: list[int] = []
        self.reason: str | None = None
        self.forward_s = 0.0  # seconds of the last verify pass's forward
        self.cache = self._cache(kv)

    def _cache(self, kv):
        if kv is None:
            room = self.tf.config.max_position_embeddings - self.n - self.max_tokens
            return self.tf.new_cache(self.n + self.max_tokens + max(min(self.tree_rows, room), 0))
        if self.n + self.max_tokens > kv.cache.max_len:
            raise KolibriError(f"{self.n} prompt + {self.max_tokens} new tokens exceed the "
                               f"context ({kv.cache.max_len})")
        return kv.cache

    @property
    def done(self) -> bool:
        return self.reason is not None or len(self.out) >= self.max_tokens

    @property
    def last_pos(self) -> int:
        return self.n + len(self.out) - 1  # cache position of the last token

    def context(self) -> np.ndarray:
        return self.ids[: self.n + len(self.out)]  # [len(P) + len(out)] a view

    def prefill(self) -> int:
        """Forward the prompt (only past the prefix a kept cache already holds); the first
        output token."""
        t0, reuse, prompt = time.perf_counter(), 0, self.ids[: self.n]
        if self.kv is not None:
            reuse = _common_prefix(self.kv.ids, prompt, self.n - 1)
            self.kv.ids, self.cache.length = [], min(self.cache.length, reuse)
        logits = self.tf.prefill(prompt[reuse:], reuse, self.cache)  # [V]
        if self.kv is not None:
            self.kv.ids = prompt.tolist()
        first = self.pick(logits, 0)
        self.prefill_s = time.perf_counter() - t0
        self.sampler.seconds = 0.0  # sample_s counts decoding only, like decode_s
        return first

    def pick(self, logits: np.ndarray, i: int) -> int:
        """The token at output index i, from its logits row and the ids before it."""
        return self.sampler.pick(logits, self.n + i, self.ids[: self.n + i])

    def verify(self, drafts: list[int]) -> tuple[int, list[int]]:
        """Run [last, d1..dj] in one forward; choose tokens row by row while they equal the
        drafts (later rows draw no noise); return (accepted, the tokens this pass produces)."""
        pos, i = self.last_pos, len(self.out)
        if drafts:
            self.ids[pos + 1 : pos + 1 + len(drafts)] = drafts  # the context rows 1.. see
        t0 = time.perf_counter()
        logits = self.tf.forward([self.out[-1], *drafts], pos, self.cache)  # [j + 1, V]
        self.forward_s = time.perf_counter() - t0
        a, token = 0, self.pick(logits[0], i)
        while a < len(drafts) and token == drafts[a]:
            a += 1
            token = self.pick(logits[a], i + a)
        self.cache.length = pos + a + 1  # roll back: rejected drafts' K/V are overwritten later
        return a, [*drafts[:a], token]

    def verify_tree(self, tree: DraftTree) -> tuple[int, list[int]]:
        """Run [last, nodes...] in one forward as a tree; walk from the root, choosing each
        position's token from the row of the node reached so far, into the child carrying it;
        move the accepted branch's K/V into place; return (accepted, the tokens produced)."""
        pos, i = self.last_pos, len(self.out)
        tree = tree.first(self.cache.max_len - pos - 1)  # near the context's end: what fits
        if not len(tree):
            return self.verify([])
        t0 = time.perf_counter()
        rows = self.tf.forward([self.out[-1], *tree.tokens], pos, self.cache,
                               parents=[-1, *(p + 1 for p in tree.parents)])  # [1 + nodes, V]
        self.forward_s = time.perf_counter() - t0
        children: dict[int, dict[int, int]] = {}
        for node, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
            children.setdefault(parent, {}).setdefault(token, node)
        path, node, token = [], -1, self.pick(rows[0], i)
        while (child := children.get(node, {}).get(token)) is not None:
            path.append(child)
            node = child
            self.ids[pos + len(path)] = token  # the context the next position's choice sees
            token = self.pick(rows[child + 1], i + len(path))
        self.cache.keep_branch(pos, [n + 1 for n in path])
        return len(path), [*(tree.tokens[n] for n in path), token]

    def commit(self, tokens: list[int], on_tokens: OnTokens | None) -> int:
        """Append tokens one at a time until a stop; emit them; return how many were kept."""
        kept = 0
        for token in tokens:
            self.ids[self.n + len(self.out)] = token
            self.out.append(token)
            kept += 1
            self.reason = self.stops.reason(self.out)
            if self.done:
                break
        if on_tokens is not None:
            on_tokens(tokens[:kept])
        return kept

    def result(self, mode: str, marks: list[float], forward_passes: int) -> GenerationResult:
        """The result; `marks`: the decode loop's start, then the end of each of its steps."""
        if self.kv is not None:
            self.kv.ids = self.context()[:-1].tolist()  # the last token was never forwarded
        return GenerationResult(
            self.ids[: self.n].tolist(), self.out, self.stops.text(self.out), self.prefill_s,
            marks[-1] - marks[0], forward_passes, mode=mode, sampling=self.sampler.sampling,
            stop_reason=self.reason or "length", sample_s=self.sampler.seconds,
            step_s=[b - a for a, b in pairwise(marks)], logprobs=self._logprobs())

    def _logprobs(self) -> list | None:
        rows = self.sampler.logprobs
        return None if rows is None else [rows.at[self.n + i] for i in range(len(self.out))]


def _common_prefix(a: Sequence[int], b: np.ndarray, cap: int) -> int:
    n = min(len(a), len(b), cap)
    diff = np.flatnonzero(np.asarray(a[:n], dtype=np.int64) != b[:n])
    return int(diff[0]) if diff.size else n


def _observe(observe, context, done: VerifyPass, final: bool, produced: int) -> float:
    """Tell a stateful proposer how the pass went (its `observe`) — the same call the probe
    simulation makes — and return the seconds it took (proposer time). On the final pass, drafts
    aimed past the last token are not counted (GenerationResult.counted), exactly as in the
    simulation, which caps drafts at the chain's end and so never proposes them."""
    t0 = time.perf_counter()
    if final:
        last = produced - 1
        observe(context, done.aimed_before(last), min(done.accepted, last))
    else:
        observe(context, done.drafted, done.accepted)
    return time.perf_counter() - t0


def _timer(proposer: Proposer) -> Callable[[int, int, float], None] | None:
    """Where a proposer reading a cost table takes the time of each forward it chose —
    `add(rows, context, seconds)`: `rows` tokens after `context` (the length of the context it
    drafted from) — or None. A frozen table takes none."""
    if proposer.costs_kind != "table" or proposer.costs.frozen:
        return None
    return proposer.costs.add
