"""Draft proposers for speculative decoding: given the context, guess the next few tokens.

Scope: model-free proposers behind one tiny interface (`Proposer`), each following a published
rule (docs/probe.md, "Proposers"): `vllm` (alias `ngram`), `hf`, `llamacpp-simple`, `suffix`,
`adaptive`; plus parsing/validation of their settings.
Every proposer computes its draft with cap k and THEN cuts it to the caller's budget, so a smaller
budget gives a prefix of the same draft: the simulation (which knows where a chain ends) and a
real run (which does not) then see the same drafts. Stateful proposers (`suffix`, `adaptive`)
also have `observe(context, drafted, accepted)`, called after every verify pass by both the
simulation and the speculative generator, so they evolve identically in both.
Non-goals: verification, acceptance, the KV cache (the speculative generator owns those).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np
from numba import njit

from kolibri_cli.errors import KolibriError
from kolibri_cli.suffix_tree import SuffixTrie

DEFAULT_K = 5
DEFAULT_WINDOW = (1, 4)


@runtime_checkable
class Proposer(Protocol):
    """Anything that drafts tokens from the context alone."""

    name: str

    def propose(self, context, max_tokens: int) -> list[int]:
        """Draft at most `max_tokens` tokens to follow `context` (prompt + generated ids)."""
        ...

    def describe(self) -> str:
        """One line for reports: the proposer and its settings."""
        ...


@runtime_checkable
class Observer(Protocol):
    """A stateful proposer: told the outcome of every verify pass (same call in simulation and in
    a real run). `context` is prompt + output after the pass; `drafted`/`accepted` are the pass's
    counts as the probe defines them (drafts past the final token are not counted)."""

    def observe(self, context, drafted: int, accepted: int) -> None: ...


@njit(cache=True)
def _continuation_start(tokens, min_n, max_n):  # tokens: int64[T] -> int
    """Index right after the LEFTMOST earlier occurrence of the longest matching suffix, or -1."""
    return _longest_match(tokens, min_n, max_n)[0]


@njit(cache=True)
def _longest_match(tokens, min_n, max_n):  # tokens: int64[T] -> (start, n)
    """(index right after the LEFTMOST earlier occurrence of the longest matching suffix, its
    length n), or (-1, 0).

    One KMP pass over the reversed context (vLLM's ngram_proposer): the pattern is the reversed
    suffix (at most max_n long), the text is the reversed context from index 1 on, so a match
    never includes the final position (no self-match). Ties on length keep the LAST match in
    reversed order, i.e. the leftmost occurrence in the original order.
    """
    total = tokens.shape[0]
    if total < min_n + 1:
        return -1, 0
    rev = tokens[::-1]
    lps = np.zeros(max_n, dtype=np.int64)  # prefix function of the pattern
    longest = 0
    position = 0
    matched = 0
    i = 1
    while i < total:
        if rev[matched] == rev[i]:
            matched += 1
            if matched >= longest:
                longest = matched
                position = i
            if i < max_n:
                lps[i] = matched
            if matched == max_n:
                matched = lps[max_n - 1]
            i += 1
        elif matched != 0:
            matched = lps[matched - 1]
        else:
            i += 1
    if longest < min_n:
        return -1, 0
    return total - 1 - position + longest, longest


@dataclass(frozen=True)
class NgramProposer:
    """vLLM's n-gram proposer (vllm/v1/spec_decode/ngram_proposer.py): find the longest n in
    [window_min, window_max] whose last-n-token suffix occurred earlier in the context, and
    propose the up-to-k tokens after its leftmost occurrence. Linear time per call."""

    k: int  # draft length cap
    window_min: int  # shortest n-gram that may match
    window_max: int  # longest n-gram tried

    name: ClassVar[str] = "vllm"

    def __post_init__(self):
        validate_k(self.k)
        validate_window(self.window_min, self.window_max)

    def propose(self, context, max_tokens: int) -> list[int]:
        budget = min(self.k, max_tokens)
        if budget <= 0:
            return []
        tokens = np.ascontiguousarray(context, dtype=np.int64)  # [T]
        start = _continuation_start(tokens, self.window_min, self.window_max)
        if start < 0:
            return []
        return tokens[start : start + budget].tolist()

    def describe(self) -> str:
        return f"{self.name} k={self.k} window={format_window((self.window_min, self.window_max))}"


@njit(cache=True)
def _first_match_start(tokens, min_n, max_n):  # tokens: int64[T] -> int
    """transformers' prompt lookup: for n from max_n down to min_n, the FIRST (leftmost) earlier
    occurrence of the last n tokens that has a continuation; the index after it, or -1."""
    total = tokens.shape[0]
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        for i in range(total - n):  # i + n < total: at least one token follows the occurrence
            j = 0
            while j < n and tokens[i + j] == tokens[total - n + j]:
                j += 1
            if j == n:
                return i + n
    return -1


@dataclass(frozen=True)
class HfProposer:
    """transformers' `PromptLookupCandidateGenerator.get_candidates`
    (src/transformers/generation/candidate_generator.py): for ngram_size from
    max_matching_ngram_size down to 1, slide over the whole input and take the FIRST window equal
    to the last ngram_size tokens that has a continuation; propose up to num_output_tokens tokens
    after it (fewer if the input ends first).

    Mapping: k -> num_output_tokens, window max -> max_matching_ngram_size, window min -> the
    smallest n tried (transformers always goes down to 1: `--window 1-2 --k 10` is its default).
    Not reproduced: the cut at the first eos inside the draft (kolibri stops at eos after
    verification; a draft crossing eos never changes the passes, only its drafted count) and the
    logits-processor check (no processors in greedy kolibri)."""

    k: int  # num_output_tokens
    window_min: int  # smallest n tried (transformers: 1)
    window_max: int  # max_matching_ngram_size

    name: ClassVar[str] = "hf"

    def __post_init__(self):
        validate_k(self.k)
        validate_window(self.window_min, self.window_max)

    def propose(self, context, max_tokens: int) -> list[int]:
        tokens = np.ascontiguousarray(context, dtype=np.int64)  # [T]
        start = _first_match_start(tokens, self.window_min, self.window_max)
        if start < 0 or max_tokens <= 0:
            return []
        return tokens[start : start + min(self.k, max_tokens)].tolist()

    def describe(self) -> str:
        return f"{self.name} num_output_tokens={self.k} ngram={format_window(self.window)}"

    @property
    def window(self) -> tuple[int, int]:
        return self.window_min, self.window_max


@njit(cache=True)
def _most_recent_start(tokens, n, m):  # tokens: int64[T] -> (start, length)
    """llama.cpp's `common_ngram_simple_draft`, in context indices: history = tokens[:T-1] and
    the sampled token tokens[T-1]; pattern = the last n tokens of the context. Needs T-1 > n+m+1;
    searches newest first from j = T-n-2 down to 1 (upstream: position 0 means "no match", and the
    occurrence ending just before the pattern is skipped); copies min(m, T-1-(j+n)) tokens, and
    nothing when that is fewer than n."""
    history = tokens.shape[0] - 1
    if history <= n + m + 1:
        return -1, 0
    pattern = tokens.shape[0] - n
    for j in range(history - n - 1, 0, -1):
        i = 0
        while i < n and tokens[j + i] == tokens[pattern + i]:
            i += 1
        if i == n:
            copy = min(m, history - (j + n))
            if copy < n:
                return -1, 0
            return j + n, copy
    return -1, 0


@dataclass(frozen=True)
class LlamaCppSimpleProposer:
    """llama.cpp's `ngram-simple` speculative type (common/ngram-map.cpp,
    `common_ngram_simple_draft`): a FIXED n-gram length n (size_n); the MOST RECENT earlier
    occurrence of the last n tokens; the m (size_m) tokens after it, fewer if the history ends
    first, nothing if fewer than n would be copied.

    Mapping: n = window max (`--window 3` sets n = 3), m = k. Upstream defaults n = 12, m = 48
    (with `--draft-max` capping the draft); the `check_rate` of older versions is taken as 1."""

    k: int  # size_m: tokens copied after the match
    window_min: int  # unused (the window max is the fixed n)
    window_max: int  # size_n

    name: ClassVar[str] = "llamacpp-simple"

    def __post_init__(self):
        validate_k(self.k)
        validate_window(self.window_min, self.window_max)

    def propose(self, context, max_tokens: int) -> list[int]:
        tokens = np.ascontiguousarray(context, dtype=np.int64)  # [T]
        start, length = _most_recent_start(tokens, self.window_max, self.k)
        if start < 0 or max_tokens <= 0:
            return []
        return tokens[start : start + min(length, max_tokens)].tolist()

    def describe(self) -> str:
        return f"{self.name} n={self.window_max} m={self.k}"


class SuffixProposer:
    """SuffixDecoding (Oliaro et al., arXiv 2411.04975) as implemented by Snowflake
    ArcticInference (arctic_inference/suffix_decoding/cache.py `SuffixDecodingCache.speculate`,
    csrc/suffix_decoding/suffix_tree.cc) and used by vLLM (vllm/v1/spec_decode/suffix_decoding.py):

    - a per-request suffix tree over prompt + output (depth `max_depth`, vLLM default 24);
    - with `cross_request`, also a global tree over every earlier request's output and the current
      output (ArcticInference adds responses to it as they are generated); the global draft wins
      only if its score is strictly higher;
    - pattern = the last `max_depth` context tokens; for each match length L, draft up to
      min(k, max_spec_factor * L + max_spec_offset) tokens along the most frequent children while
      the estimated probability (product of count ratios) stays >= min_token_prob; the draft with
      the highest score (sum of probabilities) wins, ties to the longer match.
    Defaults are vLLM's: factor 1.0, offset 0, min probability 0.1. The n-gram window is unused.

    A new request is recognised when the context is not the previous one grown by one verify pass
    (at most k + 1 tokens); its first call carries prompt + the first output token.
    """

    name: ClassVar[str] = "suffix"

    def __init__(self, k: int, window_min: int = 1, window_max: int = 1,
                 cross_request: bool = False, max_depth: int = 24, max_spec_factor: float = 1.0,
                 max_spec_offset: float = 0.0, min_token_prob: float = 0.1):
        self.k = validate_k(k)
        self.window_min, self.window_max = validate_window(window_min, window_max)
        self.cross_request = cross_request
        self.max_depth = max_depth
        self.max_spec_factor = max_spec_factor
        self.max_spec_offset = max_spec_offset
        self.min_token_prob = min_token_prob
        self._global = SuffixTrie(max_depth) if cross_request else None
        self._local = SuffixTrie(max_depth)
        self._seen = np.zeros(0, dtype=np.int64)  # [T] the context as last seen
        self._requests = 0

    def propose(self, context, max_tokens: int) -> list[int]:
        self._sync(context)
        pattern = self._seen[-self.max_depth :].tolist()
        args = (self.k, self.max_spec_factor, self.max_spec_offset, self.min_token_prob)
        draft = self._local.speculate(pattern, *args)
        if self._global is not None:
            other = self._global.speculate(pattern, *args)
            draft = other if other.score > draft.score else draft
        return draft.token_ids[: max(max_tokens, 0)]

    def observe(self, context, drafted: int, accepted: int) -> None:
        self._sync(context)

    def describe(self) -> str:
        cross = " cross-request" if self.cross_request else ""
        return (f"{self.name} k={self.k} depth={self.max_depth} factor={self.max_spec_factor:g} "
                f"min_prob={self.min_token_prob:g}{cross}")

    def _sync(self, context) -> None:
        """Add the tokens the context gained since the last call; start a new request if it is
        not the last context grown by one pass."""
        tokens = np.asarray(context, dtype=np.int64)  # [T]
        seen = len(self._seen)
        grown = seen and seen <= len(tokens) <= seen + self.k + 1
        if not (grown and np.array_equal(tokens[:seen], self._seen)):
            self._start(tokens)
            return
        new = tokens[seen:].tolist()
        self._local.extend(0, new)
        if self._global is not None:
            self._global.extend(self._requests, new)
        self._seen = tokens.copy()

    def _start(self, tokens: np.ndarray) -> None:
        self._requests += 1
        self._local = SuffixTrie(self.max_depth)
        self._local.extend(0, tokens.tolist())
        if self._global is not None:
            self._global.extend(self._requests, tokens[len(tokens) - 1 :].tolist())
        self._seen = tokens.copy()


DEFAULT_COST_SLOPE = 0.06  # c(n) = 1 + 0.06 (n - 1) when nothing was measured: c(6) = 1.30


def cost_model(costs: dict[int, float] | None) -> Callable[[int], float]:
    """c(n), the cost of an n-token forward relative to a 1-token forward, from measured costs
    (any unit; divided by costs[1]); n beyond the measured range extrapolates the last slope.
    Without measurements: the default model c(n) = 1 + DEFAULT_COST_SLOPE * (n - 1), between the
    speculative issue's target c(6) <= 1.25 and the numba prototype's measured 1.42."""
    if not costs:
        return lambda n: 1.0 + DEFAULT_COST_SLOPE * (n - 1)
    if 1 not in costs:
        raise KolibriError("costs need c(1), the 1-token forward; measure c(n) from n = 1")
    rel = {n: c / costs[1] for n, c in sorted(costs.items())}
    top = max(rel)
    below = max((n for n in rel if n < top), default=None)
    slope = DEFAULT_COST_SLOPE if below is None else (rel[top] - rel[below]) / (top - below)

    def c(n: int) -> float:
        return rel[n] if n in rel else rel[top] + slope * (n - top)

    return c


@dataclass
class AdaptiveProposer:
    """Cost-aware drafting (kolibri's own rule, issue 6): vLLM's match (longest n in the window,
    leftmost occurrence) gives up to k candidate tokens and the match length n; the proposer then
    drafts the prefix length L (0..k) that maximises the expected tokens per unit of cost of the
    pass,

        (1 + sum_{i<L} prod_{j<=i} p[n][j]) / c(1 + L),

    where p[n][j] is the running estimate of P(draft position j accepted | positions < j
    accepted) for matches of length n, a Beta(1, 1)-smoothed ratio over earlier passes whose
    evidence decays by `decay` at every new pass of n (the text changes: recent passes count
    more), and c is `cost_model(costs)` (measured c(n), or the documented default). L = 0 (a plain
    step) whenever no draft is expected to pay for itself; after `explore` such skipped matches of
    length n it drafts one token anyway, so a stale estimate cannot shut n off for good. Ties go
    to the shorter draft. (decay 0.9 and explore 8 were the best of a small grid on the shipped
    chat goldens — tuned on the data they are reported on.)

    `observe` learns only what both a simulation and a real run see: positions 0..a-1 accepted
    and, if a < drafted, position a rejected; positions after the first rejection are untested.
    Statistics persist across requests (they describe the model and the text, not one prompt).
    """

    k: int
    window_min: int
    window_max: int
    costs: dict[int, float] | None = None  # measured forward costs by token count (any unit)
    prior: tuple[float, float] = (1.0, 1.0)  # Beta prior (accepted, rejected) per position
    decay: float = 0.9  # weight of the older evidence for n at each new pass of n (recency)
    explore: int = 8  # after this many skipped matches of length n, draft 1 token to re-test
    name: ClassVar[str] = "adaptive"
    _tried: np.ndarray = field(init=False, repr=False)  # [window_max + 1, k] passes testing (n, j)
    _accepted: np.ndarray = field(init=False, repr=False)  # [window_max + 1, k] accepted (n, j)
    _last_n: int = field(init=False, default=0)  # match length of the last proposal (0: none)

    def __post_init__(self):
        validate_k(self.k)
        validate_window(self.window_min, self.window_max)
        self._cost = cost_model(self.costs)
        self._tried = np.zeros((self.window_max + 1, self.k))  # decayed counts
        self._accepted = np.zeros((self.window_max + 1, self.k))
        self._skipped = np.zeros(self.window_max + 1, dtype=np.int64)  # matches drafted 0 since

    def propose(self, context, max_tokens: int) -> list[int]:
        tokens = np.ascontiguousarray(context, dtype=np.int64)  # [T]
        start, n = _longest_match(tokens, self.window_min, self.window_max)
        self._last_n = n if start >= 0 else 0
        if start < 0:
            return []
        candidates = tokens[start : start + self.k]  # [<= k]
        length = self.best_length(n, len(candidates))
        self._skipped[n] = 0 if length else self._skipped[n] + 1
        if self._skipped[n] > self.explore:  # stale estimate: re-test with one token
            length, self._skipped[n] = 1, 0
        return candidates[: min(length, max(max_tokens, 0))].tolist()

    def acceptance(self, n: int) -> np.ndarray:  # -> float64[k]
        """Estimated P(position j accepted | positions < j accepted) for matches of length n."""
        a, b = self.prior
        return (self._accepted[n] + a) / (self._tried[n] + a + b)

    def best_length(self, n: int, limit: int) -> int:
        """The draft length in 0..limit with the most expected tokens per unit of cost."""
        expected = np.concatenate(([0.0], np.cumsum(np.cumprod(self.acceptance(n)[:limit]))))
        values = [(1.0 + expected[length]) / self._cost(1 + length) for length in range(limit + 1)]
        return int(np.argmax(values))  # first maximum: the shorter draft on ties

    def observe(self, context, drafted: int, accepted: int) -> None:
        if self._last_n == 0 or drafted == 0:
            return
        tested = min(drafted, accepted + 1)  # positions up to and including the first rejection
        self._tried[self._last_n] *= self.decay
        self._accepted[self._last_n] *= self.decay
        self._tried[self._last_n, :tested] += 1
        self._accepted[self._last_n, :accepted] += 1

    def describe(self) -> str:
        costs = "measured c(n)" if self.costs else f"c(n)=1+{DEFAULT_COST_SLOPE:g}(n-1)"
        return f"{self.name} k={self.k} window={format_window(self.window)} {costs}"

    @property
    def window(self) -> tuple[int, int]:
        return self.window_min, self.window_max


PROPOSERS = {
    "vllm": NgramProposer,
    "hf": HfProposer,
    "llamacpp-simple": LlamaCppSimpleProposer,
    "suffix": SuffixProposer,
    "adaptive": AdaptiveProposer,
}
ALIASES = {"ngram": "vllm"}


def canonical_proposer(name: str) -> str:
    """The proposer's canonical name ("ngram" -> "vllm"); unknown names are a KolibriError."""
    name = ALIASES.get(name, name)
    if name not in PROPOSERS:
        known = ", ".join([*PROPOSERS, *ALIASES])
        raise KolibriError(f"unknown proposer {name!r}; available: {known}")
    return name


def make_proposer(name: str, k: int, window: tuple[int, int],
                  costs: dict[int, float] | None = None, cross_request: bool = False) -> Proposer:
    """A fresh proposer called `name` with draft cap k and n-gram window (min, max); `costs` feeds
    `adaptive`, `cross_request` feeds `suffix` (others ignore them)."""
    name = canonical_proposer(name)
    if name == "suffix":
        return SuffixProposer(k, *window, cross_request=cross_request)
    if name == "adaptive":
        return AdaptiveProposer(k, *window, costs=costs)
    return PROPOSERS[name](k, window[0], window[1])


def validate_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
        raise KolibriError(f"k must be a whole number >= 1 (draft tokens per pass), got {k!r}")
    return k


def validate_window(window_min: int, window_max: int) -> tuple[int, int]:
    if not 1 <= window_min <= window_max:
        raise KolibriError(
            f"window {window_min}-{window_max} is invalid: use MIN-MAX with 1 <= MIN <= MAX"
        )
    return window_min, window_max


def parse_k(text: str | int) -> int:
    """Parse "5" -> 5; anything but a whole number >= 1 is a KolibriError."""
    if isinstance(text, int):
        return validate_k(text)
    try:
        return validate_k(int(str(text).strip()))
    except ValueError:
        raise KolibriError(f"k must be a whole number >= 1, got {text!r}") from None


def parse_window(text: str) -> tuple[int, int]:
    """Parse "1-4" -> (1, 4); "3" -> (3, 3). Invalid forms ("4-1", "0-3", "a-b", "") raise."""
    parts = str(text).strip().split("-")
    if len(parts) > 2 or not all(p.strip().isdigit() for p in parts):
        raise KolibriError(
            f"window {text!r} is invalid: use MIN-MAX (e.g. 1-4) or N (e.g. 3), 1 <= MIN <= MAX"
        )
    low, high = int(parts[0]), int(parts[-1])
    return validate_window(low, high)


def format_window(window: tuple[int, int]) -> str:
    return f"{window[0]}-{window[1]}"


def parse_k_list(text: str | int | list) -> list[int]:
    """Parse "1,2,3" or [1, 2, 3] or 5 -> a list of valid k, duplicates dropped, order kept."""
    items = text if isinstance(text, list) else str(text).split(",")
    return _unique([parse_k(item) for item in items])


def parse_window_list(text: str | list) -> list[tuple[int, int]]:
    """Parse "1-4,2-4" or ["1-4", "2-4"] -> [(1, 4), (2, 4)], duplicates dropped, order kept."""
    items = text if isinstance(text, list) else str(text).split(",")
    return _unique([parse_window(str(item)) for item in items])


def _unique(items: list) -> list:
    return list(dict.fromkeys(items))
