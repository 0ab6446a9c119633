"""The generators: speculative output equals plain greedy output (the lossless law), and the
counts the speculative generator reports follow the probe's definitions."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import MODELS, prompts, tiny_model

from kolibri_cli.decode.generate import GenerationResult, VerifyPass, generate_plain, generate_spec
from kolibri_cli.decode.proposers import NgramProposer, Proposer
from kolibri_cli.probe.simulate import simulate_chain


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2), prompt=prompts, k=st.integers(1, 8),
       window=st.sampled_from([(1, 1), (1, 4), (2, 2), (2, 4), (3, 5), (5, 5)]),
       max_tokens=st.integers(1, 48))
def test_spec_equals_plain(seed, prompt, k, window, max_tokens):
    model = MODELS[seed]
    plain = generate_plain(model, prompt, max_tokens)
    spec = generate_spec(model, prompt, max_tokens, NgramProposer(k, *window))
    assert spec.output_ids == plain.output_ids
    assert len(spec.output_ids) <= max_tokens
    assert spec.forward_passes == 1 + len(spec.passes)


def test_drafts_do_get_accepted_on_tiny_models():
    """Guards the property test against vacuity: its models must actually accept drafts."""
    accepted = 0
    for model in MODELS.values():
        r = generate_spec(model, [5, 6, 7] * 6, 48, NgramProposer(5, 1, 4))
        accepted += r.spec_stats()["drafts_accepted"]
    assert accepted > 40


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2), prompt=prompts, k=st.integers(1, 8),
       window=st.sampled_from([(1, 4), (2, 2), (3, 5)]), max_tokens=st.integers(2, 40))
def test_spec_counts_equal_simulation_over_the_plain_chain(seed, prompt, k, window, max_tokens):
    """Acceptance is exact, so simulating over the model's own plain chain gives the real counts."""
    model = MODELS[seed]
    plain = generate_plain(model, prompt, max_tokens)
    spec = generate_spec(model, prompt, max_tokens, NgramProposer(k, *window))
    sim = simulate_chain(prompt, plain.output_ids, NgramProposer(k, *window), k)
    stats = spec.spec_stats()
    assert stats["verify_passes"] == sim.verify_passes
    assert stats["drafts_proposed"] == sim.drafts_proposed
    assert stats["drafts_accepted"] == sim.drafts_accepted


def test_eos_stops_generation_in_both_modes():
    model = tiny_model(1, eos=())
    chain = generate_plain(model, [3, 4, 5, 3, 4], 30).output_ids
    eos = chain[len(chain) // 2]  # make a token of the chain the eos: both must stop on it
    model = tiny_model(1, eos=(eos,))
    plain = generate_plain(model, [3, 4, 5, 3, 4], 30)
    spec = generate_spec(model, [3, 4, 5, 3, 4], 30, NgramProposer(5, 1, 4))
    assert plain.output_ids == spec.output_ids == chain[: chain.index(eos) + 1]


def test_drafts_never_run_past_the_budget():
    model = MODELS[0]
    for max_tokens in range(1, 12):
        r = generate_spec(model, [9, 8, 9, 8, 9, 8], max_tokens, NgramProposer(8, 1, 4))
        assert all(p.pos + p.drafted <= max_tokens - 1 for p in r.passes)


def test_counted_clips_drafts_past_the_final_token():
    r = GenerationResult([1], [5, 6, 7, 2], "", 0.0, 0.0, 3, mode="spec",
                         passes=[VerifyPass(1, 1, 0), VerifyPass(2, 5, 2)])
    # last output index 3: the second pass produces indices 2..; only 1 draft aimed before 3
    assert r.counted() == [(1, 0), (1, 1)]
    stats = r.spec_stats()
    assert (stats["drafts_proposed"], stats["drafts_accepted"]) == (2, 1)
    assert stats["accepted_per_position"] == [1]
    assert stats["drafted_per_position"] == [2]


def test_result_dtype_and_json_fields():
    model = MODELS[0]
    r = generate_spec(model, [1, 2, 3, 1, 2], 8, NgramProposer(3, 1, 2))
    d = r.to_dict("tiny")
    assert d["mode"] == "spec" and d["output_ids"] == r.output_ids
    assert set(d["stats"]) >= {"prompt_tokens", "new_tokens", "prefill_s", "decode_s",
                               "decode_tokens_per_s", "forward_passes", "verify_passes",
                               "drafts_proposed", "drafts_accepted", "acceptance_rate",
                               "accepted_per_position"}
    logits = model.transformer.forward([1, 2], 0, model.transformer.new_cache(8))
    assert logits.dtype == np.float32


@pytest.mark.parametrize("max_tokens", [1, 2])
def test_tiny_budgets(max_tokens):
    model = MODELS[2]
    plain = generate_plain(model, [4, 4, 4, 4], max_tokens)
    spec = generate_spec(model, [4, 4, 4, 4], max_tokens, NgramProposer(5, 1, 4))
    assert plain.output_ids == spec.output_ids and len(plain.output_ids) == max_tokens


# ---- sampled: speculative output still equals plain output ---------------------------------

from kolibri_cli.decode.generate import KVState  # noqa: E402
from kolibri_cli.decode.sampling import Sampling  # noqa: E402

sampled = st.builds(
    Sampling,
    temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5]),
    top_k=st.sampled_from([0, 3, 20]),
    top_p=st.sampled_from([1.0, 0.9, 0.6]),
    min_p=st.sampled_from([0.0, 0.1]),
    repetition_penalty=st.sampled_from([1.0, 1.2]),
    seed=st.integers(0, 2**64 - 1),
)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 3), prompt=prompts, k=st.integers(1, 8),
       window=st.sampled_from([(1, 1), (1, 4), (2, 4), (3, 5)]), max_tokens=st.integers(1, 48),
       sampling=sampled)
