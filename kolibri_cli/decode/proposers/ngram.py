"""vLLM's n-gram rule (`vllm`, the default) and transformers' prompt lookup (`hf`)."""

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numba import njit

from kolibri_cli.decode.proposers.protocol import Proposer
from kolibri_cli.decode.proposers.settings import validate_k, validate_window
from kolibri_cli.engine import jitcache  # noqa: F401  (before the @njit(cache=True))


@njit(cache=True)
def _continuation_start(tokens, min_n, max_n):  # tokens: int64[T] -> int
    """Index right after the LEFTMOST earlier occurrence of the longest matching suffix, or -1."""
    return longest_match(tokens, min_n, max_n)[0]


@njit(cache=True)
def longest_match(tokens, min_n, max_n):  # tokens: int64[T] -> (start, n)
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
class NgramProposer(Proposer):
    """vLLM's n-gram proposer (vllm/v1/spec_decode/ngram_proposer.py): find the longest n in
    [window_min, window_max] whose last-n-token suffix occurred earlier in the context, and
    propose the up-to-k tokens after its leftmost occurrence. Linear time per call."""

    k: int  # draft length cap
    window_min: int  # shortest n-gram that may match
    window_max: int  # longest n-gram tried

    name: ClassVar[str] = "vllm"
    shares_state: ClassVar[bool] = False  # drafts depend on this request alone

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


def warm_up() -> None:
    """Compile (a machine's first run) or load from numba's cache this module's kernels."""
    tokens = np.zeros(4, np.int64)
    longest_match(tokens, 1, 2)
    _continuation_start(tokens, 1, 2)
    _first_match_start(tokens, 1, 2)


@dataclass(frozen=True)
class HfProposer(Proposer):
    """transformers' `PromptLookupCandidateGenerator.get_candidates`
    (src/transformers/generation/candidate_generator.py): for ngram_size from
    max_matching_ngram_size down to 1, slide over the whole input and take the FIRST window equal
    to the last ngram_size tokens that has a continuation; propose up to num_output_tokens tokens
    after it (fewer if the input ends first), cut before the first eos token (an eos-only
    draft leaves nothing: that pass drafts nothing, no shorter n is tried).

    Mapping: k -> num_output_tokens, window max -> max_matching_ngram_size, window min -> the
    smallest n tried (transformers always goes down to 1: `--window 1-2 --k 10` is its default),
    eos_ids -> the generation config's eos_token_id. Not reproduced: the logits-processor check
    (no processors in greedy kolibri)."""

    k: int  # num_output_tokens
    window_min: int  # smallest n tried (transformers: 1)
    window_max: int  # max_matching_ngram_size
    eos_ids: tuple[int, ...] = ()  # the draft is cut before the first of these

    name: ClassVar[str] = "hf"
    shares_state: ClassVar[bool] = False  # drafts depend on this request alone

    def __post_init__(self):
        validate_k(self.k)
        validate_window(self.window_min, self.window_max)

    def propose(self, context, max_tokens: int) -> list[int]:
        tokens = np.ascontiguousarray(context, dtype=np.int64)  # [T]
        start = _first_match_start(tokens, self.window_min, self.window_max)
        if start < 0 or max_tokens <= 0:
            return []
        drafted = tokens[start : start + self.k].tolist()
        for i, t in enumerate(drafted):
            if t in self.eos_ids:
                drafted = drafted[:i]
                break
        return drafted[:max_tokens]

    @property
    def window(self) -> tuple[int, int]:
        return self.window_min, self.window_max
