"""Draft trees: the structure, the exact simulation of a tree pass (the longest accepted branch),
and the tree proposers (SGLang's NGRAM trie, SuffixDecoding's tree mode)."""

import pytest

from kolibri_cli.decode.proposers import (
    DraftTree,
    Proposer,
    SglangProposer,
    SuffixTreeProposer,
    make_proposer,
)
from kolibri_cli.decode.proposers.suffix_tree import SuffixTrie
from kolibri_cli.probe.simulate import simulate_chain

#        root
#       /    \
#     5(0)   7(1)
#     |   \     \
#   6(2)  8(3)  9(4)
#     |
#   1(5)
TREE = DraftTree((5, 7, 6, 8, 9, 1), (-1, -1, 0, 0, 1, 2))


def test_tree_structure():
    assert TREE.depths() == [1, 1, 2, 2, 2, 3] and TREE.depth() == 3 and len(TREE) == 6
    assert not TREE.is_chain() and DraftTree.chain([4, 5, 6]).is_chain()
    assert DraftTree.chain([4, 5, 6]).parents == (-1, 0, 1)
    cut = TREE.cut(2)
    assert cut == DraftTree((5, 7, 6, 8, 9), (-1, -1, 0, 0, 1))
    assert TREE.cut(0) == DraftTree((), ())
    assert TREE.first_branch() == [0, 2, 5]
    with pytest.raises(ValueError, match="does not come before it"):
        DraftTree((1, 2), (1, -1))


def test_accepted_path_follows_the_model():
    truth = {-1: 5, 0: 8, 3: 4}  # after the root 5, after node 0 token 8, after node 3 token 4
    assert TREE.accepted_path(truth.__getitem__) == [0, 3]
    assert TREE.accepted_path({-1: 7, 1: 9, 4: 0}.__getitem__) == [1, 4]
    assert TREE.accepted_path({-1: 3}.__getitem__) == []


class FixedTree(Proposer):
    """A tree proposer that always drafts TREE (cut to the budget)."""

    name, k, trees = "fixed", 6, True

    def propose_tree(self, context, max_depth):
        return TREE.cut(max_depth)

    def propose(self, context, max_tokens):
        return [TREE.tokens[i] for i in TREE.first_branch()][:max_tokens]


def test_simulation_takes_the_longest_accepted_branch():
    # golden 0, then 7 9 (branch 7-9 accepted), then the model says 3; the next pass drafts
    # the tree again: 5 6 1 accepted, then 2 (the bonus token); then one plain step to the end
    golden = [0, 7, 9, 3, 5, 6, 1, 2, 8]
    counts = simulate_chain([1, 2], golden, FixedTree(), 6)
    assert counts.accepted_lengths == [2, 3, 0]
    # every node is verified, whichever branch wins; the last pass has budget 0: no tree
    assert counts.draft_lengths == [6, 6, 0]
    assert (counts.verify_passes, counts.plain_steps) == (3, 8)


def test_sglang_trie_bfs_by_recency_and_across_requests():
    proposer = SglangProposer(4, 1, 3, min_breadth=1, max_breadth=3, prompt=True)
    proposer.begin([1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 5])
    tree = proposer.propose_tree([0, 0, 0, 1, 2], 4)
    # match [1, 2] (window 2, breadth (3-2)*2/3+1 = 1.67 -> 1: the most recent follower, 5),
    # and [2] (window 1, breadth 2.33 -> 2: 5 again (merged), then 4)...
    assert tree.tokens[0] == 5 and set(tree.tokens) >= {5, 4}
    assert len(tree) <= 4 and tree.depth() <= 4
    fresh = SglangProposer(4, 1, 3, prompt=False)
    fresh.begin([1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 5])
    assert len(fresh.propose_tree([0, 0, 0, 1, 2], 4)) == 0  # only the last 18 were inserted
    # a second request reuses what the first one inserted (the trie is shared)
    proposer.begin([7, 7])
    assert len(proposer.propose_tree([7, 7, 1, 2], 4)) > 0


def test_suffix_tree_mode_best_first():
    trie = SuffixTrie(8)
    trie.extend(0, [1, 2, 3, 1, 2, 3, 1, 2, 4, 1, 2])
    draft = trie.speculate([1, 2], 4, max_spec_factor=4.0, min_token_prob=0.1, tree=True)
    # after [1, 2]: 3 twice, 4 once (p 2/3, 1/3); after [1, 2, 3]: 1 (p 2/3 * 1)...
    assert draft.token_ids[:2] == [3, 1] and draft.parents[:2] == [-1, 0]
    assert 4 in draft.token_ids and draft.parents[draft.token_ids.index(4)] == -1
    assert draft.probs == sorted(draft.probs, reverse=True)
    path = trie.speculate([1, 2], 4, max_spec_factor=4.0, min_token_prob=0.1)
    assert path.parents == list(range(-1, len(path.token_ids) - 1))  # path mode is a chain


def test_tree_proposers_registered():
    for name in ("sglang", "suffix-tree"):
        proposer = make_proposer(name, 8, (1, 4))
        assert proposer.name == name and proposer.trees
    assert isinstance(make_proposer("suffix-tree", 8, (1, 4)), SuffixTreeProposer)


def test_adaptive_tree_learns_what_pays():
    """Early on (every estimate 1/2) it drafts a few nodes; after passes whose nodes were all
    rejected, no node is worth its cost any more."""
    from kolibri_cli.decode.proposers import AdaptiveTreeProposer

    proposer = AdaptiveTreeProposer(8, costs={1: 1.0, 2: 1.1, 3: 1.2, 4: 1.3})
    context = [1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]
    proposer.begin(context[:-2])
    first = proposer.propose_tree(context, 8)
    assert 0 < len(first) <= 8
    for _ in range(30):
        tree = proposer.propose_tree(context, 8)
        if not len(tree):
            break
        proposer.observe(context + [9], len(tree), 0)  # the model said 9: nothing accepted
    assert len(proposer.propose_tree(context, 8)) == 0
    assert proposer._tested.sum() > 0 and proposer._accepted.sum() == 0
