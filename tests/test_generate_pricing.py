"""c(n) that `kolibri generate` / `chat` give the adaptive proposers: `--costs`, else the c(n)
`kolibri bench` stored for the loaded model at the threads and numerics it runs with, else the
guess, chosen as the probe chooses (costs/pricing.py); speculative output stays plain output."""

import itertools
import json
import re

import pytest
from typer.testing import CliRunner

import kolibri_cli
from kolibri_cli.cli import app
from kolibri_cli.costs import store as benchcosts
from kolibri_cli.costs.model import GUESSED_COSTS
from kolibri_cli.costs.pricing import for_model
from kolibri_cli.costs.store import BenchCosts
from kolibri_cli.decode.proposers import AdaptiveProposer
from kolibri_cli.engine import loader
from kolibri_cli.engine.jit import get_threads

FLAT = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0, 6: 1.0}  # drafting is free: every match drafts
STEEP = {1: 1.0, 2: 50.0, 3: 100.0}  # a draft costs 50 steps: no match pays for one
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


COMMITS = itertools.count()


def stored(sha: str, costs: dict, threads: int | None = None, numerics: str = "float32"):
    """A bench entry as a new kernel's bench stores it (its own commit): it replaces the entry
    of the same key even when it times fewer rows."""
    benchcosts.save(BenchCosts("tiny", sha, threads or get_threads(), numerics, costs,
                               benchcosts.now(), kolibri_cli.__version__, f"c{next(COMMITS)}",
                               "a cpu", benchcosts.kernel_id()))


def generate(folder, *args):
    return CliRunner().invoke(app, ["generate", "--model", str(folder), "--raw", "-n", "60",
                                    "--compare", "--proposer", "adaptive", *args, "--json",
                                    "abcabcabcabc"])


def spec_of(r) -> dict:
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["identical"] and doc["spec"]["output_ids"] == doc["plain"]["output_ids"]
    return doc["spec"]


@pytest.fixture
def tiny(tiny_llama_folder):
    folder = tiny_llama_folder()
    return folder, loader.sha256_files(loader.safetensors_files(folder))


def test_adaptive_drafts_by_the_stored_bench_of_the_loaded_model(kolibri_home, tiny):
    folder, sha = tiny
    drafted = {}
    for name, costs in (("flat", FLAT), ("steep", STEEP)):
        stored(sha, costs)  # replaces the entry of the same model, threads and numerics
        spec = spec_of(r := generate(folder))
        assert spec["pricing"]["source"] == "bench" and "note" not in r.stderr
        assert spec["pricing"]["costs"] == {str(n): c for n, c in costs.items()}
        assert spec["pricing"]["bench"]["threads"] == get_threads()
        drafted[name] = spec["stats"]["drafts_proposed"]
    assert drafted["flat"] > 10 and drafted["steep"] == 0  # the stored c(n) decided the drafts
    given = spec_of(generate(folder, "--costs", ",".join(map(str, FLAT.values()))))
    assert given["pricing"]["source"] == "given"  # --costs overrides the store...
    assert given["stats"]["drafts_proposed"] == drafted["flat"]  # ...and reproduces its run


@pytest.mark.parametrize("other", ["threads", "numerics", "model"])
def test_a_bench_of_other_threads_numerics_or_model_is_not_used(kolibri_home, tiny, other):
    folder, sha = tiny
    stored("b" * 64 if other == "model" else sha, STEEP,
           threads=get_threads() + 1 if other == "threads" else None,
           numerics="q8_0" if other == "numerics" else "float32")
    r = generate(folder)
    spec = spec_of(r)
    assert spec["pricing"]["source"] == "guess" and spec["stats"]["drafts_proposed"] > 0
    assert spec["pricing"]["costs"] == {str(n): c for n, c in GUESSED_COSTS.items()}
    assert r.stderr.count("note") == 1 and (
        f"no kolibri bench of {folder} --threads {get_threads()} stored: `kolibri bench -m "
        f"{folder} --threads {get_threads()}` measures this host\n") in r.stderr


def test_costs_default_is_the_guess_without_a_note(kolibri_home, tiny):
    folder, sha = tiny
    stored(sha, STEEP)
    r = generate(folder, "--costs", "default")
    spec = spec_of(r)
    assert (spec["pricing"]["source"], spec["pricing"]["reason"]) == ("guess", "--costs default")
    assert "note" not in r.stderr and spec["stats"]["drafts_proposed"] > 0


