"""llama.cpp's `ngram-simple`: stateless, the most recent earlier occurrence of a fixed n-gram."""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numba import njit

from kolibri_cli.decode.proposers.protocol import Proposer
from kolibri_cli.decode.proposers.settings import validate_k, validate_window
from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))


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


def warm_up() -> None:
    """Compile (a machine's first run) or load from numba's cache this module's kernel."""
    _most_recent_start(np.zeros(4, np.int64), 1, 2)


@dataclass(frozen=True)
class LlamaCppSimpleProposer(Proposer):
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
    llama_server: ClassVar[str | None] = "ngram-simple"
    shares_state: ClassVar[bool] = False  # drafts depend on this request alone

    def __post_init__(self):
        validate_k(self.k)
        validate_window(self.window_min, self.window_max)

    def propose(self, context, max_tokens: int) -> list[int]:
        tokens = np.ascontiguousarray(context, dtype=np.int64)  # [T]
        start, length = _most_recent_start(tokens, self.window_max, self.k)
        if start < 0 or max_tokens <= 0:
            return []
        return tokens[start : start + min(length, max_tokens)].tolist()

    def server_args(self) -> tuple[str, ...]:
        """llama-server's flags for this type and these settings."""
        return ("--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(self.window_max),
                "--spec-ngram-simple-size-m", str(self.k))
