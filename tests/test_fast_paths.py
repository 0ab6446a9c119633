"""The compiled replays give exactly the reference loop's counts (simulate_chain over each
proposer's own propose/observe), chain by chain and pass by pass, for every proposer with one."""

import random

import numpy as np
import pytest

from kolibri_cli.goldens.chains import DEFAULT_CHAT, Golden, load_goldens
from kolibri_cli.probe.replay import Chains, Replayer, SimConfig, _fast_replay

SHIPPED = load_goldens(DEFAULT_CHAT)
FAST = ["vllm", "hf", "llamacpp-simple", "suffix", "suffix+cross"]
INDEXED = ["guard", "adaptive", "llamacpp-map-k", "llamacpp-map-k4v"]  # the reference loop, indexed


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


@pytest.mark.parametrize("name", FAST + INDEXED)
@pytest.mark.parametrize("k, window", [(1, (1, 1)), (3, (1, 2)), (5, (1, 4)), (8, (3, 5)),
                                       (12, (2, 2))])
def test_fast_equals_reference_on_random_chains(name, k, window):
    assert_same(random_chains(k * 10 + window[1], 150), config(name, k, window))


@pytest.mark.parametrize("name", FAST + INDEXED)
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
    cfg = config("guard", 3, (1, 2))

    class Guarded(type(cfg.make_proposer())):
        pass

    assert _fast_replay(Guarded(3, 1, 2), cfg) is None
    assert _fast_replay(cfg.make_proposer(), cfg) is not None
    assert _fast_replay(config("adaptive-tree", 3, (1, 2)).make_proposer()) is None


def test_fast_equals_reference_on_loops_wide_windows_and_large_ids():
    """Looping chains (the matching suffix is longer than the window: the replay's tracked state
    answers), windows wider than the chains, ids up to 2^31 - 1."""
    rng = random.Random(7)
    chains = []
    for i in range(10):
        unit = [rng.randrange(2**31) for _ in range(rng.randint(1, 6))]
        body = (unit * 100)[: rng.randint(60, 500)]
        for _ in range(3):
            body[rng.randrange(len(body))] = rng.randrange(2**31)
        chains.append(golden(i, body[:20], body[20:]))
    for name in ("vllm", "hf", "llamacpp-simple", "guard", "adaptive"):
        for k, window in ((4, (1, 64)), (6, (2, 1024)), (3, (5, 5))):
            assert_same(chains, config(name, k, window), batch=4)


def test_a_hash_collision_falls_back_to_the_proposers_scan():
    """llamacpp-simple's table maps an n-gram's hash to its latest start; when that start holds
    another n-gram (a collision), the answer is the proposer's own scan."""
    from kolibri_cli.decode.proposers.llamacpp.simple import _most_recent_start
    from kolibri_cli.probe.replay import compiled

    ctx = np.array([7, 1, 2, 9, 1, 2, 3, 3, 4, 4, 1, 2], dtype=np.int64)
    size, m = 2, 2
    prefix, power = compiled._hashes(ctx, size)
    keys, vals = compiled._table(len(ctx))
    h = (prefix[len(ctx)] - prefix[len(ctx) - size] * power) & compiled._MASK  # of [1, 2]
    slot = compiled._slot(keys, h)
    keys[slot], vals[slot] = h, 6  # [3, 3] is at 6: as if it had the same hash
    expected = _most_recent_start(ctx, size, m)
    assert expected == (6, 2)  # [1, 2] last occurred at 4 (before 1): 4 + 2 = 6
    assert compiled._recent(ctx, len(ctx), size, m, keys, vals, prefix, power) == expected
    vals[slot] = 4  # the true latest start: read from the table
    assert compiled._recent(ctx, len(ctx), size, m, keys, vals, prefix, power) == expected