def test_proposers_without_costs_report_no_pricing(kolibri_home, tiny):
    folder, _ = tiny
    for args in (["--proposer", "vllm"], ["--proposer", "guard"]):  # the guard times its own
        assert "pricing" not in spec_of(generate(folder, *args))
    given = spec_of(generate(folder, "--proposer", "guard", "--costs", "1,1.5"))
    assert given["pricing"]["source"] == "given"  # as the probe's --measure runs it


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize("args, fragment", [
    (["--costs", "1,x"], "--costs must be finite positive numbers c(1),c(2),... (e.g. "
     "1,1.05,1.1) or default, got '1,x'"),
    (["--costs", ""], "--costs must be finite positive numbers"),
    (["--costs", "1,nan"], "got '1,nan'"),
    (["--costs", "1,0"], "got '1,0'"),
    (["--proposer", "vllm", "--costs", "1,2"],
     "--costs prices adaptive, adaptive-tree and guard; --proposer vllm drafts without c(n)"),
])
def test_bad_costs_are_one_error_line_before_a_model_loads(kolibri_home, command, args,
                                                           fragment):
    prompt = ["hi"] if command == "generate" else []
    r = CliRunner().invoke(app, [command, "--model", "/nonexistent", "--proposer", "adaptive",
                                 *args, *prompt])
    assert r.exit_code != 0 and r.stdout == "" and "Traceback" not in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and fragment in r.stderr


def test_chat_drafts_adaptive_by_the_stored_bench(kolibri_home, tiny):
    folder, sha = tiny
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHATML}))

    def drafts() -> tuple[int, str]:
        r = CliRunner().invoke(app, ["chat", "--model", str(folder), "--proposer", "adaptive",
                                     "--spec", "-n", "60"], input="abcabcabcabc\n")
        assert r.exit_code == 0, r.output
        return int(re.search(r"/(\d+) drafts accepted", r.stderr)[1]), r.stderr

    guessed, stderr = drafts()
    assert "note: c(n) is a guess" in stderr
    counts = {}
    for name, costs in (("flat", FLAT), ("steep", STEEP)):
        stored(sha, costs)
        counts[name], stderr = drafts()
        assert "note" not in stderr
    assert counts["flat"] > guessed >= counts["steep"] and counts["flat"] > counts["steep"]


def test_the_chooser_keys_on_numerics_and_threads(kolibri_home):
    stored("a" * 64, FLAT, threads=2, numerics="q8_0")
    assert for_model("m", "a" * 64, "q8_0", 2).costs == FLAT
    assert for_model("m", "a" * 64, "q8_0", None).source == "bench"  # any threads
    missed = for_model("m", "a" * 64, "float32", 2)
    assert missed.source == "guess" and "`kolibri bench -m m --threads 2`" in missed.note
    missed = for_model("m", "a" * 64, "q8_0", 1)
    assert "`kolibri bench -m m --quantize q8_0 --threads 1`" in missed.note


def test_the_probe_prices_the_path_its_model_runs_by_default(kolibri_home, tmp_path,
                                                             monkeypatch):
    """The probe prices the goldens' model with the c(n) of the numeric path --measure would run
    (int16 for a model of Q4_1/Q8_0 blocks on a CPU with AVX2 and F16C), never float32's in its
    place; with none stored for that path, the guess, and the hint names the path."""
    pytest.importorskip("gguf")
    from test_block_models import tiny_gguf

    from kolibri_cli.costs.pricing import for_goldens
    from kolibri_cli.engine import simd8
    from kolibri_cli.store import cache

    monkeypatch.setattr(simd8, "TARGET_AVX2", True)
    monkeypatch.setattr(simd8, "F16C", True)
    tiny_gguf(tmp_path / "t.gguf",
              lambda kind, layer, n: "Q8_0" if kind == "token_embd" else "Q4_1")
    name, folder = cache.import_gguf(tmp_path / "t.gguf", "tiny")
    sha = cache.provenance(folder)["gguf_sha256"]
    stored(sha, STEEP, threads=2, numerics="float32")
    missed = for_goldens(None, {(name, sha)}, 2)
    assert missed.source == "guess" and "no kolibri bench of tiny --threads 2" in missed.reason
    stored(sha, FLAT, threads=2, numerics="int16")
    found = for_goldens(None, {(name, sha)}, 2)
    assert found.source == "bench" and found.costs == FLAT and found.bench.numerics == "int16"
    assert "(int16, 2 threads" in found.source_text()
    monkeypatch.setattr(simd8, "TARGET_AVX2", False)  # without AVX2 the probe's model: float32
    assert for_goldens(None, {(name, sha)}, 2).costs == STEEP
    assert "`kolibri bench -m tiny --threads 2`" in for_model(name, "b" * 64, "float32", 2).note
    monkeypatch.setattr(simd8, "TARGET_AVX2", True)  # the hint names a path not the default
    assert "`kolibri bench -m tiny --quantize float32 --threads 2`" in for_model(
        name, "b" * 64, "float32", 2).note


