"""Draft trees: several candidate continuations verified in one pass.

A tree is its nodes in an order where every parent comes before its children: `tokens[i]` and
`parents[i]` (the index of the parent node, -1 for a child of the root — the last committed
token). A chain d1..dk is the tree with parents -1, 0, 1, ..., k-2. Verification walks from the
root: at each node the model's argmax picks the child carrying that token, if there is one; the
accepted branch is the path walked, and its length is what a chain's accepted prefix would be.
Non-goals: the kernel's tree attention (engine), sampling (greedy acceptance only).
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]  # [T] node tokens, parents before children
    parents: tuple[int, ...]  # [T] parent node index, -1 = the root

    def __post_init__(self):
        if len(self.tokens) != len(self.parents):
            raise ValueError("a draft tree needs one parent per token")
        for i, p in enumerate(self.parents):
            if not -1 <= p < i:
                raise ValueError(f"node {i}'s parent {p} does not come before it")

    def __len__(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens) -> "DraftTree":
        tokens = tuple(int(t) for t in tokens)
        return cls(tokens, tuple(range(-1, len(tokens) - 1)))

    def depths(self) -> list[int]:
        """Depth of every node (a child of the root has depth 1)."""
        depth: list[int] = []
        for p in self.parents:
            depth.append(1 if p < 0 else depth[p] + 1)
        return depth

    def depth(self) -> int:
        return max(self.depths(), default=0)

    def is_chain(self) -> bool:
        return self.parents == tuple(range(-1, len(self.tokens) - 1))

    def cut(self, max_depth: int) -> "DraftTree":
        """Drop the nodes deeper than `max_depth` (a pass's budget); order is kept."""
        keep = [i for i, d in enumerate(self.depths()) if d <= max_depth]
        index = {old: new for new, old in enumerate(keep)}
        return DraftTree(tuple(self.tokens[i] for i in keep),
                         tuple(index.get(self.parents[i], -1) for i in keep))

    def first(self, n: int) -> "DraftTree":
        """The first n nodes (a tree too: parents come first)."""
        return self if n >= len(self) else DraftTree(self.tokens[:n], self.parents[:n])

    def first_branch(self) -> list[int]:
        """Node indices along every node's first child, from the root."""
        path, node = [], -1
        for i, p in enumerate(self.parents):
            if p == node:
                path.append(i)
                node = i
        return path

    def accepted_path(self, next_token) -> list[int]:
        """Node indices of the accepted branch; `next_token(node)` is the model's token after
        `node` (-1: after the root)."""
        children: dict[int, dict[int, int]] = {}
        for i, (t, p) in enumerate(zip(self.tokens, self.parents, strict=True)):
            children.setdefault(p, {}).setdefault(t, i)  # the first node wins a repeated token
        path, node = [], -1
        while (node := children.get(node, {}).get(int(next_token(node)))) is not None:
            path.append(node)
        return path
