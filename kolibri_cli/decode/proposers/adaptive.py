"""Cost-aware drafting over vLLM's match: draft the length with the most expected tokens per
unit of verify cost."""

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from kolibri_cli.costs.model import cost_model
from kolibri_cli.decode.proposers.ngram import longest_match
from kolibri_cli.decode.proposers.protocol import CostsKind, Proposer
from kolibri_cli.decode.proposers.settings import validate_k, validate_window


@dataclass
class AdaptiveProposer(Proposer):
    """Cost-aware drafting: vLLM's match (longest n in the window,
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
    shares_state: ClassVar[bool] = True  # statistics carry over from request to request
    observes: ClassVar[bool] = True
    costs_kind: ClassVar[CostsKind] = "numbers"
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
        return self.propose_matched(tokens, max_tokens,
                                    longest_match(tokens, self.window_min, self.window_max))

    def propose_matched(self, tokens: np.ndarray, max_tokens: int, match) -> list[int]:
        """`propose` for the context `tokens` (int64[T]) given its longest_match (start, n):
        a replay that indexed the chain once need not search the context at every call."""
        start, n = int(match[0]), int(match[1])
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

    @property
    def window(self) -> tuple[int, int]:
        return self.window_min, self.window_max