def long_chains(n: int, seed: int = 11) -> list[Golden]:
    """Three chains of n ids: the shipped outputs over and over with 1% of ids random (a long
    chat or agent log), random ids (nothing repeats), a 7-id loop with 0.1% noise (a degenerate
    generation)."""
    rng = random.Random(seed)
    shipped = [t for g in SHIPPED for t in g.output_ids]
    repeated = [rng.randrange(49152) if rng.random() < 0.01 else t
                for t in (shipped * (n // len(shipped) + 1))[:n]]
    noise = [rng.randrange(49152) for _ in range(n)]
    loop = ([rng.randrange(49152) for _ in range(7)] * (n // 7 + 1))[:n]
    for _ in range(n // 1000):
        loop[rng.randrange(n)] = rng.randrange(49152)
    return [golden(i, ids[:50], ids[50:]) for i, ids in enumerate((repeated, noise, loop))]


@pytest.mark.parametrize("name, n", [("vllm", 12_000), ("hf", 12_000),
                                     ("llamacpp-simple", 12_000), ("suffix", 4_000),
                                     ("suffix+cross", 4_000), ("guard", 4_000),
                                     ("adaptive", 4_000), ("llamacpp-map-k", 4_000),
                                     ("llamacpp-map-k4v", 4_000)])
def test_fast_equals_reference_on_long_chains(name, n):
    """Long chains, where the replays' indexes (automaton, n-gram table, trie) do the work the
    proposers' scans of the whole context do at every pass, agree with those scans."""
    chains = long_chains(n)
    for k, window in ((5, (1, 4)), (8, (2, 64))):
        assert_same(chains, config(name, k, window), batch=3)


def test_a_chain_past_the_replays_int32_indexes_is_refused(monkeypatch):
    """The automaton indexes a chain with int32 (MAX_CHAIN = 2^28 ids, far past a golden line's
    64 MB limit); a longer chain is one KolibriError, not a wrapped index."""
    from kolibri_cli.errors import KolibriError
    from kolibri_cli.probe.replay import compiled

    monkeypatch.setattr(compiled, "MAX_CHAIN", 100)
    chain = Chains([golden(0, [1, 2, 3], [1, 2, 3] * 40)])
    for name in ("vllm", "llamacpp-simple"):
        with pytest.raises(KolibriError, match="a chain of 123 ids is longer than the n-gram "
                                               "replay takes"):
            Replayer(config(name, 3, (1, 2)), fast_path=True).replay(chain)


def test_longest_matches_is_longest_match_at_every_prefix():
    """The automaton's one pass answers what guard and adaptive search the context for."""
    from kolibri_cli.decode.proposers.ngram import longest_match
    from kolibri_cli.probe.replay import compiled

    rng = random.Random(5)
    for _ in range(200):
        vocab, size = rng.choice([2, 3, 5, 50]), rng.randint(1, 150)
        ctx = np.array([rng.randrange(vocab) for _ in range(size)], dtype=np.int64)
        wmin = rng.randint(1, 4)
        wmax = rng.randint(wmin, 70)
        first = rng.randint(1, size)
        found = compiled.longest_matches(ctx, first, wmin, wmax)  # [T + 1, 2]
        for t in range(first, size + 1):
            assert tuple(found[t]) == longest_match(ctx[:t], wmin, wmax), (ctx, wmin, wmax, t)


class LinearKeys:
    """NgramMap's key lookup as upstream writes it: the first key whose text at its position in
    the current history equals the key, by a scan of every key."""

    def _key_offset(self, inp, cur_len, key, match_pos):
        from kolibri_cli.decode.proposers.llamacpp.ngram_map import MAX_VALUES, Key, Value

        for i, k in enumerate(self.keys):
            if inp[k.key_idx : min(k.key_idx + len(key), cur_len)] == list(key):
                return i
        self.keys.append(Key(key_idx=match_pos,
                             values=[Value(n_accepted=self.m) for _ in range(MAX_VALUES)]))
        return len(self.keys) - 1


@pytest.mark.parametrize("key_only", [True, False])
def test_ngram_map_finds_keys_as_a_scan_of_every_key_does(key_only):
    """Requests of one slot over histories that share, drop or change their starts (so kept keys
    point at other text, or past the new history's end): the keys found by lookup are those the
    scan finds, draft for draft."""
    from kolibri_cli.decode.proposers.llamacpp.ngram_map import NgramMap

    class Reference(LinearKeys, NgramMap):
        pass

    rng = random.Random(13 + key_only)
    for _ in range(40):
        n, m = rng.randint(1, 4), rng.randint(1, 6)
        fast, slow = NgramMap(n, m, key_only, 1), Reference(n, m, key_only, 1)
        history, prompt = [], []
        for _ in range(rng.randint(1, 8)):
            vocab = rng.choice([2, 3, 6])
            if rng.random() < 0.4:  # just past the last prompt: kept keys reach past its end
                prompt = history[: len(prompt) + rng.randint(0, n)]
            else:
                keep = history[: rng.randint(0, len(history))] if rng.random() < 0.7 else []
                prompt = keep + [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
            history = list(prompt)
            fast.begin(prompt)
            slow.begin(prompt)
            for _ in range(rng.randint(0, 120)):
                sampled = rng.randrange(vocab)
                ahead = history + [sampled] + [rng.randrange(vocab) for _ in range(n + m)]
                a = fast.draft(ahead, sampled, len(history))  # a replay's whole chain
                b = slow.draft(history, sampled)
                assert a == b
                assert [k.key_idx for k in fast.keys] == [k.key_idx for k in slow.keys]
                if a:
                    accepted = rng.randint(0, len(a))
                    fast.accept(accepted)
                    slow.accept(accepted)
                history.append(sampled)


def test_a_kept_key_past_the_new_historys_end_is_found_by_the_scan():
    """A key whose text is not (yet) in the request's history equals nothing until it is: the
    request scans the keys, as upstream does, and finds it once the history covers it."""
    from kolibri_cli.decode.proposers.llamacpp.ngram_map import MAX_VALUES, Key, NgramMap, Value

    class Reference(LinearKeys, NgramMap):
        pass

    rng = random.Random(4)
    for _ in range(30):
        maps = NgramMap(2, 3, True, 1), Reference(2, 3, True, 1)
        history = [rng.randrange(3) for _ in range(30)]
        for nm in maps:
            for t in range(20, 30):
                nm.draft(history[:t], history[t])
            nm.begin(history[:12])
            nm.keys.insert(0, Key(key_idx=11, values=[Value(n_accepted=3)
                                                      for _ in range(MAX_VALUES)]))
        for t in range(12, 30):  # the planted key at 11..12 is whole from t = 13 on
            ahead = history + [rng.randrange(3) for _ in range(6)]
            assert maps[0].draft(ahead, history[t], t) == maps[1].draft(history[:t], history[t])
            assert [k.key_idx for k in maps[0].keys] == [k.key_idx for k in maps[1].keys]


def test_the_indexed_replays_work_in_proportion_to_the_chain(monkeypatch):
    """Operations, not time: map-k's key comparisons grow with the chain, not with the chain
    times its keys (the scan of every key at every call did); guard and adaptive never search
    the whole context (their own `propose`) in a replay."""
    from kolibri_cli.decode.proposers import AdaptiveProposer, GuardProposer
    from kolibri_cli.decode.proposers.llamacpp import ngram_map

    compared = []
    equal = ngram_map._equal
    monkeypatch.setattr(ngram_map, "_equal", lambda *a: compared.append(1) or equal(*a))
    rng = random.Random(2)
    per_id = []
    for n in (4_000, 16_000):
        ids = [rng.randrange(400) for _ in range(n)]  # thousands of keys, each seen a few times
        compared.clear()
        Replayer(config("llamacpp-map-k", 4, (1, 2))).replay(Chains([golden(0, ids[:10],
                                                                              ids[10:])]))
        per_id.append(len(compared) / n)
    assert per_id[1] < 1.5 * per_id[0], per_id

    def searched(self, context, max_tokens):
        raise AssertionError("the replay searched the whole context")

    for cls in (GuardProposer, AdaptiveProposer):
        monkeypatch.setattr(cls, "propose", searched)
    for name in ("guard", "adaptive"):
        Replayer(config(name, 4, (1, 2))).replay(Chains(long_chains(2_000)))