def test_stored_costs_flip_the_adaptive_decision():
    """The two tables the CLI tests store do decide differently on the same statistics."""
    flat, steep = AdaptiveProposer(5, 1, 4, costs=FLAT), AdaptiveProposer(5, 1, 4, costs=STEEP)
    assert flat.best_length(1, 5) == 5 and steep.best_length(1, 5) == 0


def test_a_folder_models_weights_are_hashed_once_until_a_file_changes(kolibri_home, tiny,
                                                                     monkeypatch):
    """Finding the stored bench of a user's folder needs its sha256: the first run reads the
    weights, later runs take the digest remembered by (path, size, mtime, inode); a changed
    file is read again, and its new digest used."""
    folder, sha = tiny
    reads = []
    real = loader.sha256_files
    monkeypatch.setattr(loader, "sha256_files", lambda paths: reads.append(paths) or real(paths))
    stored(sha, STEEP)
    for _ in range(2):
        spec = spec_of(generate(folder))
        assert spec["pricing"]["source"] == "bench"
    assert len(reads) == 1
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # the last byte of the last tensor: the same size, other weights
    weights.write_bytes(bytes(data))
    spec = spec_of(generate(folder))
    assert len(reads) == 2 and spec["pricing"]["source"] == "guess"  # no bench of new weights
    assert "no kolibri bench" in spec["pricing"]["reason"]


# ---- the guard's timings, kept from one run to the next ----------------------------------------


def test_the_guard_keeps_its_timings_and_the_next_run_starts_from_them(kolibri_home, tiny):
    """A first `generate --spec` calibrates from an empty table and keeps what it timed; the next
    run of the same kernel starts from those samples (a seeded table prices drafts at once),
    never another kernel's: other threads or another CPU start empty."""
    from kolibri_cli.costs import samples as guardcosts
    from kolibri_cli.costs.model import warm_table

    folder, sha = tiny
    assert warm_table(sha, "float32", get_threads())[1] == "none"
    spec_of(generate(folder, "--proposer", "guard"))
    table, source = warm_table(sha, "float32", get_threads())
    assert source == "kept" and table.measured(60)  # multi-token passes were timed
    kept = json.loads(guardcosts.path().read_text())["kernels"]
    assert list(kept) == [guardcosts.kernel_key(sha, "float32", get_threads())]
    assert warm_table(sha, "float32", get_threads() + 1)[1] == "none"
    assert warm_table(sha, "q8_0", get_threads())[1] == "none"
    spec_of(generate(folder, "--proposer", "guard"))  # warm (whether it drafts is the timings')
    again = warm_table(sha, "float32", get_threads())[0].cells()
    assert {(o, r) for o, r, _ in again} >= {(o, r) for o, r, _ in table.cells()}


def test_a_bench_of_this_kernel_starts_the_guard_when_it_kept_nothing(kolibri_home, tiny):
    from kolibri_cli.costs.model import warm_table

    folder, sha = tiny
    here = BenchCosts("tiny", sha, get_threads(), "float32", FLAT, benchcosts.now(),
                      kolibri_cli.__version__, benchcosts.source_commit(), benchcosts.cpu_model(),
                      benchcosts.kernel_id())
    benchcosts.save(here)
    table, source = warm_table(sha, "float32", get_threads())
    assert source == "bench" and table.relative(100, 6)[1:].tolist() == [1.0] * 6
    benchcosts.save(BenchCosts(**{**here.__dict__, "cpu": "another cpu"}))
    assert warm_table(sha, "float32", get_threads())[1] == "none"  # another host's kernel
    benchcosts.save(BenchCosts(**{**here.__dict__, "kernel": "engine-0123 znver3 "}))
    assert warm_table(sha, "float32", get_threads())[1] == "none"  # another kernel's


