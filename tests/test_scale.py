"""The probe at scale: goldens streamed from plain, gzip and zstd JSONL and folders of shards,
cut into pieces that cover every line once; the same totals, categories and per-chain rows from
one process, from local worker processes and from Ray, for every proposer; the CLI's --workers,
--rows, progress and throughput."""

import dataclasses
import gzip
import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.decode import proposers as registry
from kolibri_cli.errors import KolibriError
from kolibri_cli.goldens.chains import DEFAULT_CHAT
from kolibri_cli.goldens.stream import (
    Piece,
    find_golden_files,
    iter_goldens,
    limit_stops,
    plan_pieces,
    read_piece,
)
from kolibri_cli.probe.config import ProbeConfig
from kolibri_cli.probe.replay import shards as shard
from kolibri_cli.probe.simulate import merge_counts
from kolibri_cli.probe.workers import Processes

SHIPPED = [json.loads(line) for line in DEFAULT_CHAT.read_text().splitlines() if line.strip()]
PROPOSERS = list(registry.PROPOSERS)  # every proposer kolibri has


def trace_lines(n: int, seed: int = 0, start: int = 0) -> list[str]:
    """n goldens made from the shipped ones: outputs cut at varied lengths, unique ids, and
    now and then a blank line."""
    rng = random.Random(seed)
    lines = []
    for i in range(start, start + n):
        obj = dict(SHIPPED[i % len(SHIPPED)])
        obj["id"] = f"{obj['id']}-{i}"
        obj["output_ids"] = obj["output_ids"][: rng.randint(1, len(obj["output_ids"]))]
        lines.append(json.dumps(obj) + "\n" + ("\n" if rng.random() < 0.05 else ""))
    return lines


def write(path: Path, lines: list[str]) -> Path:
    data = "".join(lines).encode()
    if path.suffix == ".gz":
        data = gzip.compress(data)
    elif path.suffix == ".zst":
        zstandard = pytest.importorskip("zstandard")
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def shards(folder: Path, plain: int, gzipped: int) -> Path:
    """A folder of shards: plain JSONL, gzip-compressed, and a prompt file."""
    write(folder / "a.jsonl", trace_lines(plain, seed=1))
    write(folder / "b.jsonl.gz", trace_lines(gzipped, seed=2, start=plain))
    (folder / "prompts.jsonl").write_text('{"id": 1, "category": "c", "prompt": "hi"}\n')
    return folder


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> Path:
    """3,000 goldens in shards: past ROWS_IN_REPORT, where the report drops per-chain rows."""
    return shards(tmp_path_factory.mktemp("traces"), 1800, 1200)


REPLAYED = 600  # chains of `replays`


@pytest.fixture(scope="module")
def replays(tmp_path_factory) -> Path:
    """600 goldens in shards, for the laws every proposer is replayed for (one process, worker
    processes, Ray): still 13 pieces of the plain file at 64 KiB, the gzip file whole, each file
    whole for the ordered proposers, and each replay of every proposer a fifth of 3,000's."""
    return shards(tmp_path_factory.mktemp("replays"), 360, 240)


def probe_config(folder: Path, **changes) -> ProbeConfig:
    return ProbeConfig(**{"goldens": [folder], "k": [5], "window": [(1, 4)],
                          "proposer": PROPOSERS} | changes)


def outcome(runs) -> list:
    return [(r.proposer, r.k, r.window, r.chains, r.total, r.categories, r.streams) for r in runs]


# ---- streaming input --------------------------------------------------------------------------


