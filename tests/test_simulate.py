"""The probe simulation against hand-computed chains and an independent reference of the
Definitions, plus the cost model."""

import random

import pytest

from kolibri_cli.decode.proposers import NgramProposer, Proposer
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import Golden
from kolibri_cli.probe.answer import best
from kolibri_cli.probe.replay.shards import simulate, sweep
from kolibri_cli.probe.simulate import (
    ServerCounting,
    merge_counts,
    predicted_speedup,
    simulate_chain,
    spec_time,
)


def chain(prompt, output, k=3, window=(1, 4)):
    return simulate_chain(prompt, output, NgramProposer(k, *window), k)


def golden(gid, category, prompt, output) -> Golden:
    return Golden(gid, category, "p", True, prompt, output, "m", "0" * 64, {"engine": "test"})


def test_no_match_every_pass_is_a_plain_step():
    c = chain([1, 2, 3], [4, 5, 6, 7])
    assert (c.plain_steps, c.verify_passes, c.ratio) == (3, 3, 1.0)
    assert (c.drafts_proposed, c.drafts_accepted, c.passes_with_drafts) == (0, 0, 0)
    assert c.acceptance_rate is None and c.mean_acceptance_length is None
    assert c.drafted_at == [0, 0, 0] and c.accepted_per_position == [None, None, None]
    assert c.draft_lengths == [0, 0, 0]


def test_all_accepted_in_one_pass():
    # pos=1: context [5,1,2,3,4,5]; [5] occurred at 0 -> draft [1,2,3,4] (j = min(4, 6-1-1) = 4).
    c = chain([5, 1, 2, 3, 4], [5, 1, 2, 3, 4, 5], k=4)
    assert (c.plain_steps, c.verify_passes, c.ratio) == (5, 1, 5.0)
    assert (c.drafts_proposed, c.drafts_accepted, c.acceptance_rate) == (4, 4, 1.0)
    assert c.mean_acceptance_length == 5.0
    assert c.drafted_at == [1, 1, 1, 1] and c.accepted_at == [1, 1, 1, 1]


def test_budget_cap_never_drafts_past_the_chain():
    # Same chain, k=8: the proposer offers [1,2,3,4,5] but j = min(8, N - pos - 1) = 4.
    c = chain([5, 1, 2, 3, 4], [5, 1, 2, 3, 4, 5], k=8)
    assert c.draft_lengths == [4] and c.accepted_lengths == [4]
    assert c.drafted_at == [1, 1, 1, 1, 0, 0, 0, 0]
    assert c.accepted_per_position == [1.0, 1.0, 1.0, 1.0, None, None, None, None]


def test_match_cut_by_the_chain_end():
    # pos=1: [7] occurred at 0 -> [8,9,7], cut to j = min(3, 4-1-1) = 2 -> [8,9], both accepted.
    c = chain([7, 8, 9], [7, 8, 9, 7])
    assert (c.verify_passes, c.drafts_proposed, c.drafts_accepted) == (1, 2, 2)
    assert c.ratio == 3.0


def test_match_at_the_last_position_drafts_nothing():
    # pos=3 = N-1: context ends in 5, which occurred at 0, but j = 0: a plain step.
    c = chain([5, 6], [1, 2, 5, 6])
    assert c.draft_lengths == [0, 0, 0]
    assert (c.verify_passes, c.drafts_proposed) == (3, 0)


def test_first_draft_rejected():
    # pos=1: [1] occurred at 0 -> draft [2] (j=1); golden says 9: rejected; pos=2: j=0.
    c = chain([1, 2, 3], [1, 9, 9])
    assert (c.verify_passes, c.drafts_proposed, c.drafts_accepted) == (2, 1, 0)
    assert (c.ratio, c.acceptance_rate, c.mean_acceptance_length) == (1.0, 0.0, 1.0)
    assert c.drafted_at == [1, 0, 0] and c.accepted_at == [0, 0, 0]
    assert c.accepted_per_position == [0.0, None, None]


