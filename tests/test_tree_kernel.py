"""Tree verification in the kernel: every row of a draft tree, verified in one forward call,
is bitwise the row a chain along its branch computes (logits and K/V), for random trees after
any prefix, with sliding windows too; the accepted branch's K/V moved into place leave the
cache exactly as a chain would; and the speculative generator with tree proposers emits plain
greedy's ids."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_kernel import ODD, TINY  # the kernel tests' shapes
from tiny_models import MODELS, assert_counts_as_simulated, prompts

from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import Proposer, make_proposer
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.weights import random_weights
from kolibri_cli.errors import KolibriError

WINDOWED = replace(TINY, sliding_window=6)


def random_tree(rng, n_nodes: int) -> list[int]:
    """parents of rows 0..n_nodes (row 0 the root, -1)."""
    return [-1] + [int(rng.integers(0, j)) for j in range(1, n_nodes + 1)]


def branch(parents: list[int], j: int) -> list[int]:
    rows = []
    while j > 0:
        rows.append(j)
        j = parents[j]
    return rows[::-1]


def tree_vs_chains(config, same, trials: int = 12, model=None):
    """Random trees after random prefixes: every row's logits and its branch's K/V against a
    chain along that branch; `same(a, b)` compares."""
    model = model or Transformer(config, random_weights(config, seed=21, scale=0.2))
    rng = np.random.default_rng(22)
    for trial in range(trials):
        start = int(rng.integers(0, 30))
        prefix = rng.integers(0, config.vocab_size, start + 1)  # the last one is the root
        parents = random_tree(rng, int(rng.integers(1, 14)))
        tokens = np.concatenate([prefix[-1:], rng.integers(0, config.vocab_size,
                                                           len(parents) - 1)])
        cache = model.new_cache(start + 40)
        if start:
            model.forward(prefix[:-1], 0, cache)
        tree = model.forward(tokens, start, cache, parents=parents)  # [1 + nodes, V]
        tree_k, tree_v = cache.k.copy(), cache.v.copy()
        for j in range(len(parents)):
            rows = branch(parents, j)
            chain = model.new_cache(start + 40)
            if start:
                model.forward(prefix[:-1], 0, chain)
            logits = model.forward([tokens[0], *tokens[rows]], start, chain)
            assert same(tree[j], logits[-1]), (trial, j)
            for depth, row in enumerate([0, *rows]):  # K/V of the branch's rows
                assert same(tree_k[:, :, start + row], chain.k[:, :, start + depth])
                assert same(tree_v[:, :, start + row], chain.v[:, :, start + depth])


@pytest.mark.bitwise
@pytest.mark.parametrize("config", [TINY, ODD, WINDOWED], ids=["tiny", "odd", "window"])
def test_tree_rows_are_bitwise_chain_rows(config):
    tree_vs_chains(config, np.array_equal)


@pytest.mark.bitwise
def test_tree_rows_are_bitwise_chain_rows_on_gguf_blocks(kolibri_home, tmp_path):
    """The same law on the block kernel's float32 path (the default model's Q4_1 blocks,
    decoded in registers; the int16 path's: test_int16)."""
    pytest.importorskip("gguf")
    from test_block_models import tiny_gguf

    from kolibri_cli.engine.model import load_model
    from kolibri_cli.store import cache

    tiny_gguf(tmp_path / "tiny.gguf", "Q4_1")
    name, folder = cache.import_gguf(tmp_path / "tiny.gguf")
    model = load_model(folder, name, numerics="float32")
    assert set(model.weights.storage()) == {"Q4_1"}
    tree_vs_chains(model.config, np.array_equal, trials=6, model=model.transformer)


@pytest.mark.parametrize("config", [ODD, WINDOWED], ids=["odd", "window"])
def test_tree_rows_are_the_chain_rows(config):
    """The same trees compared to float tolerance: what CI runs under numba's bounds checks,
    where a tree's row indices into the cache are checked."""
    tree_vs_chains(config, lambda a, b: np.allclose(a, b, rtol=1e-4, atol=1e-5), trials=4)


@pytest.mark.bitwise
def test_a_chain_given_as_a_tree_is_the_chain():
    model = Transformer(TINY, random_weights(TINY, seed=23, scale=0.2))
    ids = np.random.default_rng(24).integers(0, 256, 12)
    cache_a, cache_b = model.new_cache(20), model.new_cache(20)
    model.forward(ids[:5], 0, cache_a)
    model.forward(ids[:5], 0, cache_b)
    as_chain = model.forward(ids[5:12], 5, cache_a)
    as_tree = model.forward(ids[5:12], 5, cache_b, parents=[-1, 0, 1, 2, 3, 4, 5])
    assert np.array_equal(as_chain, as_tree) and np.array_equal(cache_a.k, cache_b.k)