def test_folders_pieces_and_formats_read_every_golden_once(tmp_path):
    lines = trace_lines(300, seed=5)
    plain = write(tmp_path / "t.jsonl", lines)
    expected = [json.loads(line)["id"] for line in lines if line.strip()]
    for name in ("t.jsonl.gz", "t.jsonl.zst"):
        assert [g.id for g in iter_goldens([write(tmp_path / name, lines)])] == expected
    for size in (1, 500, 4096, 10**9):  # pieces start at line starts and cover the file
        pieces = plan_pieces([plain], size)
        assert [g.id for p in pieces for g in read_piece(p)] == expected
    assert len(plan_pieces([plain], 4096)) > 10
    assert len(plan_pieces([tmp_path / "t.jsonl.gz"], 4096)) == 1  # no seeking in gzip
    (tmp_path / "prompts.jsonl").write_text('{"id": 1, "category": "c", "prompt": "hi"}\n')
    found = find_golden_files([tmp_path])
    assert [p.name for p in found] == ["t.jsonl", "t.jsonl.gz", "t.jsonl.zst"]


def test_a_bad_line_in_a_later_piece_names_its_line(tmp_path):
    lines = trace_lines(200)
    lines[150] = '{"id": "x", "category": 3}\n'
    path = write(tmp_path / "t.jsonl", lines)
    line_no = sum(line.count("\n") for line in lines[:150]) + 1
    with pytest.raises(KolibriError, match=rf"t.jsonl:{line_no}: missing field"):
        for piece in plan_pieces([path], 2000):
            list(read_piece(piece))
    bad = write(tmp_path / "bad.jsonl.gz", ["{nope\n"])
    with pytest.raises(KolibriError, match=r"bad.jsonl.gz:1: not JSONL"):
        list(read_piece(Piece(str(bad))))
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(KolibriError, match="empty.jsonl: the file is empty"):
        plan_pieces([tmp_path / "empty.jsonl"])


def test_limit_and_category_stop_reading_where_the_limit_is_reached(tmp_path):
    a = write(tmp_path / "a.jsonl", trace_lines(40, seed=1))
    b = write(tmp_path / "b.jsonl.gz", trace_lines(40, seed=2, start=40))
    wanted = [g.id for g in iter_goldens([a, b]) if g.category == "code"][:9]
    stops = limit_stops([a, b], lambda g: g.category == "code", 9)
    pieces = plan_pieces([a, b], 700, stops)
    assert [g.id for p in pieces for g in read_piece(p) if g.category == "code"] == wanted


# ---- the same counts whatever runs them -------------------------------------------------------


@pytest.fixture(scope="module")
def one_process(replays):
    """Every proposer over `replays` in small pieces, and suffix --cross-request (one ordered
    stream per file), replayed here: what workers and Ray must reproduce."""
    every = shard.plan_tasks(probe_config(replays), rows_json=True, piece_bytes=64 << 10)
    assert len(every) > 10 and any(t.configs[0].ordered for t in every)
    cross = shard.plan_tasks(probe_config(replays, proposer=["suffix"], cross_request=True),
                             rows_json=True, piece_bytes=64 << 10)
    assert len(cross) == 2 and all(t.piece.whole and t.configs[0].ordered for t in cross)
    out = []
    for tasks in (every, cross):
        tasks = [dataclasses.replace(t, fast_path=True) for t in tasks]  # small pieces, compiled
        rows = []
        out.append((tasks, shard.simulate_tasks(tasks, on_rows=rows.append)[0], b"".join(rows)))
    return out


def test_one_process_equals_the_in_memory_simulation(replays, one_process):
    """Pieces, batches and the compiled replays change nothing: each file replayed in memory
    (one stream each, as ordered proposers take them) gives the same counts."""
    _, runs, rows = one_process[0]
    cfg = probe_config(replays)
    per_file = [shard.sweep(list(iter_goldens([path])), cfg.k, cfg.window, cfg.proposer)
                for path in find_golden_files([replays])]
    assert len(per_file) == 2 and runs[0].chains == REPLAYED
    for run, (a, b) in zip(runs, zip(*per_file, strict=True), strict=True):
        assert run.total.verify_passes == a.total.verify_passes + b.total.verify_passes
        assert run.total.drafted_at == [x + y for x, y in zip(a.total.drafted_at,
                                                              b.total.drafted_at, strict=True)]
        assert run.streams == (2 if run.ordered else 0)
        assert run.ordered == registry.make_proposer(run.proposer, 5, (1, 4)).shares_state
    assert len(rows.splitlines()) == REPLAYED * len(runs)