def test_unreadable_kept_timings_are_ignored_and_replaced(kolibri_home, tiny):
    from kolibri_cli.costs import samples as guardcosts
    from kolibri_cli.costs.model import CostTable, warm_table

    folder, sha = tiny
    key = guardcosts.kernel_key(sha, "float32", get_threads())
    bad_cells = [[6, 2, ["x"]], [6, 1, [1.2]], [-1, 3, [1.3]], [6, 4, [float("inf")]],
                 [6, 5, [10**400]], [True, 6, [1.5]], [6, 7, [1e-300]], [6, 8, [1e308]]]
    for text in ("{not json", json.dumps({"format": 99, "kernels": {}}),
                 *(json.dumps({"format": 1, "kernels": {key: entry}})
                   for entry in (5, [1], "cells", {"cells": 7}, {"cells": bad_cells}))):
        kolibri_home.mkdir(parents=True, exist_ok=True)
        guardcosts.path().write_text(text)
        assert warm_table(sha, "float32", get_threads())[1] == "none"
    good = CostTable.seeded([[6, 2, [1.3, 1.2]], [6, 3, "bad"], [6, 4, [1.5]]])
    assert good.cells() == [[6, 2, [1.3, 1.2]], [6, 4, [1.5]]]
    spec_of(generate(folder, "--proposer", "guard"))  # the bad file is written over
    assert warm_table(sha, "float32", get_threads())[1] == "kept"


def test_a_home_that_cannot_keep_the_timings_is_a_note_not_a_failure(kolibri_home, tiny):
    from kolibri_cli.costs import samples as guardcosts

    folder, _ = tiny
    (kolibri_home / "locks" / f"{guardcosts.FILE}.lock").mkdir(parents=True)  # cannot lock
    r = generate(folder, "--proposer", "guard")
    spec_of(r)  # the answer and its JSON are whole
    assert "note: the guard's timings were not kept: cannot write" in r.stderr
    assert not guardcosts.path().exists()


def test_costs_default_starts_the_guard_cold_and_keeps_nothing(kolibri_home, tiny):
    from kolibri_cli.costs import samples as guardcosts

    folder, _ = tiny
    spec_of(generate(folder, "--proposer", "guard", "--costs", "default"))
    assert not guardcosts.path().exists()
    spec_of(generate(folder, "--proposer", "guard"))
    kept = guardcosts.path().read_text()
    spec_of(generate(folder, "--proposer", "guard", "--costs", "default"))
    assert guardcosts.path().read_text() == kept  # read by neither, written by neither


def test_the_measured_probe_says_where_the_guards_costs_started(kolibri_home, tiny):
    """probe --measure starts its live guard from the kept timings, as generate does, and says
    so (JSON `guard_costs_from`, the tables): "none" before any run kept some, "kept" after."""
    from kolibri_cli.decode.generate import generate_plain
    from kolibri_cli.goldens.chains import Golden
    from kolibri_cli.probe.measure import measure_runs
    from kolibri_cli.probe.replay.shards import simulate
    from kolibri_cli.probe.report import GUARD_START
    from kolibri_cli.store.models import open_model

    folder, sha = tiny
    model = open_model(str(folder))
    prompt = [5, 6, 7] * 4
    goldens = [Golden("g", "c", "p", False, prompt, generate_plain(model, prompt, 20).output_ids,
                      "m", sha)]
    runs = [simulate(goldens, 8, (1, 4), "guard"), simulate(goldens, 3, (1, 4), "vllm"),
            simulate(goldens, 6, (1, 4), "guard", {1: 1.0, 2: 1.1})]
    starts = []
    for _ in range(2):
        measured = measure_runs(model, goldens, runs)
        starts.append([m.to_json()["guard_costs_from"] for m in measured.values()])
        spec_of(generate(folder, "--proposer", "guard"))  # keeps its timings
    assert starts == [["none", None, None], ["kept", None, None]]
    assert set(GUARD_START) == {"kept", "bench", "none"}
