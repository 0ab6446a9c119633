"""The proposer zoo: each rule on hand-built sequences, the suffix trie's counts, the
adaptive proposer's cost-aware choice, the lossless law for every proposer, and stateful
proposers seeing the same history in a real run as in the simulation."""

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import MODELS, assert_counts_as_simulated, prompts, tiny_model
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.costs.model import GUESSED_COSTS, cost_model
from kolibri_cli.decode.generate import generate_plain, generate_spec
from kolibri_cli.decode.proposers import (
    AdaptiveProposer,
    HfProposer,
    LlamaCppSimpleProposer,
    NgramProposer,
    Proposer,
    SuffixProposer,
    canonical_proposer,
    make_proposer,
)
from kolibri_cli.decode.proposers.suffix_tree import SuffixTrie
from kolibri_cli.errors import KolibriError
from kolibri_cli.probe.simulate import simulate_chain

# ---- hf: transformers' prompt lookup --------------------------------------------------------


def test_hf_first_match_of_the_longest_n():
    context = [7, 8, 1, 2, 7, 8, 3, 4, 7, 8]
    assert HfProposer(2, 1, 2).propose(context, 10) == [1, 2]  # leftmost [7, 8]
    # no earlier [2, 3]: falls back to n = 1, first [3] at 0 -> what follows it
    assert HfProposer(5, 1, 2).propose([3, 1, 2, 3], 10) == [1, 2, 3]
    assert HfProposer(5, 2, 2).propose([3, 1, 2, 3], 10) == []  # window min 2: nothing
    assert HfProposer(5, 1, 2).propose([3, 1, 2, 3], 2) == [1, 2]  # the budget cuts
    assert HfProposer(5, 1, 2).propose([1, 1, 1], 10) == [1]  # overlap with the suffix is fine
    assert HfProposer(5, 1, 2).propose([4], 10) == []


def test_hf_equals_vllm_at_equal_settings():
    rng = np.random.default_rng(0)
    for _ in range(300):
        context = rng.integers(0, 4, size=int(rng.integers(1, 40))).tolist()
        assert HfProposer(4, 1, 3).propose(context, 4) == NgramProposer(4, 1, 3).propose(context, 4)


# ---- llamacpp-simple -------------------------------------------------------------------------


def test_llamacpp_most_recent_occurrence():
    context = [7, 8, 1, 2, 7, 8, 3, 4, 5, 6, 7, 8]
    assert LlamaCppSimpleProposer(2, 2, 2).propose(context, 10) == [3, 4]  # newest [7, 8]
    assert NgramProposer(2, 2, 2).propose(context, 10) == [1, 2]  # vLLM: the oldest


def test_llamacpp_upstream_edge_rules():
    # history [1]*6 + sampled 1: the occurrence ending right before the pattern is skipped, and
    # the copy stops at the history's end (never copies the sampled token)
    assert LlamaCppSimpleProposer(2, 1, 1).propose([1] * 7, 10) == [1]
    assert LlamaCppSimpleProposer(2, 1, 1).propose([1, 2, 1], 10) == []  # needs T-1 > n+m+1
    # position 0 is "no match" upstream: the 9 at index 0 is never found
    assert LlamaCppSimpleProposer(1, 1, 1).propose([9, 5, 6, 7, 8, 9], 10) == []
    assert NgramProposer(1, 1, 1).propose([9, 5, 6, 7, 8, 9], 10) == [5]
    # a match whose copy would be shorter than n gives nothing
    assert LlamaCppSimpleProposer(2, 2, 2).propose([1, 2, 3, 4, 5, 6, 7, 8, 7, 8], 10) == []


# ---- suffix ----------------------------------------------------------------------------------


