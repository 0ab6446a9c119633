"""Cost-aware tree drafting over SuffixDecoding's trees: draft the nodes with the most expected
accepted tokens per unit of verify cost."""

from typing import ClassVar

import numpy as np

from kolibri_cli.costs.model import cost_model
from kolibri_cli.decode.proposers.protocol import CostsKind
from kolibri_cli.decode.proposers.suffix import SuffixProposer
from kolibri_cli.decode.proposers.tree import DraftTree

BINS = 5  # the suffix trie's estimate count(child) / count(parent), in fifths


class AdaptiveTreeProposer(SuffixProposer):
    """kolibri's cost-aware rule for trees. Candidates: SuffixDecoding's tree for the best match
    (`suffix-tree`, with room to grow: up to k nodes, 4 tokens per matched token, estimates down
    to 0.02). Each candidate node's chance of acceptance given its parent's is estimated from
    what earlier passes showed for nodes of the same trie estimate (fifths of count(child) /
    count(parent); Beta(1, 1)-smoothed), and a node's chance to be accepted at all, P, is the
    product along its path. The draft is the prefix of the candidates by descending P (a
    subtree: P never grows down a path) that maximises the expected tokens per unit of cost of
    the pass,

        (1 + sum of P over the nodes drafted) / c(1 + nodes),

    with c = `cost_model(costs)`; nothing when no node pays for itself. `observe` learns, for
    every node whose parent was accepted (or a child of the root), whether it was accepted —
    what a simulation and a real run both see. Statistics persist across requests."""

    name: ClassVar[str] = "adaptive-tree"
    trees: ClassVar[bool] = True
    costs_kind: ClassVar[CostsKind] = "numbers"

    def __init__(self, k: int, window_min: int = 1, window_max: int = 1,
                 costs: dict[int, float] | None = None, cross_request: bool = False,
                 max_spec_factor: float = 4.0, min_token_prob: float = 0.02):
        super().__init__(k, window_min, window_max, cross_request=cross_request,
                         max_spec_factor=max_spec_factor, min_token_prob=min_token_prob)
        self.costs = costs
        self._cost = cost_model(costs)
        self._tested = np.zeros(BINS)  # nodes tested per bin
        self._accepted = np.zeros(BINS)  # of those, accepted
        self._last: tuple[DraftTree, list[int], int] | None = None  # tree, bins, context length

    @property
    def shares_state(self) -> bool:
        """The acceptance statistics carry over from request to request (whatever the trees)."""
        return True

    def propose_tree(self, context, max_depth: int) -> DraftTree:
        self._sync(context)
        draft = self._best_draft(tree=True)
        full = DraftTree(tuple(draft.token_ids), tuple(draft.parents))
        depths = full.depths()
        bins = [_bin(p / (draft.probs[q] if q >= 0 else 1.0))
                for p, q in zip(draft.probs, draft.parents, strict=True)]
        chance = (self._accepted + 1.0) / (self._tested + 2.0)  # [BINS]
        p_all: list[float] = []
        for i, parent in enumerate(draft.parents):
            p_all.append(chance[bins[i]] * (p_all[parent] if parent >= 0 else 1.0))
        order = sorted((i for i in range(len(full)) if depths[i] <= max_depth),
                       key=lambda i: -p_all[i])  # stable: ties keep the tree's order
        keep = sorted(order[: self._best_size([p_all[i] for i in order])])
        tree = _subtree(full, keep)
        self._last = (tree, [bins[i] for i in keep], len(context))
        return tree

    def propose(self, context, max_tokens: int) -> list[int]:
        """The branch through every node's first child, for chain callers."""
        tree = self.propose_tree(context, max_tokens)
        return [tree.tokens[i] for i in tree.first_branch()]

    def _best_size(self, p_sorted: list[float]) -> int:
        """The number of nodes (0..len) with the most expected tokens per unit of cost."""
        expected = np.concatenate(([0.0], np.cumsum(p_sorted)))
        values = [(1.0 + expected[n]) / self._cost(1 + n) for n in range(len(p_sorted) + 1)]
        return int(np.argmax(values))  # first maximum: the smaller tree on ties

    def observe(self, context, drafted: int, accepted: int) -> None:
        self._sync(context)
        if self._last is None or drafted == 0:
            return
        tree, bins, before = self._last
        self._last = None
        produced = np.asarray(context)[before:]  # the accepted branch, then the model's token
        depths = tree.depths()
        path = set(tree.accepted_path(lambda node: _at(produced, 0 if node < 0 else
                                                       depths[node])))
        for i, parent in enumerate(tree.parents):
            if parent < 0 or parent in path:
                self._tested[bins[i]] += 1
                self._accepted[bins[i]] += i in path


def _bin(estimate: float) -> int:
    return min(int(estimate * BINS), BINS - 1)


def _at(tokens: np.ndarray, i: int) -> int:
    return int(tokens[i]) if i < len(tokens) else -1


def _subtree(tree: DraftTree, keep: list[int]) -> DraftTree:
    """The nodes `keep` (ascending; every kept node's parent kept too), renumbered."""
    index = {old: new for new, old in enumerate(keep)}
    return DraftTree(tuple(tree.tokens[i] for i in keep),
                     tuple(index[tree.parents[i]] if tree.parents[i] >= 0 else -1
                           for i in keep))
