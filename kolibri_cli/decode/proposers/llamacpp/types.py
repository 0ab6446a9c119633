"""kolibri's face of llama.cpp's stateful n-gram types: `llamacpp-map-k`, `llamacpp-map-k4v`,
`llamacpp-mod`, `llamacpp-cache`.

Each follows llama-server's calling convention (tools/server/server-context.cpp with
common/speculative.cpp): `begin(prompt)` when a request starts; a draft only when the budget
allows at least one token (the server skips the call otherwise, so the state does not change);
the draft cut to the budget after it is made; `accept` only after a non-empty draft was verified.
One instance is one server slot (`-np 1`) for the server's whole life: state carries over from
request to request, as the probe replays goldens in order.
Mapping of kolibri's settings: k = m (the draft length cap), window max = n (the key length).
"""

from typing import ClassVar

import numpy as np

from kolibri_cli.decode.proposers.llamacpp import ngram_cache
from kolibri_cli.decode.proposers.llamacpp.ngram_map import NgramMap
from kolibri_cli.decode.proposers.llamacpp.ngram_mod import NgramModPool
from kolibri_cli.decode.proposers.protocol import Proposer
from kolibri_cli.decode.proposers.settings import LlamaCppOptions, validate_k, validate_window
from kolibri_cli.errors import KolibriError


class _ServerSlot(Proposer):
    """The calling convention shared by the four types; subclasses build `_state`."""

    name: ClassVar[str]
    # one server slot for the server's life: requests see what earlier ones left
    shares_state: ClassVar[bool] = True
    observes: ClassVar[bool] = True  # `accept` after a verified draft

    def __init__(self, k: int, window_min: int, window_max: int,
                 options: LlamaCppOptions | None = None):
        self.k = validate_k(k)
        self.window_min, self.window_max = validate_window(window_min, window_max)
        self.options = options or LlamaCppOptions()
        self._state = self._new_state()

    def propose(self, context, max_tokens: int) -> list[int]:
        if max_tokens <= 0:
            return []
        tokens = np.ascontiguousarray(context, dtype=np.int64)  # [T]: history + sampled
        return self._draft(tokens[:-1], int(tokens[-1]))[:max_tokens]

    def observe(self, context, drafted: int, accepted: int) -> None:
        if drafted > 0:
            self._state.accept(accepted)

    @property
    def window(self) -> tuple[int, int]:
        return self.window_min, self.window_max

    def server_args(self) -> tuple[str, ...]:
        """llama-server's flags for this type and these settings."""
        raise NotImplementedError


class LlamaCppMapKProposer(_ServerSlot):
    """llama.cpp's `ngram-map-k` (common/ngram-map.cpp, `common_ngram_map_draft` with
    key_only): the newest earlier occurrence of the last n tokens (through a hash of positions);
    the m tokens after it, capped by what this key got accepted last time (a key whose draft was
    rejected outright never drafts again). Upstream defaults n = 12, m = 48; its min-hits option
    has no effect on this type (as upstream)."""

    name: ClassVar[str] = "llamacpp-map-k"
    llama_server: ClassVar[str | None] = "ngram-map-k"
    key_only: ClassVar[bool] = True

    def _new_state(self):
        min_hits = self.options.min_hits or 1
        return NgramMap(self.window_max, self.k, self.key_only, min_hits)

    def begin(self, prompt_ids) -> None:
        self._state.begin([int(t) for t in prompt_ids])

    def _draft(self, history: np.ndarray, sampled: int) -> list[int]:
        return self._state.draft(history.tolist(), sampled)

    def propose_listed(self, ids: list[int], length: int, max_tokens: int) -> list[int]:
        """`propose` for the context ids[:length]: a replay lists its chain once instead of
        the context at every call."""
        if max_tokens <= 0:
            return []
        return self._state.draft(ids, ids[length - 1], length - 1)[:max_tokens]

    def server_args(self) -> tuple[str, ...]:
        kind = self.llama_server.removeprefix("ngram-")
        flags = ("--spec-type", self.llama_server, f"--spec-ngram-{kind}-size-n",
                 str(self.window_max), f"--spec-ngram-{kind}-size-m", str(self.k))
        hits = self.options.min_hits
        return flags + (() if hits is None else (f"--spec-ngram-{kind}-min-hits", str(hits)))


