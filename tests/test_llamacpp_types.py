"""llama.cpp's stateful n-gram types on hand-built histories: each upstream rule, the state kept
across requests, llama-server's calling convention, libstdc++'s iteration order (against a
compiled std::unordered_map when g++ exists), and llama.cpp's cache file format."""

import random
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_models import assert_counts_as_simulated, prompts, tiny_model

from kolibri_cli.decode.proposers import (
    LlamaCppCacheProposer,
    LlamaCppMapK4vProposer,
    LlamaCppMapKProposer,
    LlamaCppModProposer,
    LlamaCppOptions,
    default_settings,
    make_proposer,
)
from kolibri_cli.decode.proposers.llamacpp import ngram_cache
from kolibri_cli.decode.proposers.llamacpp.ngram_map import ngram_hash
from kolibri_cli.decode.proposers.llamacpp.std_order import StdCounts
from kolibri_cli.errors import KolibriError

NO_EOS = {seed: tiny_model(seed, eos=(), tied=True, scale=0.1) for seed in (0, 1)}


def serve(proposer, prompt, generated, budget=100):
    """Draft once after `prompt` + `generated` (the last generated token is the sampled one)."""
    proposer.begin(prompt)
    return proposer.propose(prompt + generated, budget)


# ---- state across requests: simulation == real run ------------------------------------------


@settings(max_examples=25, deadline=None)
@given(seed=st.sampled_from([0, 1]), batch=st.lists(prompts, min_size=2, max_size=4),
       name=st.sampled_from(["llamacpp-map-k", "llamacpp-map-k4v", "llamacpp-mod",
                             "llamacpp-cache"]), k=st.integers(1, 8), n=st.integers(1, 3),
       max_tokens=st.integers(2, 40))
def test_state_across_requests_is_the_same_in_simulation_and_real_runs(seed, batch, name, k, n,
                                                                       max_tokens):
    """One instance over several prompts in a row, like a server slot. The models never emit
    eos, so every chain runs to max_tokens: a chain that stops on eos earlier makes the real run
    ask for one more draft (it cannot know the end is near; its budget is still positive) where
    the simulation's budget is 0 — a server-state type then differs on the NEXT request. The
    measured probe generates with max_tokens = the chain's length, where both agree."""
    model = NO_EOS[seed]
    real, simulated = (make_proposer(name, k, (n, n), llamacpp=LlamaCppOptions(n_min=1))
                       for _ in range(2))
    assert_counts_as_simulated(model, batch, max_tokens, real, simulated, k)


# ---- defaults and llama-server flags ---------------------------------------------------------


def test_upstream_defaults_and_server_flags():
    assert default_settings("llamacpp-map-k") == (48, (12, 12))
    assert default_settings("llamacpp-mod") == (64, (24, 24))
    assert default_settings("llamacpp-cache") == (8, (1, 4))
    assert default_settings("vllm") == (5, (1, 4))
    k4v = make_proposer("llamacpp-map-k4v", 5, (2, 2), llamacpp=LlamaCppOptions(min_hits=2))
    assert k4v.server_args() == (
        "--spec-type", "ngram-map-k4v", "--spec-ngram-map-k4v-size-n", "2",
        "--spec-ngram-map-k4v-size-m", "5", "--spec-ngram-map-k4v-min-hits", "2")
    mod = make_proposer("llamacpp-mod", *default_settings("llamacpp-mod"))
    assert mod.server_args()[-2:] == ("--spec-ngram-mod-n-min", "48")
    assert make_proposer("llamacpp-cache", 8, (1, 4)).server_args() == ("--spec-type",
                                                                         "ngram-cache")
    with pytest.raises(KolibriError, match="drafts 8 tokens"):
        make_proposer("llamacpp-cache", 5, (1, 4)).server_args()
    with pytest.raises(KolibriError, match="min-hits must be a whole number >= 1"):
        LlamaCppOptions(min_hits=0)


def test_no_draft_call_without_budget():
    """llama-server skips the drafter when no token fits: the state must not move either."""
    history = [5, 6, 7, 8] * 6
    proposer = LlamaCppMapKProposer(3, 2, 2)
    proposer.begin(history[:10])
    assert proposer.propose(history, 0) == []
    assert proposer._state.idx_last_check == 10  # untouched since begin
    assert proposer.propose(history, 2) == [5, 6]  # the draft is made, then cut to the budget


# ---- ngram-map-k / k4v -----------------------------------------------------------------------


