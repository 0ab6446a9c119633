"""Sampling keyed by position: the Philox generator against its published answers, the fast
Gumbel-max choice against the naive one, the filters against transformers' warpers, and the
sampled distribution against softmax(filtered logits / T) (chi-square over 20,000 seeds)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import MODELS

from kolibri_cli.decode.philox import philox4x32, words
from kolibri_cli.decode.sampling import (
    GREEDY,
    Sampler,
    Sampling,
    choose,
    filtered,
    gumbel_noise,
    penalized,
    perturbed,
)
from kolibri_cli.errors import KolibriError

# Random123's known-answer vectors for Philox4x32-10: (counter, key, output)
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize("counter,key,expected", PHILOX_KAT)
def test_philox_known_answers(counter, key, expected):
    args = [np.uint64(v) for v in (*counter, *key)]
    assert tuple(int(w) for w in philox4x32(*args)) == expected


def test_words_are_keyed_by_seed_and_position_only():
    a = words(7, 100, 1000)
    assert a.dtype == np.uint32 and a.shape == (1000,)
    assert np.array_equal(a, words(7, 100, 1000))
    assert np.array_equal(a[:37], words(7, 100, 37))  # a token's word ignores the vocab size
    assert not np.array_equal(a, words(7, 101, 1000))
    assert not np.array_equal(a, words(8, 100, 1000))
    # position lives in the counter's upper words: positions do not shift each other's streams
    assert not np.isin(words(7, 101, 1000)[:996], a).mean() > 0.01


def test_gumbel_noise_is_standard_gumbel():
    g = np.concatenate([gumbel_noise(3, t, 4096) for t in range(25)])  # 102,400 draws
    assert g.dtype == np.float64
    assert abs(g.mean() - np.euler_gamma) < 0.01  # mean 0.5772, sd of the mean 0.004
    assert abs(g.var() - np.pi**2 / 6) < 0.03


logit_rows = st.integers(0, 2**32 - 1).map(
    lambda s: (np.random.default_rng(s).standard_normal(300) *
               np.random.default_rng(s).uniform(0.2, 8)).astype(np.float32))
samplings = st.builds(
    Sampling,
    temperature=st.sampled_from([0.0, 0.05, 0.3, 0.7, 1.0, 2.0]),
    top_k=st.sampled_from([0, 1, 5, 40]),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
    min_p=st.sampled_from([0.0, 0.05, 0.5]),
    repetition_penalty=st.sampled_from([1.0, 1.3, 0.8]),
    seed=st.integers(0, 2**64 - 1),
)


@settings(max_examples=300, deadline=None)
@given(x=logit_rows, s=samplings, pos=st.integers(0, 2**40), before=st.lists(
    st.integers(0, 299), max_size=30))
def test_fast_choice_equals_the_naive_argmax(x, s, pos, before):
    """The pruned Gumbel-max loop picks exactly what the argmax over every token's score + noise
    picks; greedy is the argmax of the (penalized) logits."""
    before = np.array(before, dtype=np.int64)
    token = choose(x, pos, before, s)
    if s.greedy:
        assert token == int(np.argmax(penalized(x, before, s.repetition_penalty)))
    else:
        assert token == int(np.argmax(perturbed(x, pos, before, s)))


def test_greedy_is_the_plain_argmax():
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    assert choose(x, 5, np.array([1, 2]), GREEDY) == int(np.argmax(x))
    assert Sampler(GREEDY).pick(x, 5, np.array([], dtype=np.int64)) == int(np.argmax(x))


def _warped(x: np.ndarray, s: Sampling, before=()) -> np.ndarray:
    """transformers' own processors and warpers, in generate()'s order -> scores [V]."""
    import torch
    from transformers import generation as g

    scores = torch.tensor(x)[None]
    ids = torch.tensor([list(before) or [0]])
    steps = []
    if s.repetition_penalty != 1 and len(before):
        steps.append(g.RepetitionPenaltyLogitsProcessor(s.repetition_penalty))
    steps.append(g.TemperatureLogitsWarper(s.temperature))
    if s.top_k:
        steps.append(g.TopKLogitsWarper(s.top_k))
    if s.top_p < 1:
        steps.append(g.TopPLogitsWarper(s.top_p))
    if s.min_p > 0:
        steps.append(g.MinPLogitsWarper(s.min_p))
    for step in steps:
        scores = step(ids, scores)
    return scores[0].numpy()


@pytest.mark.reference
@settings(max_examples=200, deadline=None)
@given(x=logit_rows, s=samplings.filter(lambda s: not s.greedy),
       before=st.lists(st.integers(0, 299), max_size=30))
def test_filters_keep_what_transformers_keeps(x, s, before):
    before = np.array(before, dtype=np.int64)
    ours, _ = filtered(penalized(x, before, s.repetition_penalty) / np.float32(s.temperature), s)
    theirs = _warped(x, s, before)
    assert np.array_equal(np.isfinite(ours), np.isfinite(theirs))
    kept = np.isfinite(ours)
    np.testing.assert_allclose(ours[kept], theirs[kept], rtol=1e-6)


def test_bad_settings_are_refused():
    for bad in (dict(temperature=-1), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=2),
                dict(top_k=-1), dict(repetition_penalty=0), dict(seed=-1),
                # 0 or inf once float32: NaN scores
                dict(temperature=1e-300), dict(temperature=1e300),
                dict(repetition_penalty=1e-300), dict(repetition_penalty=1e300)):
        with pytest.raises(KolibriError, match="sampling"):
            Sampling(**bad).check()


def test_sampling_round_trips_through_its_dict():
    s = Sampling(temperature=0.7, top_k=40, top_p=0.9, min_p=0.05, seed=2**63 + 5)
    assert Sampling.from_dict(s.to_dict()) == s
    assert GREEDY.to_dict() == {}
    assert Sampling.from_dict({}) == GREEDY
    with pytest.raises(KolibriError, match="unknown"):
        Sampling.from_dict({"temprature": 1.0})
    with pytest.raises(KolibriError, match="number"):
        Sampling.from_dict({"seed": "3"})


# ---- the distribution ------------------------------------------------------------------------

SEEDS = 20_000
PROMPT = [5, 9, 14, 5, 9, 22, 31]


def _first_token_logits(model) -> np.ndarray:
    tf = model.transformer
    return tf.forward(PROMPT, 0, tf.new_cache(len(PROMPT)))[-1]  # [V] the first token's row


def _chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    """p-value of observed counts against probs; bins expecting < 5 are pooled."""
    from scipy.stats import chisquare

    expected = probs * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return float(chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.mark.reference
@pytest.mark.parametrize("temperature", [0.5, 1.0])
@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_first_token_follows_softmax_of_filtered_logits(temperature, top_p, record_property):
    """The first sampled token over 20,000 seeds, through the generators' own choice, against
    transformers' softmax(warped logits); tokens the filters drop are never drawn."""
    import torch

    model = MODELS[1]  # untied: a spread-out first-token distribution
    x = _first_token_logits(model)
    counts = np.zeros(x.shape[0], dtype=np.int64)
    for seed in range(SEEDS):
        s = Sampling(temperature=temperature, top_p=top_p, seed=seed)
        counts[choose(x, len(PROMPT), np.array(PROMPT), s)] += 1
    probs = torch.softmax(torch.tensor(_warped(x, Sampling(temperature, top_p=top_p))),
                          -1).double().numpy()
    assert counts[probs == 0].sum() == 0
    assert (probs > 0.01).sum() >= 3  # a distribution worth testing, not a near-certainty
    p_value = _chi_square(counts, probs)
    record_property("chi_square_p", p_value)
    print(f"T={temperature} top_p={top_p}: chi-square p = {p_value:.3f}")
    assert p_value > 1e-3
