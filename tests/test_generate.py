"""The generators: speculative output equals plain greedy output (the lossless law), and the
counts the speculative generator reports follow the probe's definitions."""


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import MODELS, prompts, tiny_model

from kolibri_cli.decode.generate import GenerationResult, VerifyPass, generate_plain, generate_spec
from kolibri_cli.decode.proposers import NgramProposer
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