def test_map_k_newest_match_and_acceptance_cap():
    prompt = [9, 1, 2, 3, 4, 1, 2, 5, 6, 7, 8, 10, 11, 12]
    proposer = LlamaCppMapKProposer(3, 2, 2)
    # key [1, 2]: newest earlier occurrence at 5 -> [5, 6, 7]
    assert serve(proposer, prompt, [1, 2]) == [5, 6, 7]
    proposer.observe(None, 3, 1)  # one accepted: this key now drafts at most 1 token
    assert proposer.propose(prompt + [1, 2, 5, 13, 1, 2], 10) == [5]
    proposer.observe(None, 1, 0)  # rejected outright: the key never drafts again
    assert proposer.propose(prompt + [1, 2, 5, 13, 1, 2, 14, 1, 2], 10) == []


def test_map_k_needs_2n_plus_m_tokens():
    proposer = LlamaCppMapKProposer(5, 3, 3)
    assert serve(proposer, [1, 2, 3, 4, 1, 2, 3, 4, 1], [2]) == []  # 9 < 2*3 + 5 history tokens
    assert serve(LlamaCppMapKProposer(4, 3, 3), [1, 2, 3, 4, 1, 2, 3, 4, 1], [2]) == []


def test_map_k4v_min_hits_and_dominant_value():
    # key [1, 2] is followed by [3, 4] once and [5, 6] once: no m-gram dominates
    tie = [0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 0, 0, 0, 0]
    assert serve(LlamaCppMapK4vProposer(2, 2, 2), tie, [1, 2]) == []
    # [3, 4] twice, [5, 6] once: 2 >= 2 * 1 -> a draft, taken after the NEWEST match ([5, 6])
    dominant = [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 5, 6, 0, 0, 0, 0]
    assert serve(LlamaCppMapK4vProposer(2, 2, 2), dominant, [1, 2]) == [5, 6]
    hits2 = LlamaCppMapK4vProposer(2, 2, 2, LlamaCppOptions(min_hits=2))
    assert serve(hits2, dominant, [1, 2]) == []  # the key's first hit: below min-hits
    # the second hit (found through the hash of positions: still the match at 11)
    assert hits2.propose(dominant + [1, 2, 7, 1, 2], 10) == [5, 6]


def test_map_state_across_requests():
    """A second, shorter request: positions past its start are forgotten (begin's cleanup), and
    the rest of the state (keys, the hash of positions) is kept and read against the new
    history, as upstream."""
    proposer = LlamaCppMapKProposer(2, 2, 2)
    first = [7, 1, 2, 3, 4, 8, 9, 10, 11, 12, 13, 14]
    assert serve(proposer, first, [1, 2]) == [3, 4]
    assert proposer._state.keys[0].key_idx == 1
    second = [7, 1, 2, 5, 6, 8, 9, 10]
    assert serve(proposer, second, [1, 2]) == [5, 6]  # the kept key at 1 reads the new history
    assert proposer._state.size_last_begin == len(second)


def test_map_hash_matches_upstream_formula():
    # uint32 LCG: ((0 * F + 1) * F + 2) mod 2^32, then mod 2^18
    f = 2654435761
    assert ngram_hash([1, 2], 0, 2) == ((f + 2) % 2**32) % 262144


# ---- ngram-mod -------------------------------------------------------------------------------


def test_mod_chains_lookups_and_shares_the_pool_across_requests():
    text = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7]
    first = LlamaCppModProposer(4, 2, 2, LlamaCppOptions(n_min=2))
    first.begin(text + [0] * 3)  # the prompt's 2-grams enter the pool
    # a new request: its own history has no repeat, yet the pool (from the first) drafts
    assert serve(first, [11, 12, 13], [3, 1]) == [4, 1, 5, 9]
    fresh = LlamaCppModProposer(4, 2, 2, LlamaCppOptions(n_min=2))
    assert serve(fresh, [11, 12, 13], [3, 1]) == []


def test_mod_n_min_and_the_low_acceptance_reset():
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    strict = LlamaCppModProposer(8, 2, 2, LlamaCppOptions(n_min=7))
    assert serve(strict, prompt, [3, 1]) == []  # the chain breaks after 6 (< n_min 7)
    proposer = LlamaCppModProposer(8, 2, 2, LlamaCppOptions(n_min=1))
    context = prompt + [3, 1]
    assert serve(proposer, prompt, [3, 1]) == [4, 1, 5, 9, 2, 6]
    for _ in range(4):
        proposer.observe(context, 6, 1)  # 1/6 < 25%: a low-acceptance streak
    assert proposer.propose(context, 8) == [4, 1, 5, 9, 2, 6]
    proposer.observe(context, 6, 1)  # the fifth: the pool is cleared
    assert proposer.propose(context, 8) == [] and proposer._state.used == 0