def test_mixed_chain_per_position_counts():
    # pos=1: [1]@0 -> [2,3,4] vs [2,3,9]: a=2 -> pos=4;  pos=4: [9] unseen -> [] -> pos=5;
    # pos=5: [1] leftmost @0 -> [2,3] (j=2; the rightmost would give [2,3,9]): a=2 -> pos=8.
    c = chain([1, 2, 3, 4, 5], [1, 2, 3, 9, 1, 2, 3, 4], k=3, window=(1, 2))
    assert c.draft_lengths == [3, 0, 2] and c.accepted_lengths == [2, 0, 2]
    assert (c.plain_steps, c.verify_passes) == (7, 3)
    assert c.ratio == pytest.approx(7 / 3)
    assert (c.drafts_proposed, c.drafts_accepted, c.passes_with_drafts) == (5, 4, 2)
    assert c.acceptance_rate == 0.8 and c.mean_acceptance_length == 3.0
    assert c.drafted_at == [2, 2, 1] and c.accepted_at == [2, 2, 0]
    assert c.accepted_per_position == [1.0, 1.0, 0.0]


def test_single_token_chain_has_no_steps():
    c = chain([1, 2], [3])
    assert (c.plain_steps, c.verify_passes, c.ratio) == (0, 0, None)


def test_simulate_totals_categories_and_sweep():
    goldens = [
        golden("a", "code", [1, 2, 3, 4, 5], [1, 2, 3, 9, 1, 2, 3, 4]),  # 7 steps, 3 passes
        golden("b", "qa", [1, 2, 3], [1, 9, 9]),  # 2 steps, 2 passes
        golden("c", "code", [1, 2, 3], [4, 5, 6, 7]),  # 3 steps, 3 passes
    ]
    run = simulate(goldens, 3, (1, 2))
    assert [g.id for g in run.goldens] == ["a", "b", "c"]
    assert (run.total.plain_steps, run.total.verify_passes) == (12, 8)
    assert run.total.ratio == 1.5
    assert (run.total.drafts_proposed, run.total.drafts_accepted) == (6, 4)
    assert run.total.drafted_at == [3, 2, 1] and run.total.accepted_at == [2, 2, 0]
    assert run.label == "k=3 window=1-2"
    cats = run.by_category()
    assert list(cats) == ["code", "qa"]
    assert (cats["code"].plain_steps, cats["code"].verify_passes) == (10, 6)
    assert (cats["qa"].plain_steps, cats["qa"].verify_passes) == (2, 2)

    runs = sweep(goldens, [1, 3], [(1, 2), (3, 3)])
    assert [(r.k, r.window) for r in runs] == [(1, (1, 2)), (1, (3, 3)), (3, (1, 2)), (3, (3, 3))]
    assert best(runs) is runs[2]  # the fastest under the default c(n): 1.44x
    assert runs[3].total.verify_passes == 12  # window 3-3: no 3-gram ever repeats


def test_merge_pads_position_lists():
    short, long = chain([1, 2, 3], [1, 9, 9], k=1), chain([5, 1, 2, 3, 4], [5, 1, 2, 3, 4, 5], k=4)
    total = merge_counts([short, long])
    assert total.drafted_at == [2, 1, 1, 1] and total.accepted_at == [1, 1, 1, 1]
    assert total.draft_lengths == []  # sums keep no per-pass lists (memory stays flat)...
    assert total.passes_by_draft_length() == [1, 1, 0, 0, 1]  # ...but passes by draft length


