"""c(n) kept by `kolibri bench` and the probe's pricing: bench writes the store, the probe prices
the goldens of that model with it (and says so), nothing else uses it, and a damaged store is a
note, never a traceback."""

import dataclasses
import json
import pathlib

import numpy as np
import pytest
from typer.testing import CliRunner

import kolibri_cli
from kolibri_cli.cli import app
from kolibri_cli.costs import store as benchcosts
from kolibri_cli.costs.model import GUESS_HOST, GUESSED_COSTS, cost_model
from kolibri_cli.costs.store import BenchCosts
from kolibri_cli.errors import KolibriError

SHA = "a" * 64
# drafts [3, 0, 2] in "mix" and [1, 0] in "rej": passes of 4, 1, 3, 2 and 1 rows
CHAINS = [("mix", "code", [1, 2, 3, 4, 5], [1, 2, 3, 9, 1, 2, 3, 4]),
          ("rej", "qa", [1, 2, 3], [1, 9, 9])]


@pytest.fixture
def goldens(tmp_path):
    path = tmp_path / "g.jsonl"
    lines = [{"id": gid, "category": cat, "prompt": "p", "chat": True, "prompt_ids": p,
              "output_ids": g, "model": "m", "model_sha256": SHA, "reference": {}}
             for gid, cat, p, g in CHAINS]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def entry(sha=SHA, threads=2, numerics="float32", costs=None, at="2026-11-30T22:41:00+00:00",
          version=kolibri_cli.__version__, kernel=None):
    return BenchCosts("m", sha, threads, numerics, costs or {1: 1.0, 2: 1.5, 3: 1.9, 4: 2.4},
                      at, version, "abc", "a cpu", kernel or benchcosts.kernel_id())


def probe(goldens, *args):
    return CliRunner().invoke(app, ["probe", "--goldens", str(goldens), "--k", "3", "--window",
                                    "1-2", *args])


def speedup(costs) -> float:
    c = cost_model(costs)
    return 9 / (c(4) + c(1) + c(3) + c(2) + c(1))


def test_probe_prices_with_the_stored_bench_of_the_goldens_model(goldens, kolibri_home):
    benchcosts.save(entry(threads=1, at="2026-11-29T10:00:00+00:00"))
    benchcosts.save(entry(threads=2))  # the latest of the model: used when no --threads
    doc = json.loads((r := probe(goldens, "--json")).stdout)
    assert r.exit_code == 0 and "note" not in r.stderr  # (a slow run shows its throughput)
    assert doc["pricing"]["source"] == "bench" and doc["pricing"]["bench"]["threads"] == 2
    assert doc["pricing"]["costs"] == {"1": 1.0, "2": 1.5, "3": 1.9, "4": 2.4}
    assert doc["runs"][0]["modelled_speedup"] == pytest.approx(9 / (2.4 + 1 + 1.9 + 1.5 + 1))
    text = " ".join(probe(goldens).stdout.split())
    assert "predicted with c(n) from kolibri bench of m (float32, 2 threads, kolibri" in text
    assert "2026-11-30 22:41 UTC" in text.split("per golden")[0]  # in the verdict, up front
    older = json.loads(probe(goldens, "--threads", "1", "--json").stdout)["pricing"]
    assert older["source"] == "bench" and older["bench"]["measured_at"].startswith("2026-11-29")


@pytest.mark.parametrize("stale", [{"version": "0.0.1"}, {"kernel": "engine-0123 znver3 "}])
def test_a_bench_of_another_kernel_is_used_with_a_note(goldens, kolibri_home, stale):
    benchcosts.save(entry(**stale))
    r = probe(goldens, "--json")
    pricing = json.loads(r.stdout)["pricing"]
    assert pricing["source"] == "bench" and pricing["stale"]
    version = stale.get("version", kolibri_cli.__version__)
    assert f"note: c(n) from a bench of another kernel (kolibri {version}, 2026-11-30 22:41 " \
        "UTC): `kolibri bench -m m` measures this one" in r.stderr
    text = " ".join(probe(goldens).stdout.split())
    assert "priced with c(2)=1.50, c(3)=1.90, c(4)=2.40 (" in text
    assert "; STALE: timed on another kernel)" in text


def test_a_bench_of_this_kernel_is_not_stale(goldens, kolibri_home):
    benchcosts.save(entry())
    assert not json.loads(probe(goldens, "--json").stdout)["pricing"]["stale"]
    assert "STALE" not in probe(goldens).stdout