# ---- ngram-cache -----------------------------------------------------------------------------


def test_cache_thresholds_and_one_token_at_a_time():
    # 2-gram [1, 2] -> 3 twice: sample size 2 >= 2 and 100% >= 50%: drafted; then [2, 3] -> 4
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 0]
    assert serve(LlamaCppCacheProposer(8, 1, 4), prompt, [1, 2]) == [3, 4, 0, 1, 2, 3, 4, 0]
    assert serve(LlamaCppCacheProposer(2, 1, 4), prompt, [1, 2]) == [3, 4]
    # [5] seen once before with one follower: a 1-gram needs 2 samples (lax)
    assert serve(LlamaCppCacheProposer(8, 1, 4), [5, 6, 7], [5]) == []


def test_cache_ties_go_to_libstdcxx_order():
    # after [1], 7 and 20 follow once each... and a 2-gram tie: [9, 1] -> {7: 1, 20: 1}
    prompt = [9, 1, 7, 9, 1, 20, 0]
    part = StdCounts()
    part.add(7)
    part.add(20)  # bucket 20 % 13 = 7, bucket 7 % 13 = 7: 20 goes to the front of the group
    assert [t for t, _ in part.items()] == [20, 7]
    assert serve(LlamaCppCacheProposer(1, 1, 4), prompt, [9, 1]) == [20]


def test_cache_context_learns_only_unseen_positions():
    """Upstream's context cache remembers how far it has read (cache_size): a later, shorter
    request adds nothing until it grows past that point."""
    proposer = LlamaCppCacheProposer(8, 1, 4)
    assert serve(proposer, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [11]) == []
    assert serve(proposer, [21, 22, 21, 22, 21], [22]) == []  # its repeats are never learned
    assert serve(LlamaCppCacheProposer(8, 1, 4), [21, 22, 21, 22, 21], [22])[:2] == [21, 22]


def test_cache_files_round_trip_and_static_drafts(tmp_path):
    static: ngram_cache.NgramCache = {}
    ngram_cache.update(static, [4, 5, 6, 4, 5, 6, 4, 5, 7], 2, 2)
    path = tmp_path / "static.bin"
    path.write_bytes(ngram_cache.to_bytes(static))
    loaded = ngram_cache.load(path)
    assert {k: v.counts for k, v in loaded.items()} == {k: v.counts for k, v in static.items()}
    # loading inserts in file order, so the order is that of a map built from the file's pairs
    rebuilt = StdCounts()
    for token, count in static[(4, 5, -1, -1)].items():
        rebuilt.add(token, count)
    assert list(loaded[(4, 5, -1, -1)].items()) == list(rebuilt.items()) == [(6, 2), (7, 1)]
    options = LlamaCppOptions(lookup_cache_static=path)
    # nothing in the context, the static cache alone: [4, 5] -> {6: 2, 7: 1} = 67% >= 50%
    assert serve(LlamaCppCacheProposer(1, 1, 4, options), [1, 4], [5]) == [6]
    (tmp_path / "bad.bin").write_bytes(b"\x01\x02")
    with pytest.raises(KolibriError, match="not a llama.cpp n-gram cache"):
        ngram_cache.load(tmp_path / "bad.bin")


# ---- libstdc++ order against the real thing -------------------------------------------------