def test_worker_processes_equal_one_process(one_process):
    for tasks, expected, expected_rows in one_process:
        rows = []
        with Processes(2) as pool:
            runs, throughput = shard.simulate_tasks(tasks, pool.run_all, on_rows=rows.append,
                                                    workers=2)
        assert outcome(runs) == outcome(expected) and b"".join(rows) == expected_rows
        assert throughput.replays == REPLAYED * len(runs) and throughput.workers == 2


def test_ray_equals_one_process(one_process):
    """A local Ray instance, the code path of a cluster: the same totals, categories, streams
    and rows for every proposer and for suffix --cross-request."""
    pytest.importorskip("ray")
    from kolibri_cli.probe.workers import RayCluster

    with RayCluster("local", 2) as cluster:
        for tasks, expected, expected_rows in one_process:
            rows = []
            runs, throughput = shard.simulate_tasks(tasks, cluster.run_all,
                                                    on_rows=rows.append, workers=cluster.workers)
            assert outcome(runs) == outcome(expected) and b"".join(rows) == expected_rows
            assert throughput.workers == 2 and throughput.replays == REPLAYED * len(runs)


def test_cross_request_suffix_is_one_stream_per_file(replays, one_process):
    """Each file is one server's traffic: its global tree starts empty and grows in order."""
    _, (run,), _ = one_process[1]
    alone = [shard.simulate(list(iter_goldens([f])), 5, (1, 4), "suffix", cross_request=True)
             for f in find_golden_files([replays])]
    assert run.ordered and run.streams == 2 and run.chains == REPLAYED
    assert run.total == merge_counts([a.total for a in alone], 5)


class Remembering(registry.Proposer):
    """A proposer that says nothing about state across requests (as a new one might not)."""

    name = "remembering"

    def __init__(self, k: int, window_min: int, window_max: int):
        self.k, self.seen = k, 0

    def propose(self, context, max_tokens: int) -> list[int]:
        self.seen += 1
        return list(context[-1:]) * min(max_tokens, self.seen % 3)