def test_an_entry_stored_before_kernels_were_named_reads_as_another_kernels(kolibri_home):
    old = entry().to_json()
    del old["kernel"], old["runs"]  # format 1: neither was written
    kolibri_home.mkdir(parents=True, exist_ok=True)
    benchcosts.path().write_text(json.dumps({"format": 1, "entries": [old]}))
    (read,) = benchcosts.load()
    assert read.kernel == "" and read.costs == entry().costs and not benchcosts.timed_here(read)
    assert read.rounds == (entry().costs,)  # its median curve, as one run without rounds


def test_given_costs_override_and_default_ignores_the_store(goldens, kolibri_home):
    benchcosts.save(entry())
    given = probe(goldens, "--costs", "1,1.1", "--json")
    assert json.loads(given.stdout)["pricing"]["source"] == "given" and "note" not in given.stderr
    guess = probe(goldens, "--costs", "default", "--json")
    doc = json.loads(guess.stdout)
    assert (doc["pricing"]["source"], doc["pricing"]["reason"]) == ("guess", "--costs default")
    assert doc["config"]["costs"] == "default" and "note" not in guess.stderr  # asked for
    assert doc["runs"][0]["modelled_speedup"] == pytest.approx(speedup(GUESSED_COSTS))


@pytest.mark.parametrize("stored", [entry(sha="b" * 64), entry(threads=1),
                                    entry(numerics="q8_0")])
def test_a_bench_of_another_model_threads_or_numerics_is_not_used(goldens, kolibri_home, stored):
    benchcosts.save(stored)
    r = probe(goldens, "--threads", "2", "--json")
    doc = json.loads(r.stdout)
    assert doc["pricing"]["source"] == "guess"
    assert doc["runs"][0]["modelled_speedup"] == pytest.approx(speedup(GUESSED_COSTS))
    assert r.stderr.count("note") == 1 and r.stderr.endswith(
        f"note: c(n) is a guess (the default model's on {GUESS_HOST}): no kolibri bench "
        "of m --threads 2 stored: `kolibri bench -m m --threads 2` measures this host\n")


@pytest.mark.parametrize("content", ['{"format": 1, "entries": [{', '{"format": 2}',
                                     json.dumps({"format": 1, "entries": [
                                         entry().to_json() | {"costs": {"1": 1.0, "2": -1}}]})])