ORACLE = r"""
#include <unordered_map>
#include <cstdio>
#include <cstdint>
#include <iostream>
int main() {
    int n;
    while (std::cin >> n) {
        std::unordered_map<int32_t, int32_t> m;
        for (int i = 0; i < n; ++i) {
            int32_t t; std::cin >> t;
            auto it = m.find(t);
            if (it == m.end()) m.emplace(t, 1); else it->second++;
        }
        std::unordered_map<int32_t, int32_t> copy = m;
        for (auto & kv : copy) printf("%d:%d ", kv.first, kv.second);
        printf("\n");
    }
}
"""


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ (libstdc++) as the oracle")
def test_std_order_equals_libstdcxx(tmp_path):
    source, binary = tmp_path / "order.cpp", tmp_path / "order"
    source.write_text(ORACLE)
    subprocess.run(["g++", "-O1", "-o", str(binary), str(source)], check=True)
    rng = random.Random(0)
    seqs = [[rng.randrange(rng.choice([3, 40, 1000, 49152])) for _ in range(rng.choice(
        [1, 13, 14, 60, 300, 3000]))] for _ in range(120)]
    text = "".join(f"{len(s)} {' '.join(map(str, s))}\n" for s in seqs)
    lines = subprocess.run([str(binary)], input=text, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    for seq, line in zip(seqs, lines, strict=True):
        part = StdCounts()
        for t in seq:
            part.add(t)
        assert " ".join(f"{t}:{c}" for t, c in part.items()) == line.strip()
    assert np.mean([len(set(s)) > 13 for s in seqs]) > 0.3  # rehashes were exercised


# ---- the probe's options ---------------------------------------------------------------------


def probe(*args):
    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    return CliRunner().invoke(app, ["probe", *map(str, args)])


@pytest.fixture
def chain_goldens(tmp_path):
    import json

    motif = [11, 12, 13, 14, 15, 16, 17, 18]
    lines = [{"id": i, "category": "c", "prompt": "p", "chat": True, "prompt_ids": motif * 3,
              "output_ids": motif * 4, "model": "m", "model_sha256": "0" * 64, "reference": {}}
             for i in range(2)]
    path = tmp_path / "g.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_probe_runs_llamacpp_types_at_their_defaults_and_with_options(chain_goldens, tmp_path):
    import json

    result = probe("--goldens", chain_goldens, "--proposer", "llamacpp-mod,llamacpp-map-k4v",
                   "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["config"]["k"] is None  # each proposer at its own default
    assert [(r["proposer"], r["k"], r["window"]) for r in doc["runs"]] == [
        ("llamacpp-mod", 64, [24, 24]), ("llamacpp-map-k4v", 48, [12, 12])]
    toml = tmp_path / "p.toml"
    toml.write_text('goldens = "g.jsonl"\nproposer = "llamacpp-mod"\nk = 8\nwindow = "4"\n'
                    "n_min = 2\n")
    low, high = (json.loads(probe(toml, "--json", *extra).stdout)
                 for extra in ((), ("--n-min", "9")))
    assert low["runs"][0]["total"]["drafts_accepted"] > 0  # the motif's pool chains on
    assert (low["config"]["llamacpp"]["n_min"], high["config"]["llamacpp"]["n_min"]) == (2, 9)


def test_probe_rejects_bad_llamacpp_options(chain_goldens, tmp_path):
    toml = tmp_path / "p.toml"
    toml.write_text("n_min = -1\n")
    assert "n_min must be a whole number >= 0" in probe(toml).stderr
    missing = probe("--goldens", chain_goldens, "--proposer", "llamacpp-cache",
                    "--lookup-cache-static", tmp_path / "none.bin")
    assert (missing.exit_code, missing.stdout) == (1, "")
    assert "cannot read the n-gram cache" in missing.stderr


@pytest.fixture
def two_servers(tmp_path):
    """The shipped chat goldens as two files (two servers' traffic), and llama.cpp cache files
    built from their outputs."""
    from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens

    lines = [line for line in DEFAULT_CHAT.read_text().splitlines() if line.strip()]
    folder = tmp_path / "traffic"
    folder.mkdir()
    for name, part in (("a.jsonl", lines[::2]), ("b.jsonl", lines[1::2])):
        (folder / name).write_text("\n".join(part) + "\n")
    outputs = [g.output_ids for g in load_goldens(DEFAULT_CHAT)]
    static, dynamic = {}, {}
    ngram_cache.update(static, [t for out in outputs[:9] for t in out], 2, 2)
    ngram_cache.update(dynamic, [t for out in outputs[9:] for t in out])
    for name, cache in (("static.bin", static), ("dynamic.bin", dynamic)):
        (tmp_path / name).write_bytes(ngram_cache.to_bytes(cache))
    return folder


def _per_server(folder, name, k, window, options):
    """Counts of one proposer instance per file, its goldens in order: what each server saw."""
    from kolibri_cli.goldens.chains import load_goldens
    from kolibri_cli.probe.simulate import merge_counts, simulate_chain

    counts = []
    for path in sorted(folder.glob("*.jsonl")):
        proposer = make_proposer(name, k, window, llamacpp=options)
        counts += [simulate_chain(g.prompt_ids, g.output_ids, proposer, k)
                   for g in load_goldens(path)]
    total = merge_counts(counts, k)
    return total.verify_passes, total.drafts_proposed, total.drafts_accepted


@pytest.mark.parametrize(("name", "k", "window", "flags"), [
    ("llamacpp-map-k4v", 5, "2", {"--min-hits": "2"}),
    ("llamacpp-mod", 16, "4", {"--n-min": "2"}),
    ("llamacpp-cache", 8, "1-4", {"--lookup-cache-static": "static.bin",
                                  "--lookup-cache-dynamic": "dynamic.bin"}),
])
def test_options_reach_worker_processes(two_servers, name, k, window, flags):
    """A run over worker processes counts what one process counts, with the type's options
    (they travel with each configuration), each file one ordered stream from a fresh state; the
    cache files are only read."""
    import json

    from kolibri_cli.decode.proposers import parse_window

    folder = two_servers
    flags = {f: str(folder.parent / v) if v.endswith(".bin") else v for f, v in flags.items()}
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.parent.glob("*.bin")}
    args = ["--goldens", folder, "--proposer", name, "--k", k, "--window", window, "--json",
            *[x for item in flags.items() for x in item]]
    one, two = (probe(*args, "--workers", n) for n in ("1", "2"))
    assert one.exit_code == 0 and two.exit_code == 0, one.stderr + two.stderr
    (a,), (b,) = json.loads(one.stdout)["runs"], json.loads(two.stdout)["runs"]
    assert json.loads(two.stdout)["throughput"]["executor"] == "processes"
    assert a == b and a["ordered_streams"] == 2
    options = LlamaCppOptions(
        min_hits=int(flags.get("--min-hits", 0)) or None,
        n_min=int(flags["--n-min"]) if "--n-min" in flags else None,
        lookup_cache_static=flags.get("--lookup-cache-static"),
        lookup_cache_dynamic=flags.get("--lookup-cache-dynamic"))
    got = tuple(a["total"][key] for key in ("verify_passes", "drafts_proposed",
                                            "drafts_accepted"))
    expected = _per_server(folder, name, k, parse_window(window), options)
    assert got == expected
    assert expected != _per_server(folder, name, k, parse_window(window), LlamaCppOptions())
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == files


class FakeServer:
    """A llama-server stand-in: answers each golden with its own chain and counts drafts with
    one proposer for its whole life (a slot keeps state across requests)."""

    def __init__(self, proposer=None, k: int = 0):
        from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens

        self.chains = {tuple(g.prompt_ids): g.output_ids for g in load_goldens(DEFAULT_CHAT)}
        self.proposer, self.k = proposer, k

    def complete(self, prompt_ids, n, how=None):
        from kolibri_cli.engines import Completion
        from kolibri_cli.probe.simulate import ServerCounting, simulate_chain

        chain = self.chains[tuple(prompt_ids)][:n]
        if self.proposer is None:
            return Completion(chain, 1.0)
        sim = simulate_chain(prompt_ids, chain, self.proposer, self.k, ServerCounting(n, (2,)))
        return Completion(chain, 0.5, sim.drafts_proposed, sim.drafts_accepted)


def test_measured_server_counts_a_stateful_type_as_one_slot():
    """probe --engine: the simulation of a type with state across requests is one instance fed
    the goldens in the order the server saw them (a fresh one per golden misses what earlier
    requests left in the slot)."""
    from kolibri_cli.goldens.chains import DEFAULT_CHAT, load_goldens
    from kolibri_cli.probe.measure.engine import measure_on_server
    from kolibri_cli.probe.replay.shards import simulate

    goldens = load_goldens(DEFAULT_CHAT)
    run = simulate(goldens, 5, (2, 2), "llamacpp-map-k")
    server = FakeServer(run.new_proposer(), 5)
    measured = measure_on_server(FakeServer(), server, goldens, run, repeats=2, engine="fake")
    assert all(g.counts_match_simulation for g in measured.goldens)
    fresh = [FakeServer(run.new_proposer(), 5).complete(g.prompt_ids, len(g.output_ids))
             for g in goldens]
    assert [(f.drafted, f.accepted) for f in fresh] != [
        (g.drafts_proposed, g.drafts_accepted) for g in measured.goldens]


def test_configurations_carry_defaults_options_and_absolute_cache_paths():
    """What each worker is handed: the proposer's own k and window when none are given, the
    llama.cpp options, and cache files it can open from any folder."""
    from pathlib import Path

    from kolibri_cli.probe.config import ProbeConfig
    from kolibri_cli.probe.replay.shards import configs_of

    cfg = ProbeConfig(k=[], window=[], proposer=["vllm", "llamacpp-mod", "sglang"], n_min=3,
                      lookup_cache_static=Path("static.bin"))
    configs = configs_of(cfg)
    assert [(c.proposer, c.k, c.window) for c in configs] == [
        (name, *default_settings(name)) for name in cfg.proposer]
    assert all(c.llamacpp.n_min == 3 for c in configs)
    assert configs[0].llamacpp.lookup_cache_static == Path("static.bin").absolute()
