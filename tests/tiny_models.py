"""Tiny random models for the lossless-law property tests (no checkpoint needed).

Tied head + small scale: the residual stream keeps the input token, so the model tends to copy
and drafts get accepted; untied at 0.3: diverse chains where most drafts fail. `sharp` scales the
final norm, hence the logits: a sharp copier still accepts drafts when sampling at T > 0.
"""

from dataclasses import replace
from types import SimpleNamespace

from hypothesis import strategies as st

from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.weights import random_weights

TINY = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=10000.0,
                   max_position_embeddings=512, eos_token_ids=(0,))


class _Tok:
    def decode(self, ids):
        return " ".join(map(str, ids))


def tiny_model(seed: int, eos=(0,), tied: bool = False, scale: float = 0.3, sharp: float = 1.0):
    config = replace(TINY, tie_word_embeddings=tied)
    weights = random_weights(config, seed=seed, scale=scale)
    weights.norm *= sharp  # [D] final norm: logits scale with it
    tf = Transformer(config, weights)
    return SimpleNamespace(transformer=tf, eos_ids=eos, tokenizer=_Tok())


MODELS = {0: tiny_model(0, tied=True, scale=0.1), 1: tiny_model(0),
          2: tiny_model(1, tied=True, scale=0.1), 3: tiny_model(2, tied=True, scale=0.1, sharp=4)}

prompts = st.one_of(
    st.lists(st.integers(1, 63), min_size=1, max_size=40),
    # repetitive prompts: a short motif repeated, so drafts get proposed and accepted
    st.tuples(st.lists(st.integers(1, 63), min_size=1, max_size=5), st.integers(2, 8)).map(
        lambda t: t[0] * t[1]
    ),
)


def assert_counts_as_simulated(model, batch, max_tokens: int, real, simulated, k: int) -> None:
    """Prompt after prompt, one instance each (as the probe replays goldens): the speculative
    run's verify passes and draft counts with `real` equal the simulation's with `simulated`
    over the plain chain."""
    from kolibri_cli.decode.generate import generate_plain, generate_spec
    from kolibri_cli.probe.simulate import simulate_chain

    for prompt in batch:
        plain = generate_plain(model, prompt, max_tokens)
        stats = generate_spec(model, prompt, max_tokens, real).spec_stats()
        sim = simulate_chain(prompt, plain.output_ids, simulated, k)
        assert (stats["verify_passes"], stats["drafts_proposed"], stats["drafts_accepted"]) == (
            sim.verify_passes, sim.drafts_proposed, sim.drafts_accepted)