@pytest.mark.bitwise
def test_keep_branch_leaves_the_chains_cache():
    """Accept a branch, move its rows into place, continue: logits equal plain decoding."""
    model = Transformer(TINY, random_weights(TINY, seed=25, scale=0.2))
    ids = np.random.default_rng(26).integers(0, 256, 16)
    plain = model.forward(ids, 0, model.new_cache(20))
    cache = model.new_cache(24)
    model.forward(ids[:8], 0, cache)
    # root ids[8]; rows: 1 = wrong, 2 = ids[9] (parent root), 3 = wrong, 4 = ids[10] under 2
    parents = [-1, 0, 0, 2, 2]
    model.forward([ids[8], 7, ids[9], 7, ids[10]], 8, cache, parents=parents)
    cache.keep_branch(8, [2, 4])
    assert cache.length == 11
    assert np.array_equal(model.forward(ids[11:16], 11, cache), plain[11:16])


def test_bad_parents_are_kolibri_errors():
    model = Transformer(TINY, random_weights(TINY, seed=27, scale=0.2))
    for parents in ([0, 0], [-1, 1], [-1, 0, 3], [-1]):
        with pytest.raises(KolibriError, match="a tree's parents"):
            model.forward([1, 2, 3][: max(len(parents), 2)], 0, model.new_cache(8), parents)


TREES = ["sglang", "suffix-tree", "adaptive-tree"]


@pytest.mark.bitwise
@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2), prompt=prompts, name=st.sampled_from(TREES),
       k=st.integers(1, 12), max_tokens=st.integers(1, 40))
def test_spec_with_trees_equals_plain(seed, prompt, name, k, max_tokens):
    model = MODELS[seed]
    plain = generate_plain(model, prompt, max_tokens)
    spec = generate_spec(model, prompt, max_tokens, make_proposer(name, k, (1, 4)))
    assert spec.output_ids == plain.output_ids


@pytest.mark.bitwise
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2), batch=st.lists(prompts, min_size=1, max_size=3),
       name=st.sampled_from(TREES), k=st.integers(1, 12), max_tokens=st.integers(2, 40))
def test_tree_counts_in_real_runs_equal_the_simulation(seed, batch, name, k, max_tokens):
    model = MODELS[seed]
    real, simulated = make_proposer(name, k, (1, 4)), make_proposer(name, k, (1, 4))
    assert_counts_as_simulated(model, batch, max_tokens, real, simulated, k)


class SecondChild(Proposer):
    """Knows the model's chain; drafts a tree whose first child of the root is wrong and whose
    second child starts the right branch (2 deep)."""

    name, k, trees = "second-child", 3, True

    def __init__(self, prompt, chain):
        self.ids = list(prompt) + list(chain)

    def propose_tree(self, context, max_depth):
        from kolibri_cli.decode.proposers import DraftTree

        nxt = self.ids[len(context) : len(context) + 2]
        if len(nxt) < 2 or max_depth < 2:
            return DraftTree((), ())
        return DraftTree(((nxt[0] + 1) % 64, nxt[0], nxt[1]), (-1, -1, 1))

    def propose(self, context, max_tokens):
        return []


@pytest.mark.bitwise
def test_off_the_first_branch_is_accepted_and_moved_into_place():
    model = MODELS[1]
    prompt = [3, 9, 4, 1]
    plain = generate_plain(model, prompt, 30)
    spec = generate_spec(model, prompt, 30, SecondChild(prompt, plain.output_ids))
    assert spec.output_ids == plain.output_ids
    trees = [p for p in spec.passes if p.drafted]
    assert len(trees) >= 8 and all((p.drafted, p.accepted) == (3, 2) for p in trees)


def test_probe_measures_a_tree_proposer_at_its_defaults(kolibri_home, monkeypatch,
                                                         tiny_llama_folder, tmp_path):
    """probe --measure with no --k/--window: each proposer at its own defaults, and a tree
    proposer's real run gives the simulated counts over the model's own chain."""
    import json

    from crafted import write_goldens
    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    goldens = write_goldens(tmp_path / "g.jsonl")
    result = CliRunner().invoke(app, ["probe", "--goldens", str(goldens), "--measure", "--model",
                                      str(tiny_llama_folder()), "--allow-model-mismatch",
                                      "--proposer", "adaptive-tree,suffix", "--json"])
    assert result.exit_code == 0, result.output
    runs = json.loads(result.stdout)["runs"]
    assert [(r["proposer"], r["k"]) for r in runs] == [("adaptive-tree", 16), ("suffix", 5)]
    for r in runs:
        assert r["measured"]["spec_equals_plain"] and r["measured"]["counts_match_simulation"]
