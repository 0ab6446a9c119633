"""The compiled replays give exactly the reference loop's counts (simulate_chain over each
proposer's own propose/observe), chain by chain and pass by pass, for every proposer with one."""

import random

import numpy as np
import pytest

from kolibri_cli.goldens.chains import DEFAULT_CHAT, Golden, load_goldens
from kolibri_cli.probe.replay import Chains, Replayer, SimConfig, _fast_replay

SHIPPED = load_goldens(DEFAULT_CHAT)
FAST = ["vllm", "hf", "llamacpp-simple", "suffix", "suffix+cross"]


def config(name: str, k: int, window: tuple[int, int]) -> SimConfig:
    return SimConfig(name.split("+")[0], k, window, cross_request=name.endswith("+cross"))


def golden(i: int, prompt: list[int], output: list[int], eos=()) -> Golden:
    return Golden(i, "c", "p", True, prompt, output, "m", "0" * 64, {}, list(eos))


def random_chains(seed: int, n: int) -> list[Golden]:
    """Small vocabularies and copied stretches (summaries, code edits), tiny and long chains,
    eos ids inside outputs; some chains continue the previous chain's whole context."""
    rng = random.Random(seed)
    chains = []
    for i in range(n):
        vocab = rng.choice([2, 3, 5, 8, 50])
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        output = [rng.randrange(vocab) for _ in range(rng.randint(1, 80))]
        if rng.random() < 0.5:
            start = rng.randrange(len(prompt))
            output[rng.randrange(len(output)) :] = prompt[start : start + 30]
            output = output or [0]
        if chains and rng.random() < 0.15:  # a follow-up turn: the last context, grown a little
            last = chains[-1]
            prompt = last.prompt_ids + last.output_ids + output[: rng.randint(0, 3)]
        chains.append(golden(i, prompt, output, eos=rng.choice([(), (1,), (0, 2)])))
    return chains


def assert_same(goldens: list[Golden], cfg: SimConfig, batch: int = 97) -> None:
    """Fast and reference replays agree on every chain, fed in batches (state carries over)."""
    fast, ref = Replayer(cfg, fast_path=True), Replayer(cfg, fast_path=False)
    assert fast._fast is not None and ref._fast is None
    for start in range(0, len(goldens), batch):
        chains = Chains(goldens[start : start + batch])
        a, b = fast.replay(chains), ref.replay(chains)
        for name in ("scalars", "drafted_at", "accepted_at", "pass_starts", "draft_lengths",
                     "accepted_lengths"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), (cfg, start, name)


@pytest.mark.parametrize("name", FAST)
@pytest.mark.parametrize("k, window", [(1, (1, 1)), (3, (1, 2)), (5, (1, 4)), (8, (3, 5)),
                                       (12, (2, 2))])
def test_fast_equals_reference_on_random_chains(name, k, window):
    assert_same(random_chains(k * 10 + window[1], 150), config(name, k, window))


@pytest.mark.parametrize("name", FAST)
@pytest.mark.parametrize("k, window", [(5, (1, 4)), (10, (1, 2)), (48, (12, 12))])
def test_fast_equals_reference_on_the_shipped_goldens(name, k, window):
    assert_same(SHIPPED * 3, config(name, k, window), batch=20)


def test_suffix_cross_request_trie_grows_past_its_first_size():
    """Long chains overflow the first trie arrays: the replay resumes after growing them."""
    rng = random.Random(3)
    chains = [golden(i, [rng.randrange(400) for _ in range(900)],
                     [rng.randrange(400) for _ in range(400)]) for i in range(6)]
    assert_same(chains, config("suffix+cross", 6, (1, 1)), batch=6)


def test_only_the_exact_proposer_types_have_a_fast_path():
    class Subclassed(type(config("vllm", 3, (1, 2)).make_proposer())):
        pass

    assert _fast_replay(Subclassed(3, 1, 2)) is None  # a changed rule gets the generic path
    assert _fast_replay(config("adaptive", 3, (1, 2)).make_proposer()) is None