def reference_simulation(prompt, output, k, lo, hi):
    """The Definitions, written out literally with a brute-force proposer."""

    def propose(context, j):
        for n in range(hi, lo - 1, -1):
            for s in range(len(context) - n):
                if n < len(context) and context[s : s + n] == context[-n:]:
                    return context[s + n : s + n + j]
        return []

    n_out = len(output)
    passes = proposed = accepted = with_drafts = 0
    drafted_at, accepted_at = [0] * k, [0] * k
    pos = 1
    while pos < n_out:
        j = min(k, n_out - pos - 1)
        d = propose(prompt + output[:pos], j) if j > 0 else []
        a = 0
        while a < len(d) and d[a] == output[pos + a]:
            a += 1
        passes, proposed, accepted = passes + 1, proposed + len(d), accepted + a
        with_drafts += len(d) > 0
        for i in range(len(d)):
            drafted_at[i] += 1
        for i in range(a):
            accepted_at[i] += 1
        pos += a + 1
    return (n_out - 1, passes, proposed, accepted, with_drafts, drafted_at, accepted_at)


def test_agrees_with_reference_on_random_chains():
    rng = random.Random(11)
    for trial in range(300):
        vocab = rng.choice([2, 3, 5, 8, 20])
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
        output = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.5:  # copy a stretch of the prompt, as summaries and code edits do
            start = rng.randrange(len(prompt))
            output[rng.randrange(len(output)) :] = prompt[start : start + 15]
            output = output or [0]
        k, lo = rng.randint(1, 8), rng.randint(1, 4)
        hi = lo + rng.randint(0, 3)
        c = chain(prompt, output, k, (lo, hi))
        got = (c.plain_steps, c.verify_passes, c.drafts_proposed, c.drafts_accepted,
               c.passes_with_drafts, c.drafted_at, c.accepted_at)  # fmt: skip
        assert got == reference_simulation(prompt, output, k, lo, hi), trial


def test_cost_model():
    # The mixed chain: 7 plain steps; passes draft [3, 0, 2] -> forwards of 4, 1 and 3 tokens.
    costs = {1: 0.010, 3: 0.012, 4: 0.013}  # seconds per forward
    assert spec_time([3, 0, 2], costs, 0.0001) == pytest.approx(0.013 + 0.010 + 0.012 + 0.0003)
    assert predicted_speedup(7, [3, 0, 2], costs, 0.0001) == pytest.approx(0.07 / 0.0353)
    relative = {1: 1.0, 3: 1.2, 4: 1.3}  # c(n); the Definitions' formula without proposer time
    assert predicted_speedup(7, [3, 0, 2], relative, 0.0) == pytest.approx(2.0)
    assert predicted_speedup(0, [], relative, 0.0) is None
    with pytest.raises(KolibriError, match=r"n = \[6\]"):
        predicted_speedup(7, [5], relative, 0.0)


class _Oracle(Proposer):
    """Drafts the true continuation (which may run past the chain's end), up to k tokens."""

    name = "oracle"

    def __init__(self, truth: list[int], prompt_len: int, k: int):
        self.truth, self.prompt_len, self.k = truth, prompt_len, k

    def propose(self, context, max_tokens: int) -> list[int]:
        pos = len(context) - self.prompt_len
        return self.truth[pos : pos + min(self.k, max_tokens)]


@pytest.mark.parametrize("k, counting, expected", [
    (4, None, (2, 2)),  # the Definitions: drafts stop at the chain's end
    (3, ServerCounting(10, (2,)), (3, 3)),  # budget from the request; the eos as the last draft
    (4, ServerCounting(10, (2,)), (4, 2)),  # a drafted eos with more after it is not accepted
    (4, ServerCounting(4, (2,)), (2, 2)),  # a request cap at the chain's length changes nothing
])
def test_server_counting_at_the_chain_end(k, counting, expected):
    prompt, chain = [5, 6], [10, 11, 12, 2]  # the chain stops on eos (2)
    oracle = _Oracle(chain + [7, 7, 7], len(prompt), k)
    c = simulate_chain(prompt, chain, oracle, k, counting)
    assert (c.drafts_proposed, c.drafts_accepted) == expected
    assert c.verify_passes == 1 and c.plain_steps == 3
