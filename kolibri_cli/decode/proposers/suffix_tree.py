"""A depth-limited suffix trie with occurrence counts, and SuffixDecoding's draft rule over it.

Follows Snowflake ArcticInference's suffix decoding (csrc/suffix_decoding/suffix_tree.cc:
`SuffixTree::append`, `speculate`, `_match_context`, `_speculate_path`; Python side
arctic_inference/suffix_decoding/cache.py; vLLM's port vllm/v1/spec_decode/suffix_decoding.py).
Every suffix of every sequence is inserted up to `max_depth` tokens; a node's count is the number
of suffixes that pass through or end at it, i.e. the number of occurrences of the string it spells
(for strings up to `max_depth` long). Where ArcticInference compresses single-child chains into
one node, this trie keeps one node per token: along such a chain every count is equal, so the
estimated probabilities (child count / parent count) are the same.

Cost: appending a token touches at most `max_depth` nodes (one per live suffix); `speculate` is
O(max_depth^2) dictionary steps. Non-goals: removal and eviction of sequences.
"""

import heapq
import itertools
from dataclasses import dataclass, field


class Node:
    __slots__ = ("children", "count")

    def __init__(self):
        self.children: dict[int, Node] = {}  # token -> child, in insertion order
        self.count = 0  # suffixes passing through or ending at this node


@dataclass
class Draft:
    """One speculation: the tokens, their estimated probabilities, and how it was found."""

    token_ids: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)  # tree mode: parent index, -1 = the root
    probs: list[float] = field(default_factory=list)  # estimated P(token | pattern), per token
    score: float = 0.0  # sum of probs: the expected number of accepted tokens
    match_len: int = 0  # length of the context suffix the draft continues


class SuffixTrie:
    """Suffixes (up to `max_depth` tokens) of one or more sequences, with occurrence counts."""

    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = Node()
        self._live: dict[int, list[Node]] = {}  # seq id -> nodes of its suffixes still growing

    def extend(self, seq_id: int, tokens) -> None:
        for token in tokens:
            self.append(seq_id, int(token))

    def append(self, seq_id: int, token: int) -> None:
        """Add `token` to sequence `seq_id`: every live suffix of it grows by one node."""
        live = self._live.setdefault(seq_id, [])
        live.append(self.root)  # the suffix starting at this token
        self.root.count += 1
        if len(live) > self.max_depth:
            live.pop(0)  # that suffix already reached max_depth tokens
        for i, node in enumerate(live):
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = Node()
            child.count += 1
            live[i] = child

    def match(self, pattern) -> Node | None:
        """The node spelling `pattern`, or None if it never occurred (`_match_context`)."""
        node = self.root
        for token in pattern:
            node = node.children.get(int(token))
            if node is None:
                return None
        return node

    def speculate(self, pattern, max_spec_tokens: int, max_spec_factor: float = 1.0,
                  max_spec_offset: float = 0.0, min_token_prob: float = 0.1,
                  tree: bool = False) -> Draft:
        """ArcticInference's `speculate`: for every match length 1 .. len(pattern)-1 whose suffix
        of `pattern` occurs, draft up to min(max_spec_tokens, factor * match_len + offset) tokens
        — along the most frequent children (path mode), or best-first over all continuations
        (`tree`) — while the estimated probability stays >= min_token_prob; keep the draft with
        the highest score (ties: the longer match)."""
        grow = _speculate_tree if tree else _speculate_path
        best = Draft()
        for match_len in range(1, len(pattern)):
            node = self.match(pattern[len(pattern) - match_len :])
            if node is None:
                break  # a longer suffix cannot occur either
            cap = int(match_len * max_spec_factor + max_spec_offset + 1e-6)
            draft = grow(node, max(min(max_spec_tokens, cap), 0), min_token_prob)
            if draft.score >= best.score:
                best = draft
                best.match_len = match_len
        return best


def _speculate_path(node: Node, max_tokens: int, min_token_prob: float) -> Draft:
    """Follow the most frequent child (first inserted on ties) while the probability, the product
    of count(child) / count(parent) along the path, stays >= min_token_prob."""
    draft = Draft()
    prob = 1.0
    while len(draft.token_ids) < max_tokens:
        token, child = _most_frequent_child(node)
        if child is None:
            break
        prob *= child.count / node.count
        if prob < min_token_prob:
            break
        draft.parents.append(len(draft.token_ids) - 1)
        draft.token_ids.append(token)
        draft.probs.append(prob)
        draft.score += prob
        node = child
    return draft


def _speculate_tree(node: Node, max_tokens: int, min_token_prob: float) -> Draft:
    """ArcticInference's `_speculate_tree`: take the most probable continuation not yet taken,
    anywhere below `node` (a child's probability is its parent's times count(child) /
    count(parent)), until max_tokens nodes are taken or none reaches min_token_prob. Equal
    probabilities go to the earlier-queued node (the more frequent sibling first)."""
    draft, order = Draft(), itertools.count()
    heap: list[tuple[float, int, int, Node, int]] = []  # (-prob, order, token, node, parent)

    def push_children(parent_node: Node, prob: float, parent: int) -> None:
        for token, child in sorted(parent_node.children.items(), key=lambda tc: -tc[1].count):
            p = prob * child.count / parent_node.count
            if p < min_token_prob:
                break
            heapq.heappush(heap, (-p, next(order), token, child, parent))

    push_children(node, 1.0, -1)
    while heap and len(draft.token_ids) < max_tokens:
        neg, _, token, child, parent = heapq.heappop(heap)
        draft.parents.append(parent)
        draft.token_ids.append(token)
        draft.probs.append(-neg)
        draft.score += -neg
        push_children(child, -neg, len(draft.token_ids) - 1)
    return draft


def _most_frequent_child(node: Node) -> tuple[int, Node | None]:
    best_token, best = -1, None
    for token, child in node.children.items():
        if best is None or child.count > best.count:
            best_token, best = token, child
    return best_token, best
