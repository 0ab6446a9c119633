"""Suffix decoding: a suffix tree over the request (and optionally earlier requests)."""

from typing import ClassVar

import numpy as np

from kolibri_cli.decode.proposers.protocol import Proposer
from kolibri_cli.decode.proposers.settings import validate_k, validate_window
from kolibri_cli.decode.proposers.suffix_tree import Draft, SuffixTrie
from kolibri_cli.decode.proposers.tree import DraftTree


class SuffixProposer(Proposer):
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
    observes: ClassVar[bool] = True  # the context it has seen grows with every pass

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
        return self._best_draft().token_ids[: max(max_tokens, 0)]

    def _best_draft(self, tree: bool = False) -> Draft:
        """The local tree's draft, or the global one's if it scores strictly higher."""
        pattern = self._seen[-self.max_depth :].tolist()
        args = (self.k, self.max_spec_factor, self.max_spec_offset, self.min_token_prob, tree)
        draft = self._local.speculate(pattern, *args)
        if self._global is not None:
            other = self._global.speculate(pattern, *args)
            draft = other if other.score > draft.score else draft
        return draft

    @property
    def shares_state(self) -> bool:
        """The global tree holds earlier requests' outputs; the per-request tree does not."""
        return self.cross_request

    def observe(self, context, drafted: int, accepted: int) -> None:
        self._sync(context)

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


class SuffixTreeProposer(SuffixProposer):
    """SuffixDecoding's tree speculation (ArcticInference `SuffixTree::_speculate_tree`,
    `use_tree_spec`): the same suffix trees and match-length choice as `suffix`, but each match
    drafts a tree — the up-to-k most probable continuations anywhere below the match, best
    first — so one pass verifies several candidates. k counts tree nodes."""

    name: ClassVar[str] = "suffix-tree"
    trees: ClassVar[bool] = True

    def propose_tree(self, context, max_depth: int) -> DraftTree:
        self._sync(context)
        draft = self._best_draft(tree=True)
        return DraftTree(tuple(draft.token_ids), tuple(draft.parents)).cut(max(max_depth, 0))

    def propose(self, context, max_tokens: int) -> list[int]:
        """The branch through every node's first (most probable) child, for chain callers."""
        tree = self.propose_tree(context, max_tokens)
        return [tree.tokens[i] for i in tree.first_branch()]