def test_sampled_spec_equals_plain(seed, prompt, k, window, max_tokens, sampling):
    model = MODELS[seed]
    plain = generate_plain(model, prompt, max_tokens, sampling=sampling)
    spec = generate_spec(model, prompt, max_tokens, NgramProposer(k, *window), sampling=sampling)
    assert spec.output_ids == plain.output_ids
    assert spec.stop_reason == plain.stop_reason
    sim = simulate_chain(prompt, plain.output_ids, NgramProposer(k, *window), k)
    stats = spec.spec_stats()
    assert (stats["verify_passes"], stats["drafts_accepted"]) == (sim.verify_passes,
                                                                  sim.drafts_accepted)


def test_sampled_drafts_do_get_accepted_and_seeds_matter():
    """Guards the sampled property test against vacuity: at T > 0 drafts are still accepted on
    the tiny models, and different seeds give different chains."""
    accepted, chains = 0, set()
    for seed in range(6):
        s = Sampling(temperature=0.7, seed=seed)
        r = generate_spec(MODELS[3], [5, 6, 7] * 6, 48, NgramProposer(5, 1, 4), sampling=s)
        accepted += r.spec_stats()["drafts_accepted"]
        chains.add(tuple(r.output_ids))
    assert accepted > 40
    assert len(chains) == 6


def test_one_seed_one_chain():
    s = Sampling(temperature=1.0, seed=11)
    a = generate_plain(MODELS[1], [3, 4, 5], 30, sampling=s).output_ids
    assert a == generate_plain(MODELS[1], [3, 4, 5], 30, sampling=s).output_ids
    assert a != generate_plain(MODELS[1], [3, 4, 5], 30, sampling=Sampling(1.0, seed=12)).output_ids


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 3), prompt=prompts, sampling=sampled, data=st.data())
def test_stop_strings_stop_both_generators_on_the_same_token(seed, prompt, sampling, data):
    model = MODELS[seed]
    free = generate_plain(model, prompt, 40, sampling=sampling)
    text = free.text  # the tiny tokenizer spells ids as "3 14 15"
    start = data.draw(st.integers(0, max(len(text) - 1, 0)))
    stop = text[start : start + data.draw(st.integers(1, 6))] or "x"
    plain = generate_plain(model, prompt, 40, sampling=sampling, stop=[stop, "never"])
    spec = generate_spec(model, prompt, 40, NgramProposer(4, 1, 3), sampling=sampling,
                         stop=[stop, "never"])
    assert spec.output_ids == plain.output_ids
    assert spec.text == plain.text and stop not in plain.text
    if stop in text:
        assert plain.stop_reason in ("stop", "eos")  # eos wins when one token completes both
        assert plain.output_ids == free.output_ids[: len(plain.output_ids)]
        assert stop in model.tokenizer.decode(plain.output_ids)
        assert stop not in model.tokenizer.decode(plain.output_ids[:-1])


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 3), turns=st.lists(prompts, min_size=1, max_size=4), sampling=sampled,
       spec=st.booleans())