def test_suffix_trie_counts_and_depth():
    trie = SuffixTrie(24)
    trie.extend(0, [1, 2, 1, 2, 3])
    assert trie.root.count == 5
    assert trie.match([1, 2]).count == 2 and trie.match([2]).count == 2
    assert trie.match([1, 2, 3]).count == 1 and trie.match([3, 1]) is None
    shallow = SuffixTrie(2)
    shallow.extend(0, [1, 2, 3])
    assert shallow.match([1, 2]).count == 1 and shallow.match([1, 2, 3]) is None


def test_suffix_speculate_score_and_match_length():
    trie = SuffixTrie(24)
    seq = [1, 2, 3, 1, 2, 4, 1, 2]
    trie.extend(0, seq)
    # [2] and [1, 2] occur 3 times (the last one is the tail itself): children 3 and 4 once
    # each -> 1/3. match 1 allows 1 token ([3], score 1/3); match 2 allows 2 ([3, 1], 2/3);
    # longer matches are the tail only: score 0.
    draft = trie.speculate(seq, 5)
    assert (draft.token_ids, draft.match_len) == ([3, 1], 2)
    assert draft.probs == pytest.approx([1 / 3, 1 / 3]) and draft.score == pytest.approx(2 / 3)
    assert trie.speculate(seq, 5, min_token_prob=0.5).token_ids == []
    assert trie.speculate(seq, 5, max_spec_factor=0.5).token_ids == [3]  # cap = int(0.5 * 2)
    assert SuffixProposer(5).propose(seq, 10) == [3, 1]
    assert SuffixProposer(5).propose(seq, 1) == [3]


def chain_golden_pair():
    return ([10, 11], [20, 21, 22, 23]), ([12], [20, 21, 22, 23])


def test_suffix_cross_request_uses_earlier_outputs():
    (pa, ga), (pb, gb) = chain_golden_pair()
    for cross, passes in ((False, 3), (True, 2)):
        proposer = SuffixProposer(3, cross_request=cross)
        simulate_chain(pa, ga, proposer, 3)
        counts = simulate_chain(pb, gb, proposer, 3)
        # cross: [20] occurred in A's output (followed by 21) and now: P(21) = 1/2 -> drafted
        assert counts.verify_passes == passes
        assert counts.drafts_accepted == (1 if cross else 0)


# ---- adaptive --------------------------------------------------------------------------------


def test_cost_model_default_and_measured():
    assert cost_model(None)(6) == pytest.approx(1.30)
    c = cost_model({1: 0.02, 2: 0.022, 3: 0.024})  # seconds: relative 1, 1.1, 1.2
    assert [c(n) for n in (1, 2, 3, 5)] == pytest.approx([1.0, 1.1, 1.2, 1.4])
    with pytest.raises(KolibriError, match="c\\(1\\)"):
        cost_model({2: 1.1})


def test_adaptive_drafts_the_length_worth_its_cost():
    context = [1, 2, 3, 4, 5, 6, 1]
    # prior 1/2 per position: expected tokens 1.5, 1.75, 1.875, 1.9375 for L = 1..4 over
    # c = 1.06, 1.12, 1.18, 1.24 -> L = 3 is the best (1.589 per unit of cost)
    assert AdaptiveProposer(5, 1, 4).propose(context, 10) == [2, 3, 4]
    assert AdaptiveProposer(5, 1, 4).propose(context, 2) == [2, 3]  # the budget still cuts
    # verify twice as dear as a step: no draft pays (1.5 / 2 < 1)
    assert AdaptiveProposer(5, 1, 4, costs={1: 1.0, 2: 2.0}).propose(context, 10) == []


def test_adaptive_stops_drafting_and_retests():
    context = [1, 2, 3, 4, 5, 6, 1]
    proposer = AdaptiveProposer(5, 1, 4, costs={1: 1.0, 2: 1.2})  # c(2) = 1.2, c(3) = 1.4
    drafted = []
    for _ in range(14):
        draft = proposer.propose(context, 10)
        drafted.append(len(draft))
        proposer.observe(context, len(draft), 0)  # always rejected
    # evidence after t rejections, decayed by 0.9: 1, 1.9, 2.71, 3.439 -> p0 = 1 / (w + 2)
    # drops below 0.2 (1 + p0 < c(2)) after 4; the 9th skipped match re-tests one token
    assert drafted == [1, 1, 1, 1] + [0] * 8 + [1, 0]
    assert proposer._tried[1, 0] == pytest.approx(0.9 * 3.439 + 1)
    assert proposer._tried[1, 1] == 0  # never tested past a rejection