class LlamaCppMapK4vProposer(LlamaCppMapKProposer):
    """llama.cpp's `ngram-map-k4v` (common/ngram-map.cpp, `common_ngram_map_draft`): as
    ngram-map-k, but a key also keeps up to 4 m-grams seen after it with their counts; it drafts
    only once the key was hit min-hits times and its most frequent m-gram is at least twice as
    frequent as the others together (the draft is still the m tokens after the newest match).
    Upstream defaults n = 12, m = 48, min-hits 1."""

    name: ClassVar[str] = "llamacpp-map-k4v"
    llama_server: ClassVar[str | None] = "ngram-map-k4v"
    key_only: ClassVar[bool] = False


class LlamaCppModProposer(_ServerSlot):
    """llama.cpp's `ngram-mod` (common/ngram-mod.cpp; `common_speculative_impl_ngram_mod` in
    common/speculative.cpp), `--spec-default`'s type: a 4M-entry pool of n-gram hash -> next
    token shared by all requests; drafts chain lookups from the last n tokens, at most m, nothing
    if fewer than n-min; a streak of 5 drafts with under 25% accepted clears the pool.
    n = window max (n_match, upstream 24), m = k (n_max, upstream 64), n-min upstream 48."""

    name: ClassVar[str] = "llamacpp-mod"
    llama_server: ClassVar[str | None] = "ngram-mod"

    def _new_state(self):
        n_min = 48 if self.options.n_min is None else self.options.n_min
        return NgramModPool(self.window_max, n_min, self.k)

    def begin(self, prompt_ids) -> None:
        self._state.begin(np.asarray(prompt_ids, dtype=np.int64))

    def _draft(self, history: np.ndarray, sampled: int) -> list[int]:
        return self._state.draft(history, sampled)

    def server_args(self) -> tuple[str, ...]:
        return ("--spec-type", "ngram-mod", "--spec-ngram-mod-n-match", str(self.window_max),
                "--spec-ngram-mod-n-max", str(self.k), "--spec-ngram-mod-n-min",
                str(self._state.n_min))


class LlamaCppCacheProposer(_ServerSlot):
    """llama.cpp's `ngram-cache` (common/ngram-cache.cpp; `common_speculative_impl_ngram_cache`
    in common/speculative.cpp): next-token counts after 1..4-grams from the slot's context (lax
    thresholds), a dynamic cache file (strict) and a static cache file (the static counts after
    the last 2 tokens also weight the others); one token at a time, up to k (upstream fixed 8).
    The files are llama.cpp's format (`llama-lookup-create`, `llama-lookup-merge`; `--lookup-
    cache-static`, `--lookup-cache-dynamic`); like llama-server, neither is updated. The window is
    unused (n-grams of 1..4, fixed upstream)."""

    name: ClassVar[str] = "llamacpp-cache"
    llama_server: ClassVar[str | None] = "ngram-cache"

    def _new_state(self):
        static, dynamic = self.options.lookup_cache_static, self.options.lookup_cache_dynamic
        return ngram_cache.CacheSlot(
            self.k,
            static=ngram_cache.load(static) if static else None,
            dynamic=ngram_cache.load(dynamic) if dynamic else None,
        )

    def observe(self, context, drafted: int, accepted: int) -> None:
        """ngram-cache learns nothing from acceptance."""

    def _draft(self, history: np.ndarray, sampled: int) -> list[int]:
        return self._state.draft(history.tolist(), sampled)

    def server_args(self) -> tuple[str, ...]:
        if self.k != ngram_cache.N_DRAFT:
            raise KolibriError(f"llama-server's ngram-cache drafts {ngram_cache.N_DRAFT} tokens "
                               f"(fixed); k = {self.k} has no llama-server equivalent")
        files = {"--lookup-cache-static": self.options.lookup_cache_static,
                 "--lookup-cache-dynamic": self.options.lookup_cache_dynamic}
        extra = tuple(x for flag, path in files.items() if path for x in (flag, str(path)))
        return ("--spec-type", "ngram-cache", *extra)