def test_a_kept_cache_changes_nothing(seed, turns, sampling, spec):
    """A conversation that keeps its KV cache across turns (prefill only past the common
    prefix) produces the same ids as fresh generations over the whole conversation."""
    model = MODELS[seed]
    kv = KVState(model.transformer.new_cache(400))
    history: list[int] = []
    for turn in turns:
        history = history + turn
        fresh = generate_plain(model, history, 12, sampling=sampling)
        if spec:
            kept = generate_spec(model, history, 12, NgramProposer(3, 1, 3), sampling=sampling,
                                 kv=kv)
        else:
            kept = generate_plain(model, history, 12, sampling=sampling, kv=kv)
        assert kept.output_ids == fresh.output_ids
        assert kv.ids == history + kept.output_ids[:-1]
        history = history + kept.output_ids


class _FixedDraft(Proposer):
    """Drafts one fixed token on the first verify pass, nothing after."""

    name, k = "fixed", 1

    def __init__(self, token: int):
        self.token, self.used = token, False

    def propose(self, context, max_tokens):
        if self.used or max_tokens < 1:
            return []
        self.used = True
        return [self.token]


@pytest.mark.reference
def test_a_fixed_draft_is_accepted_with_its_probability():
    """Over many seeds, a one-hot draft d at the second position is accepted at rate p(d) — what
    vLLM's rejection sampler gives a one-hot draft (min(1, p(d) / 1)). The first token varies
    with the seed, so the expectation is the sum over seeds of p(d | prompt + first token)."""
    import torch
    from scipy.stats import norm

    model, prompt, seeds = tiny_model(0, eos=()), [5, 9, 14, 5, 9], 6_000
    tf, s = model.transformer, Sampling(temperature=1.0)
    first = generate_plain(model, prompt, 1).output_ids[0]
    d = int(np.argmax(tf.forward(prompt + [first], 0, tf.new_cache(8))[-1]))  # a likely draft
    p_d = {}
    accepted, expected, variance = 0, 0.0, 0.0
    for seed in range(seeds):
        r = generate_spec(model, prompt, 3, _FixedDraft(d), sampling=Sampling(1.0, seed=seed))
        first = r.output_ids[0]
        if first not in p_d:
            row = tf.forward(prompt + [first], 0, tf.new_cache(8))[-1]
            p_d[first] = float(torch.softmax(torch.tensor(row / s.temperature).double(), -1)[d])
        accepted += r.passes[0].accepted
        expected += p_d[first]
        variance += p_d[first] * (1 - p_d[first])
    z = (accepted - expected) / variance**0.5
    p_value = 2 * norm.sf(abs(z))
    print(f"accepted {accepted}, expected {expected:.1f}: z = {z:.2f}, p = {p_value:.3f}")
    assert expected > 150  # the draft has a real chance (p(d) around 3.5%)
    assert p_value > 1e-3


def _decoding_kernels():
    from kolibri_cli.decode import sampling
    from kolibri_cli.decode.proposers import ngram
    from kolibri_cli.decode.proposers.llamacpp import ngram_mod, simple

    return [ngram.longest_match, ngram._continuation_start, ngram._first_match_start,
            simple._most_recent_start, ngram_mod._add, ngram_mod._chain,
            sampling._gumbel_argmax]


@pytest.mark.parametrize("name", ["vllm", "hf", "guard", "adaptive", "llamacpp-simple",
                                  "llamacpp-mod"])
def test_no_decoding_kernel_compiles_inside_a_request(name):
    """Drafting and sampling kernels are compiled (or loaded) before a request's clock starts:
    a sampled speculative request adds no signature to them (on a machine's first run such a
    compile cost the first `generate --compare` ~0.45 s of its speculative time)."""
    from kolibri_cli.costs.model import CostTable
    from kolibri_cli.decode.proposers import default_settings, make_proposer, warm_up
    from kolibri_cli.decode.sampling import Sampler, Sampling

    sampled = Sampling(temperature=0.8, top_p=0.9, seed=3)
    warm_up()
    Sampler(sampled)
    before = [len(f.signatures) for f in _decoding_kernels()]
    assert all(before), before  # the warm-ups reached every kernel
    k, window = default_settings(name)
    proposer = make_proposer(name, k, window, CostTable() if name == "guard" else None)
    r = generate_spec(MODELS[1], [5, 6, 7] * 12, 40, proposer, sampling=sampled)
    assert len(r.passes) > 0
    assert [len(f.signatures) for f in _decoding_kernels()] == before
