"""The n-gram proposer against hand-worked cases and a straightforward O(n * window) reference."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kolibri_cli.decode.proposers import (
    NgramProposer,
    Proposer,
    make_proposer,
    parse_k,
    parse_k_list,
    parse_window,
    parse_window_list,
)
from kolibri_cli.errors import KolibriError


def reference_propose(context: list[int], k: int, lo: int, hi: int, max_tokens: int) -> list[int]:
    """The definition, literally: longest n first, leftmost earlier occurrence, no self-match."""
    budget = min(k, max_tokens)
    if budget <= 0:
        return []
    total = len(context)
    for n in range(hi, lo - 1, -1):
        if n >= total:
            continue
        suffix = context[total - n :]
        for start in range(0, total - n):  # an occurrence ending at start + n - 1 <= total - 2
            if context[start : start + n] == suffix:
                return context[start + n : start + n + budget]
    return []


def test_leftmost_occurrence_wins_over_rightmost():
    # [7, 8] occurs at 0 (followed by 1, 2) and at 4 (followed by 3, 4); leftmost -> [1, 2].
    context = [7, 8, 1, 2, 7, 8, 3, 4, 7, 8]
    assert NgramProposer(2, 2, 2).propose(context, 10) == [1, 2]


def test_longest_n_wins_over_earlier_shorter_match():
    # suffix [5, 6, 7]: the 1-gram [7] occurs first at 0, but the 3-gram [5, 6, 7] at 3..5.
    context = [7, 9, 9, 5, 6, 7, 1, 2, 5, 6, 7]
    assert NgramProposer(2, 1, 3).propose(context, 10) == [1, 2]
    assert NgramProposer(2, 1, 1).propose(context, 10) == [9, 9]


def test_window_bounds():
    context = [1, 2, 3, 9, 2, 3]  # only the 2-gram [2, 3] (and the 1-gram [3]) match earlier
    assert NgramProposer(3, 3, 4).propose(context, 10) == []  # n >= 3 required: nothing
    assert NgramProposer(3, 2, 4).propose(context, 10) == [9, 2, 3]
    assert NgramProposer(3, 1, 1).propose(context, 10) == [9, 2, 3]
    # window_max caps n: with max 1 the 1-gram [3] is used even though [2, 3] also matches.
    assert NgramProposer(3, 1, 1).propose([4, 3, 5, 2, 3], 10) == [5, 2, 3]
    assert NgramProposer(3, 2, 2).propose([4, 3, 5, 2, 3], 10) == []


def test_no_self_match():
    assert NgramProposer(5, 1, 4).propose([1, 2, 3, 4], 10) == []  # all distinct: no match
    assert NgramProposer(5, 1, 4).propose([4], 10) == []
    assert NgramProposer(5, 1, 4).propose([], 10) == []
    # [1, 1, 1]: the 2-gram [1, 1] at 0..1 ends before the final position: it counts.
    assert NgramProposer(5, 1, 4).propose([1, 1, 1], 10) == [1]


def test_budget_cap():
    context = [1, 2, 3, 4, 5, 6, 1]
    proposer = NgramProposer(4, 1, 3)
    assert proposer.propose(context, 10) == [2, 3, 4, 5]  # k caps
    assert proposer.propose(context, 2) == [2, 3]  # max_tokens caps
    assert proposer.propose(context, 0) == []
    assert proposer.propose(context, -1) == []


def test_fewer_tokens_when_the_context_ends():
    # [3] last occurred earlier at index 2; only 2 tokens follow it before the end.
    assert NgramProposer(5, 1, 4).propose([1, 2, 3, 3], 10) == [3]
    assert NgramProposer(5, 1, 4).propose([8, 9, 8, 9], 10) == [8, 9]


def test_accepts_lists_and_int_arrays():
    context = [7, 8, 1, 2, 7, 8]
    proposer = NgramProposer(2, 1, 4)
    for form in (context, np.array(context, dtype=np.int32), np.array(context, dtype=np.int64)):
        assert proposer.propose(form, 5) == [1, 2]
    assert proposer.propose(np.array(context)[:5], 5) == [8, 1]  # a view, as the simulation passes


def test_alias_and_protocol():
    proposer = make_proposer("ngram", 5, (1, 4))  # "ngram" is an alias of "vllm"
    assert isinstance(proposer, Proposer)
    assert proposer.name == "vllm"
    with pytest.raises(KolibriError, match="unknown proposer 'eagle'"):
        make_proposer("eagle", 5, (1, 4))


@settings(max_examples=600, deadline=None)
@given(
    context=st.lists(st.integers(0, 3), max_size=60)
    | st.lists(st.integers(0, 1), max_size=40)
    | st.lists(st.integers(0, 30), max_size=80),
    k=st.integers(1, 8),
    lo=st.integers(1, 5),
    extra=st.integers(0, 4),
    max_tokens=st.integers(0, 10),
)
def test_agrees_with_reference(context, k, lo, extra, max_tokens):
    hi = lo + extra
    got = NgramProposer(k, lo, hi).propose(context, max_tokens)
    assert got == reference_propose(context, k, lo, hi, max_tokens)


def test_agrees_with_reference_on_long_repetitive_contexts():
    rng = np.random.default_rng(7)
    for trial in range(200):
        vocab = int(rng.integers(2, 12))
        context = rng.integers(0, vocab, size=int(rng.integers(1, 400))).tolist()
        lo = int(rng.integers(1, 6))
        hi = lo + int(rng.integers(0, 6))
        k = int(rng.integers(1, 9))
        assert NgramProposer(k, lo, hi).propose(context, k) == reference_propose(
            context, k, lo, hi, k
        ), (trial, vocab, lo, hi, k)


@pytest.mark.parametrize(
    ("text", "expected"), [("1-4", (1, 4)), ("3", (3, 3)), (" 2-5 ", (2, 5)), ("5-5", (5, 5))]
)
def test_parse_window(text, expected):
    assert parse_window(text) == expected


@pytest.mark.parametrize("text", ["4-1", "0-3", "a-b", "", "0", "1-", "-3", "1-2-3", "1.5-2"])
def test_parse_window_rejects(text):
    with pytest.raises(KolibriError, match="window"):
        parse_window(text)


@pytest.mark.parametrize("value", [0, -1, "0", "x", "", True, 2.5])
def test_k_rejects(value):
    with pytest.raises(KolibriError, match="k must be"):
        parse_k(value)


def test_constructor_validates():
    with pytest.raises(KolibriError, match="k must be"):
        NgramProposer(0, 1, 4)
    with pytest.raises(KolibriError, match="window 4-1"):
        NgramProposer(5, 4, 1)
    with pytest.raises(KolibriError, match="window 0-3"):
        NgramProposer(5, 0, 3)


def test_sweep_lists():
    assert parse_k_list("1,2,3,5,8") == [1, 2, 3, 5, 8]
    assert parse_k_list([5, 5, 3]) == [5, 3]
    assert parse_k_list(5) == [5]
    assert parse_window_list("1-4,2-4,3-5,5-5") == [(1, 4), (2, 4), (3, 5), (5, 5)]
    assert parse_window_list(["3", "1-4"]) == [(3, 3), (1, 4)]
    with pytest.raises(KolibriError):
        parse_k_list("1,,2")