def test_adaptive_observe_counts_up_to_the_first_rejection():
    proposer = AdaptiveProposer(5, 1, 4)
    proposer.propose([1, 2, 3, 4, 5, 6, 1], 10)
    proposer.observe([1, 2, 3, 4, 5, 6, 1, 2, 9], 5, 1)
    assert proposer._tried[1].tolist() == [1, 1, 0, 0, 0]
    assert proposer._accepted[1].tolist() == [1, 0, 0, 0, 0]
    assert proposer.acceptance(1).tolist() == pytest.approx([2 / 3, 1 / 3, 0.5, 0.5, 0.5])


# ---- names -----------------------------------------------------------------------------------


def test_names_aliases_and_protocols():
    assert canonical_proposer("ngram") == "vllm"
    for name in ("vllm", "hf", "llamacpp-simple", "suffix", "adaptive"):
        proposer = make_proposer(name, 5, (1, 4))
        assert isinstance(proposer, Proposer) and proposer.name == name
        assert proposer.observes == (name in ("suffix", "adaptive"))
    assert make_proposer("suffix", 5, (1, 4), cross_request=True).cross_request
    with pytest.raises(KolibriError, match="unknown proposer 'eagle'; available: vllm, hf"):
        make_proposer("eagle", 5, (1, 4))


# ---- the lossless law and simulation == real run, on tiny random models ---------------------

NAMES = ["vllm", "hf", "llamacpp-simple", "suffix", "suffix+cross", "adaptive"]
# llama.cpp's stateful types: their own cross-request test is in test_llamacpp_types.py
SERVER_STATE = ["llamacpp-map-k", "llamacpp-map-k4v", "llamacpp-mod", "llamacpp-cache"]


def build(name: str, k: int, window: tuple[int, int]):
    return make_proposer(name.split("+")[0], k, window, cross_request=name.endswith("+cross"))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2), prompt=prompts, name=st.sampled_from(NAMES + SERVER_STATE),
       k=st.integers(1, 8),
       window=st.sampled_from([(1, 1), (1, 4), (2, 2), (3, 5)]), max_tokens=st.integers(1, 40))
def test_spec_equals_plain_for_every_proposer(seed, prompt, name, k, window, max_tokens):
    model = MODELS[seed]
    plain = generate_plain(model, prompt, max_tokens)
    spec = generate_spec(model, prompt, max_tokens, build(name, k, window))
    assert spec.output_ids == plain.output_ids


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2), batch=st.lists(prompts, min_size=1, max_size=4),
       name=st.sampled_from(NAMES), k=st.integers(1, 8), max_tokens=st.integers(2, 40))
def test_stateful_proposers_count_the_same_in_simulation_and_real_runs(
    seed, batch, name, k, max_tokens
):
    """One proposer instance over several prompts in a row (as the probe does): the real spec
    run's counts equal the simulation's over the plain chain, prompt after prompt."""
    model = MODELS[seed]
    real, simulated = build(name, k, (1, 4)), build(name, k, (1, 4))
    assert_counts_as_simulated(model, batch, max_tokens, real, simulated, k)


class Recorder(Proposer):
    """vLLM's rule, recording what `observe` is told."""

    name, observes = "recorder", True

    def __init__(self):
        self.inner, self.calls = NgramProposer(8, 1, 4), []

    def propose(self, context, max_tokens):
        return self.inner.propose(context, max_tokens)

    def observe(self, context, drafted, accepted):
        # what a proposer can learn: the context, and the outcome up to the first rejection
        self.calls.append((tuple(int(t) for t in context), min(drafted, accepted + 1), accepted))