def test_a_damaged_store_is_one_note_and_the_guess(goldens, kolibri_home, content):
    kolibri_home.mkdir(parents=True, exist_ok=True)
    benchcosts.path().write_text(content)
    r = probe(goldens, "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["pricing"]["source"] == "guess"
    assert r.stderr.count("note") == 1 and "Traceback" not in r.stderr
    assert f"ignoring them: {benchcosts.path()} is not a kolibri bench costs file" in r.stderr
    with pytest.raises(KolibriError, match="delete it"):
        benchcosts.load()
    notes = []
    benchcosts.save(entry(), notes.append)  # bench replaces what it cannot read, and says so
    assert benchcosts.load() == [entry()] and "replacing it" in notes[0]


def test_save_keeps_one_entry_per_key_and_writes_atomically(kolibri_home, monkeypatch):
    """A save that fails halfway leaves the previous file whole and no temporary behind."""
    benchcosts.save(entry())
    benchcosts.save(entry(threads=1))
    newer = BenchCosts("m", SHA, 2, "float32", {1: 1.0, 2: 1.2}, "2026-12-01T00:00:00+00:00",
                       kolibri_cli.__version__, "def", "a cpu", benchcosts.kernel_id())
    saved = benchcosts.save(newer)  # another commit: its own c(n), the older run kept beside
    assert saved == newer and [r.commit for r in saved.runs] == ["abc", "def"]
    assert benchcosts.load() == [entry(threads=1), newer]
    before = benchcosts.path().read_bytes()
    write_text = pathlib.Path.write_text

    def dies_halfway(self, text, *args, **kwargs):
        write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched, pytest.raises(KolibriError):
        patched.setattr(pathlib.Path, "write_text", dies_halfway)
        benchcosts.save(entry(sha="c" * 64))
    assert benchcosts.path().read_bytes() == before  # the old file whole, no half of the new
    assert sorted(p.name for p in kolibri_home.iterdir()) == ["bench-costs.json", "locks"]


def test_runs_of_the_same_kernel_are_kept_and_priced_by_their_median(kolibri_home):
    """`kolibri bench --k 1` after `--k 3` on the same kolibri, kernel and CPU keeps c(3..4)
    beside its c(2), and c(2) is the median of both runs, not the last one's. Another commit,
    CPU or kernel prices with its own runs alone; the older runs stay as history."""
    wide = entry()
    benchcosts.save(wide)
    narrow = entry(costs={1: 1.0, 2: 1.7}, at="2026-12-01T00:00:00+00:00")
    merged = dataclasses.replace(narrow, costs={**wide.costs, 2: 1.6})
    assert benchcosts.save(narrow) == merged and benchcosts.load() == [merged]
    wider = entry(costs={**wide.costs, 5: 2.8}, at="2026-12-01T01:00:00+00:00")
    assert benchcosts.save(wider) == wider  # c(2): the median of 1.5, 1.7, 1.5
    (kept,) = benchcosts.load()
    assert len(kept.runs) == 3 and kept.rounds == (wide.costs, narrow.costs, wider.costs)
    for other in (dataclasses.replace(entry(costs={1: 1.0, 2: 1.1}), cpu="b cpu"),
                  entry(costs={1: 1.0, 2: 1.2}, kernel="engine-0123 znver3 ")):
        saved = benchcosts.save(other)
        assert saved == other and benchcosts.load() == [other]
        assert saved.rounds == (other.costs,) and len(saved.runs) > 3  # history kept


def test_rounds_are_kept_with_their_provenance_and_carried_into_the_pricing(kolibri_home):
    from kolibri_cli.costs.pricing import for_model

    rounds = ({1: 1.0, 2: 1.4, 3: 1.8}, {1: 1.0, 2: 1.6, 3: 2.0}, {1: 1.0, 2: 1.5, 3: 2.3})
    timed = dataclasses.replace(entry(costs={1: 1.0, 2: 1.5, 3: 2.0}))
    timed = dataclasses.replace(timed, runs=(benchcosts._run_of(timed, rounds),))
    benchcosts.save(timed)
    doc = json.loads(benchcosts.path().read_text())
    assert doc["format"] == 2
    (run,) = doc["entries"][0]["runs"]
    assert run["rounds"][1] == {"1": 1.0, "2": 1.6, "3": 2.0}
    assert (run["kernel"], run["measured_at"]) == (timed.kernel, timed.measured_at)
    pricing = for_model("m", SHA, "float32", 2)
    assert pricing.costs == {1: 1.0, 2: 1.5, 3: 2.0} and pricing.rounds == rounds
    curves = pricing.curves(3, 500)  # [500, 4]: medians of resampled rounds
    assert set(np.round(curves[:, 2], 6)) <= {1.4, 1.5, 1.6} and curves[:, 2].std() > 0


def test_bench_stores_what_it_measured(kolibri_home, tmp_path):
    from kolibri_cli.store import cache, synthetic
    from kolibri_cli.store.models import default_numerics_of

    gguf = tmp_path / "tiny.gguf"
    synthetic.write(gguf, n_layers=1, d=256, ff=512, heads=4, kv_heads=2, vocab=300,
                    context=256, types=lambda kind, layer, n: "Q4_1")
    cache.import_gguf(gguf, "tiny")
    r = CliRunner().invoke(app, ["bench", "-m", "tiny", "--repeats", "1", "--k", "2",
                                 "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    measured = doc["costs"]
    (stored,) = benchcosts.load()
    sha = cache.provenance(cache.resolve("tiny", pull_missing=False))["gguf_sha256"]
    assert (stored.model, stored.model_sha256, stored.threads, stored.numerics) == (
        "tiny", sha, 1, doc["numerics"])  # the path that ran: Q4_1's default (int16 on AVX2)
    assert doc["numerics"] == default_numerics_of("tiny")
    assert {str(n): c for n, c in stored.costs.items()} == measured and list(measured) == [
        "1", "2", "3"]
    assert stored.kolibri and stored.cpu and stored.measured_at.startswith("20")
    assert stored.kernel == benchcosts.kernel_id() and benchcosts.timed_here(stored)
    assert f"kept c(n) in {benchcosts.path()}" in r.stderr
    r = CliRunner().invoke(app, ["bench", "-m", "tiny", "--repeats", "1", "--k", "1",
                                 "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    (merged,) = benchcosts.load()  # a narrower run of the same kernel keeps c(3) beside its own
    assert list(merged.costs) == [1, 2, 3] and merged.costs[3] == stored.costs[3]
    second = json.loads(r.stdout)["costs"]["2"]  # c(2): the median of both runs' rounds
    assert merged.costs[2] == pytest.approx((stored.costs[2] + second) / 2)
    assert [len(run.rounds) for run in merged.runs] == [1, 1]
    assert "with c(n) for n = 3..3 kept from an earlier run of this kernel" in r.stderr


def test_bench_no_save_keeps_nothing(kolibri_home, tmp_path):
    from kolibri_cli.store import cache, synthetic

    gguf = tmp_path / "tiny.gguf"
    synthetic.write(gguf, n_layers=1, d=256, ff=512, heads=4, kv_heads=2, vocab=300,
                    context=256, types=lambda kind, layer, n: "Q4_1")
    cache.import_gguf(gguf, "tiny")
    r = CliRunner().invoke(app, ["bench", "-m", "tiny", "--repeats", "1", "--k", "1",
                                 "--threads", "1", "--no-save", "--json"])
    assert r.exit_code == 0, r.output
    assert benchcosts.load() == [] and "kept c(n)" not in r.stderr


def test_measure_lets_the_guard_time_its_own_costs_unless_given(goldens):
    from kolibri_cli.costs.pricing import Pricing
    from kolibri_cli.probe.measure import live_runs
    from kolibri_cli.probe.replay.shards import sweep

    runs = sweep([], [3], [(1, 2)], ["guard", "adaptive"], costs={1: 1.0, 2: 1.5})
    for source, guard_costs in (("bench", None), ("guess", None), ("given", {1: 1.0, 2: 1.5})):
        guard, adaptive = live_runs(runs, Pricing(source, {1: 1.0, 2: 1.5}))
        assert guard.costs == guard_costs and adaptive.costs == {1: 1.0, 2: 1.5}


def test_probe_toml_asks_for_the_guess_and_reports_name_the_source(goldens, kolibri_home,
                                                                    tmp_path):
    benchcosts.save(entry())
    toml = tmp_path / "PROBE.toml"
    toml.write_text(f'goldens = ["{goldens.name}"]\ncosts = "default"\nmarkdown = "r.md"\n')
    r = CliRunner().invoke(app, ["probe", str(toml), "--json"])
    assert json.loads(r.stdout)["pricing"]["source"] == "guess", r.stderr
    shown = f"c(2)={GUESSED_COSTS[2]:.2f}"
    assert f"Predicted speedups priced with c(n) guessed (--costs default): {shown}" in (
        tmp_path / "r.md").read_text()
    r = CliRunner().invoke(app, ["probe", "--goldens", str(goldens), "--markdown",
                                 str(tmp_path / "b.md")])
    text = (tmp_path / "b.md").read_text()
    assert "priced with c(n) from kolibri bench of m (float32, 2 threads" in text
    command = next(line for line in text.split("\n") if line.startswith("Regenerate"))
    assert "--costs" not in command  # the regenerating command adds no --costs


def test_probe_costs_measure_times_c_n_on_the_goldens_model_and_prices_with_them(
        kolibri_home, tiny_llama_folder, tmp_path, monkeypatch):
    """`kolibri probe --costs measure` end to end: c(n) timed now, on the goldens' model, for
    every row count the run verifies, kept with its rounds, and every prediction priced with
    their median."""
    from kolibri_cli.costs import timing
    from kolibri_cli.engine import loader
    from kolibri_cli.probe.run import MEASURE_REPEATS

    folder = tiny_llama_folder()
    sha = loader.sha256_files(loader.safetensors_files(folder))
    path = tmp_path / "tiny.jsonl"
    pattern = [7, 8, 9, 7, 8, 3, 7, 8, 9, 4] * 3
    path.write_text("".join(json.dumps(
        {"id": f"g{i}", "category": "c", "prompt": "p", "chat": False,
         "prompt_ids": [7, 8, 9, i], "output_ids": pattern + [i] * 3, "model": str(folder),
         "model_sha256": sha, "reference": {}}) + "\n" for i in range(5)))
    timed = []
    real = timing.forward_rounds

    def spy(*args, **kwargs):
        timed.append(real(*args, **kwargs))
        return timed[-1]

    monkeypatch.setattr(timing, "forward_rounds", spy)
    r = CliRunner().invoke(app, ["probe", "--goldens", str(path), "--k", "1,3", "--window",
                                 "1-2", "--costs", "measure", "--model", str(folder),
                                 "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    (rounds,) = timed  # one timing run, every row count verified: 1 + k up to 4
    assert sorted(rounds) == [1, 2, 3, 4] and len(rounds[1]) == MEASURE_REPEATS
    doc = json.loads(r.stdout)
    per_round = [{n: t[i] / rounds[1][i] for n, t in rounds.items()}
                 for i in range(MEASURE_REPEATS)]
    median = benchcosts.median_costs(per_round)
    assert doc["pricing"]["source"] == "run" and doc["pricing"]["rounds"] == MEASURE_REPEATS
    assert doc["pricing"]["costs"] == {str(n): pytest.approx(c) for n, c in median.items()}
    for run in doc["runs"]:  # every prediction priced with them
        plain = sum(g["plain_steps"] for g in run["goldens"])
        spec = sum(median[1 + d] for g in run["goldens"] for d in g["draft_lengths"])
        assert run["predicted_speedup"] == pytest.approx(plain / spec)
    (kept,) = benchcosts.load()  # kept for later runs, with their rounds
    assert kept.model_sha256 == sha and len(kept.rounds) == MEASURE_REPEATS
    assert "timing c(n) of" in r.stderr
