"""SGLang's NGRAM speculative method: a trie of recent token sequences shared by all requests,
drafting a tree by breadth-first search from the longest matching suffixes."""

from collections import deque
from typing import ClassVar

import numpy as np

from kolibri_cli.decode.proposers.protocol import Proposer
from kolibri_cli.decode.proposers.settings import validate_k, validate_window
from kolibri_cli.decode.proposers.tree import DraftTree


class TrieNode:
    __slots__ = ("children", "recent")

    def __init__(self):
        self.children: dict[int, TrieNode] = {}  # token -> child
        self.recent: list[int] = []  # child tokens, most recently inserted or touched LAST


class RecentTrie:
    """SGLang's lookahead trie (python/sglang/srt/speculative/cpp_lookahead/lookahead.cpp,
    `Lookahead::insert`): each insert adds the sequences of up to `branch_length` tokens that
    start at every position of a window; a node keeps its children in recency order (the child
    inserted or walked through last comes first). Non-goals: the capacity and LRU eviction
    (10M nodes upstream: never reached here)."""

    def __init__(self, branch_length: int = 18, min_window: int = 1):
        self.branch_length, self.min_window = branch_length, min_window
        self.root = TrieNode()

    def insert(self, tokens: list[int]) -> None:
        for i in range(len(tokens) - self.min_window):
            node = self.root
            for token in tokens[i : i + self.branch_length]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = TrieNode()
                else:
                    node.recent.remove(token)
                node.recent.append(token)
                node = child

    def match(self, tokens: list[int], min_window: int, max_window: int):
        """(node, window) for every window size, longest first, whose last `window` tokens
        spell a path from the root (`Lookahead::match`)."""
        found = []
        for window in range(min(len(tokens), max_window), min_window - 1, -1):
            node = self.root
            for token in tokens[len(tokens) - window :]:
                node = node.children.get(token)
                if node is None:
                    break
            if node is not None:
                found.append((node, window))
        return found


class SglangProposer(Proposer):
    """SGLang's NGRAM method (PR #9873; `Lookahead::matchBFS`, NGRAMWorker): after every step
    the last `branch_length` tokens of prompt + output go into a trie shared by all requests
    (with `prompt`, the whole prompt too, at a request's start); a draft matches the last 1..12
    tokens (window max) in the trie and, from the longest match down, walks breadth-first taking
    each node's most recent children — up to `breadth` of them, starting at
    (max_window - match_len) * scale + min_breadth and narrowing by `scale` per level, scale =
    (max_breadth - min_breadth) / (max_window - min_window + 1) — merging equal tokens under one
    parent, until k nodes. Upstream defaults: window 1-12, breadth 1-10, branch length 18."""

    name: ClassVar[str] = "sglang"
    trees: ClassVar[bool] = True
    shares_state: ClassVar[bool] = True  # one trie for all requests

    def __init__(self, k: int, window_min: int = 1, window_max: int = 12,
                 min_breadth: int = 1, max_breadth: int = 10, branch_length: int = 18,
                 prompt: bool = True):
        self.k = validate_k(k)
        self.window_min, self.window_max = validate_window(window_min, window_max)
        self.min_breadth, self.max_breadth = min_breadth, max_breadth
        self.branch_length = max(branch_length, window_max + 1)
        self.prompt = prompt
        self.trie = RecentTrie(self.branch_length, window_min)
        self._last_len = 0  # context length at the last insert

    def begin(self, prompt_ids) -> None:
        self._last_len = 0
        if self.prompt:
            self.trie.insert([int(t) for t in prompt_ids])

    def propose_tree(self, context, max_depth: int) -> DraftTree:
        # the last branch_length tokens are all an insert or a match (windows < branch_length)
        # reads: the whole context as a list each step made a long chain quadratic
        tokens = np.asarray(context[-self.branch_length :], dtype=np.int64).tolist()
        if len(context) != self._last_len:  # one insert per step, as upstream's update
            self.trie.insert(tokens)
            self._last_len = len(context)
        return self._bfs(tokens).cut(max(max_depth, 0))

    def propose(self, context, max_tokens: int) -> list[int]:
        """The branch through every node's first child, for chain callers."""
        tree = self.propose_tree(context, max_tokens)
        return [tree.tokens[i] for i in tree.first_branch()]

    def _bfs(self, tokens: list[int]) -> DraftTree:
        scale = (self.max_breadth - self.min_breadth) / (
            self.window_max - self.window_min + 1)
        out_tokens, parents, index = [], [], {}  # index: (parent, token) -> node
        for trie_node, depth in self.trie.match(tokens, self.window_min, self.window_max):
            start = (self.window_max - depth) * scale + self.min_breadth
            queue = deque([(-1, start, trie_node)])
            while queue and len(out_tokens) < self.k:
                parent, breadth, node = queue.popleft()
                for token in list(reversed(node.recent))[: max(1, int(breadth))]:
                    if len(out_tokens) >= self.k:
                        break
                    pos = index.get((parent, token))
                    if pos is None:
                        pos = index[(parent, token)] = len(out_tokens)
                        out_tokens.append(token)
                        parents.append(parent)
                    queue.append((pos, breadth - scale, node.children[token]))
        return _bfs_order(out_tokens, parents)

    @property
    def window(self) -> tuple[int, int]:
        return self.window_min, self.window_max


def _bfs_order(tokens: list[int], parents: list[int]) -> DraftTree:
    """Nodes were numbered as created (a parent always first); keep that order."""
    return DraftTree(tuple(tokens), tuple(parents))