@pytest.mark.parametrize("eos_at", [None, 5, 11])
def test_observe_hook_sees_what_the_simulation_sees(eos_at):
    prompt = [5, 6, 7] * 6
    chain = generate_plain(tiny_model(1, eos=()), prompt, 30).output_ids
    eos = () if eos_at is None else (chain[eos_at],)
    model = tiny_model(1, eos=eos)
    plain = generate_plain(model, prompt, 30)
    real, simulated = Recorder(), Recorder()
    generate_spec(model, prompt, 30, real)
    simulate_chain(prompt, plain.output_ids, simulated, 8)
    assert real.calls == simulated.calls and len(real.calls) > 0
    assert real.calls[-1][0] == tuple(prompt + plain.output_ids)


# ---- the probe's comparison ------------------------------------------------------------------


@pytest.fixture
def goldens(tmp_path):
    path = tmp_path / "g.jsonl"
    chains = [("mix", "code", [1, 2, 3, 4, 5], [1, 2, 3, 9, 1, 2, 3, 4]),
              ("rej", "qa", [1, 2, 3], [1, 9, 9])]
    lines = [{"id": gid, "category": cat, "prompt": "p", "chat": True, "prompt_ids": p,
              "output_ids": g, "model": "m", "model_sha256": "0" * 64, "reference": {}}
             for gid, cat, p, g in chains]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def probe(*args):
    return CliRunner().invoke(app, ["probe", *map(str, args)])