def test_a_proposer_that_does_not_declare_fresh_state_is_replayed_in_order(traces, monkeypatch):
    """Whether chains may be spread over workers is the proposer's own property: one that does
    not declare `shares_state = False` is replayed as one ordered stream per file, and the
    report says so."""
    monkeypatch.setitem(registry.PROPOSERS, "remembering", Remembering)
    cfg = probe_config(traces, proposer=["remembering", "vllm"])
    tasks = shard.plan_tasks(cfg, piece_bytes=64 << 10)
    ordered = [t for t in tasks if t.configs[0].proposer == "remembering"]
    assert len(ordered) == 2 and all(t.piece.whole for t in ordered)
    assert len(tasks) > 10  # vllm's: pieces of the plain file, the gzip file whole
    (run, _), _ = shard.simulate_tasks(tasks)
    alone = [shard.simulate(list(iter_goldens([f])), 5, (1, 4), "remembering")
             for f in find_golden_files([traces])]
    assert run.ordered and run.streams == 2
    assert run.total == merge_counts([a.total for a in alone], 5)
    assert run.total.drafts_proposed > 0
    # (--workers 1: spawned workers would not know a proposer registered by this test)
    result = probe("--goldens", traces, "--proposer", "remembering", "--workers", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["runs"][0]["ordered_streams"] == 2


def test_spread_over_sampling_seeds_needs_no_per_chain_rows(tmp_path):
    """Sampled chains: counts per seed and category are kept while streaming, so the spread over
    seeds at scale (no per-chain rows) is the in-memory one."""
    from kolibri_cli.probe.seeds import seed_spread

    lines = [json.loads(line) for line in trace_lines(1500, seed=7)]
    for i, obj in enumerate(lines):
        obj["sampling"] = {"temperature": 0.7, "top_p": 0.9, "seed": i % 3}
    write(tmp_path / "s.jsonl", [json.dumps(obj) + "\n" for obj in lines])
    tasks = shard.plan_tasks(probe_config(tmp_path, proposer=["vllm"]), piece_bytes=64 << 10)
    (streamed,), _ = shard.simulate_tasks(tasks)
    in_memory = shard.simulate(list(iter_goldens([tmp_path / "s.jsonl"])), 5, (1, 4))
    assert streamed.goldens is None and len(in_memory.goldens) == 1500
    assert seed_spread(streamed) == seed_spread(in_memory) is not None
    assert sorted(streamed.by_seed) == [0, 1, 2]


# ---- the command line -------------------------------------------------------------------------


def probe(*args):
    return CliRunner().invoke(app, ["probe", *map(str, args)])


def test_cli_workers_and_rows_files_are_identical(traces, tmp_path, monkeypatch):
    monkeypatch.setattr(shard, "PIECE_BYTES", 256 << 10)
    args = ["--goldens", traces, "--proposer", "vllm,llamacpp-simple", "--k", "3", "--json"]
    one = probe(*args, "--workers", "1", "--rows", tmp_path / "one.jsonl")
    two = probe(*args, "--workers", "2", "--rows", tmp_path / "two.jsonl")
    assert one.exit_code == 0 and two.exit_code == 0, one.stderr + two.stderr
    a, b = json.loads(one.stdout), json.loads(two.stdout)
    assert a["runs"] == b["runs"] and a["throughput"]["workers"] == 1
    assert b["throughput"]["executor"] == "processes" and b["throughput"]["workers"] == 2
    assert a["runs"][0]["goldens"] is None and a["runs"][0]["chains"] == 3000  # at scale
    rows = (tmp_path / "one.jsonl").read_bytes()
    assert rows == (tmp_path / "two.jsonl").read_bytes()
    parsed = [json.loads(line) for line in rows.splitlines()]
    assert len(parsed) == 2 * 3000
    vllm = [r for r in parsed if r["proposer"] == "vllm"]
    assert sum(r["verify_passes"] for r in vllm) == a["runs"][0]["total"]["verify_passes"]
    assert len(vllm[0]["draft_lengths"]) == vllm[0]["verify_passes"]


def test_cli_progress_and_throughput_on_stderr(traces, monkeypatch):
    from kolibri_cli.cli.render import probe as render_probe

    bar = render_probe.throughput_bar
    monkeypatch.setattr(render_probe, "throughput_bar", lambda: bar(delay=0.0))
    result = probe("--goldens", traces, "--workers", "2")
    assert result.exit_code == 0, result.stderr
    assert "simulated 3,000 chains: " in result.stderr and "steps/s" in result.stderr
    assert "2 processes" in result.stderr
    assert "per-golden rows of 3,000 chains not shown" in " ".join(result.stdout.split())


def test_cli_rows_file_is_not_left_half_written(traces, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    write(bad / "a.jsonl", trace_lines(50))
    write(bad / "b.jsonl", ["{nope\n"])
    result = probe("--goldens", bad, "--rows", tmp_path / "rows.jsonl")
    assert result.exit_code == 1 and result.stdout == ""
    assert "b.jsonl:1: not JSONL" in result.stderr
    assert not (tmp_path / "rows.jsonl").exists() and not list(tmp_path.glob(".rows*"))


def test_cli_ray_without_ray_installed_is_one_line(traces, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    result = probe("--goldens", traces, "--ray")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == "error: --ray needs Ray: pip install 'kolibri-cli[ray]'\n"


def test_cli_small_input_keeps_rows_and_one_process(kolibri_home, no_throughput_line):
    # the guess asked for: without it, pricing notes (on stderr) depend on what benches the
    # home holds
    result = probe("--json", "--costs", "default")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["throughput"]["executor"] == "local" and len(doc["runs"][0]["goldens"]) == 18
    assert result.stderr == ""