def test_probe_compares_proposers(goldens, tmp_path, kolibri_home):
    md = tmp_path / "r.md"
    result = probe("--goldens", goldens, "--k", "3", "--window", "1-2", "--proposer",
                   "ngram,hf,llamacpp-simple,suffix,adaptive", "--markdown", md, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    names = ["vllm", "hf", "llamacpp-simple", "suffix", "adaptive"]
    assert doc["config"]["proposers"] == names and doc["config"]["proposer"] == "vllm"
    assert [r["proposer"] for r in doc["runs"]] == names
    assert [c["proposer"] for c in doc["comparison"]] == names
    vllm = doc["comparison"][0]
    assert (vllm["ratio"], vllm["k"], vllm["window"]) == (1.8, 3, [1, 2])
    # no bench stored, the guessed c(n): drafts [3, 0, 2] and [1, 0] -> c(4) + c(1) + c(3) +
    # c(2) + c(1)
    assert doc["pricing"]["source"] == "guess"
    c = cost_model(GUESSED_COSTS)
    assert vllm["modelled_speedup"] == pytest.approx(9 / (c(4) + c(3) + c(2) + 2))
    assert set(vllm["categories"]) == {"code", "qa"} and vllm["measured_speedup"] is None
    text = md.read_text()
    assert "## Proposers compared" in text and "--proposer ngram,hf" not in text
    assert "--proposer vllm,hf,llamacpp-simple,suffix,adaptive" in text
    shown = re.escape(f"{vllm['modelled_speedup']:.2f}x")
    assert re.search(rf"\| vllm( ★)? \| 3 \| 1-2 \| {shown} \| [^|]+ \| 1\.80x \| 66\.7% "
                     r"\| 2\.33 \|", text)


def test_probe_tables_and_options(goldens):
    result = probe("--goldens", goldens, "--proposer", "vllm,suffix", "--cross-request",
                   "--costs", "1,1.1,1.2", "--by-category")
    assert result.exit_code == 0, result.stderr
    assert "proposers compared" in result.stdout
    assert "per category: predicted speedup" in result.stdout
    bad = probe("--goldens", goldens, "--costs", "1,0")
    assert (bad.exit_code, bad.stdout) == (1, "")
    assert "costs must be finite positive numbers" in bad.stderr


# ---- hf: transformers' own candidate generator is the reference -------------------------------


@pytest.mark.reference
@settings(max_examples=300, deadline=None)
@given(tokens=st.lists(st.integers(0, 5), min_size=2, max_size=40), k=st.integers(1, 8),
       n=st.integers(1, 4), eos=st.sampled_from([(), (0,), (0, 3)]))
def test_hf_equals_transformers_prompt_lookup(tokens, k, n, eos):
    """HfProposer drafts exactly what PromptLookupCandidateGenerator.get_candidates proposes,
    including the cut before the first eos (on chat prompts eos occurs in the prompt)."""
    import torch
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    reference = PromptLookupCandidateGenerator(
        eos_token_id=torch.tensor(eos) if eos else None, num_output_tokens=k,
        max_matching_ngram_size=n, max_length=10_000)
    ids = torch.tensor([tokens])
    candidates, _ = reference.get_candidates(ids)
    expected = candidates[0, len(tokens):].tolist()
    assert make_proposer("hf", k, (1, n), eos_ids=eos).propose(tokens, k) == expected


def test_hf_cuts_drafts_before_eos():
    chat = [1, 7, 8, 2, 9, 1, 7]  # "<s> a b </s> c <s> a": the match continues into eos 2
    assert HfProposer(5, 1, 2).propose(chat, 5) == [8, 2, 9, 1, 7]
    assert HfProposer(5, 1, 2, eos_ids=(2,)).propose(chat, 5) == [8]
    assert HfProposer(5, 1, 2, eos_ids=(8,)).propose(chat, 5) == []  # no fallback to n = 1


class OverDrafter(Proposer):
    """A broken proposer: ignores its budget."""

    name, k = "over", 4

    def propose(self, context, max_tokens):
        return [1] * (max_tokens + 1)


def test_a_proposer_over_its_budget_fails_in_simulation_and_generation():
    model = MODELS[0]
    prompt = [3, 4, 5, 3, 4]
    chain = generate_plain(model, prompt, 8).output_ids
    with pytest.raises(KolibriError, match="drafted 4 tokens with a budget of 3"):
        simulate_chain(prompt, chain, OverDrafter(), 3)
    with pytest.raises(KolibriError, match="'over' drafted"):
        generate_spec(model, prompt, 8, OverDrafter())


# ---- state across requests: what the sharded probe relies on ---------------------------------


@pytest.mark.parametrize(("name", "cross_request", "shares"), [
    ("vllm", False, False), ("hf", False, False), ("llamacpp-simple", False, False),
    ("suffix", False, False), ("suffix", True, True), ("suffix-tree", False, False),
    ("adaptive", False, True), ("adaptive-tree", False, True), ("sglang", False, True),
    ("llamacpp-map-k", False, True), ("llamacpp-map-k4v", False, True),
    ("llamacpp-mod", False, True), ("llamacpp-cache", False, True),
])
def test_shares_state_says_whether_earlier_requests_change_the_drafts(name, cross_request,
                                                                       shares):
    """The sharder spreads chains over workers only for proposers that declare no state across
    requests: each declaration is checked by replaying the chat goldens through one instance and
    through a fresh one per golden (the same counts exactly when nothing is shared)."""
    from kolibri_cli.decode.proposers import default_settings
    from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens

    goldens = load_goldens(DEFAULT_CHAT)
    # ngram-mod at its defaults (n-gram 24) never drafts on these short chats
    k, window = (8, (4, 4)) if name == "llamacpp-mod" else default_settings(name)
    new = lambda: make_proposer(name, k, window, cross_request=cross_request)  # noqa: E731
    one = new()
    assert one.shares_state is shares
    counts = [(simulate_chain(g.prompt_ids, g.output_ids, one, k),
               simulate_chain(g.prompt_ids, g.output_ids, new(), k)) for g in goldens]
    same = all(a.draft_lengths == b.draft_lengths and a.accepted_lengths == b.accepted_lengths
               for a, b in counts)
    assert same is not shares
