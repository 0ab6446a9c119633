"""`kolibri bench --profile`: the kernel's own stamps change no bit of a forward, count every
parallel region it enters, and add up to the forward's time; the CLI reports each piece with
what it reads and computes."""

import json

import numpy as np
import pytest
from tiny_models import tiny_model

from kolibri_cli.bench import profile
from kolibri_cli.engine import clock
from kolibri_cli.store.models import default_numerics_of

REGIONS_PER_LAYER = 5  # qkv, attention, o, gate/up, down (the head: one more per forward)


def test_stamps_change_no_bits_and_count_each_region():
    """A profiled forward's logits equal the unprofiled forward's bitwise, at 1 and 6 tokens;
    every piece that runs gets time, each parallel piece spans no more than its own time."""
    tf = tiny_model(0).transformer
    ids = np.arange(1, 20) % 64
    for n in (1, 6):
        cache, again = tf.new_cache(32), tf.new_cache(32)
        tf.forward(ids[:10], 0, cache)
        tf.forward(ids[:10], 0, again)
        prof = clock.new_prof()
        got = tf.forward(ids[10:10 + n], 10, cache, prof=prof)
        assert np.array_equal(got, tf.forward(ids[10:10 + n], 10, again))
        layers = tf.config.num_hidden_layers
        assert prof[clock.REGIONS] == REGIONS_PER_LAYER * layers + 1
        kinds = len(clock.KINDS)
        assert np.all(prof[:kinds] > 0)  # every piece ran and was timed
        spans = prof[clock.SPANS:clock.SPANS + kinds]
        assert np.all(spans <= prof[:kinds])  # a region's span lies inside its piece's time
        parallel = [clock.KINDS.index(k) for k in ("qkv", "attention", "o", "gate_up", "down",
                                                   "head")]
        assert np.all(spans[parallel] > 0) and np.all(np.delete(spans, parallel) == 0)


def test_work_counts_the_bytes_and_multiply_adds_of_each_piece():
    """Every layer's matrices and the head, as stored; n tokens do n times the multiply-adds;
    attention reads the whole cache of every layer and attends to context + its own rows."""
    m = tiny_model(0)
    cfg, w = m.transformer.config, m.transformer.weights
    m.config, m.weights = cfg, w
    one, six = profile._work(m, 1, 100), profile._work(m, 6, 100)
    assert one["qkv"][0] == sum(lw.wqkv.nbytes for lw in w.layers) == six["qkv"][0]
    assert one["head"] == (w.head.nbytes, cfg.vocab_size * cfg.hidden_size)
    assert six["down"][1] == 6 * one["down"][1] == 6 * cfg.num_hidden_layers * (
        cfg.hidden_size * cfg.intermediate_size)
    dh, heads = cfg.head_dim, cfg.num_attention_heads
    assert one["attention"][1] == cfg.num_hidden_layers * 2 * 101 * heads * dh
    assert six["attention"][1] == cfg.num_hidden_layers * 2 * (6 * 100 + 21) * heads * dh


@pytest.fixture
def tiny_gguf_model(kolibri_home, tmp_path):
    from kolibri_cli.store import cache, synthetic

    path = tmp_path / "tiny.gguf"
    synthetic.write(path, n_layers=1, d=256, ff=512, heads=4, kv_heads=2, vocab=300,
                    context=256, types=lambda kind, layer, n: "Q4_1")
    cache.import_gguf(path, "tiny")
    return "tiny"


def test_bench_profile_json_and_table(tiny_gguf_model):
    """--profile --json: a forward of each T of the c(T) curve (and k+1), each piece with its
    time, bytes and multiply-adds; the pieces, the time between regions and the rest add up to
    the wall time; c(T) is each forward's time over the 1-token one's; the tables name the CPU,
    the bandwidth and the multiply-add peaks."""
    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    runner = CliRunner()
    r = runner.invoke(app, ["bench", "--model", tiny_gguf_model, "--profile", "--repeats", "2",
                            "--k", "3", "--threads", "1", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["numerics"] == default_numerics_of("tiny")  # int16 on a CPU with AVX2 and F16C
    assert out["threads"] == 1 and out["cpu"]
    assert out["bandwidth_gb_s"] > 0 and out["peak_gmacs"] > 0 and out["int_peak_gmacs"] > 0
    assert [f["tokens"] for f in out["forwards"]] == [1, 2, 3, 4, 5, 6, 7, 8, 16, 64]
    ms = {f["tokens"]: f["ms"] for f in out["forwards"]}
    assert [c["tokens"] for c in out["costs"]] == list(ms)
    for c in out["costs"]:
        assert c["cost"] == pytest.approx(ms[c["tokens"]] / ms[1])
        parts = [c[k] for k in ("qkv", "o", "gate_up", "down", "head", "attention",
                                profile.BETWEEN, "other")]
        assert sum(parts) == pytest.approx(c["ms"]) and c["matmul_gmacs"] > 0
    for f in out["forwards"]:
        kinds = [p["kind"] for p in f["pieces"]]
        assert kinds == [*clock.KINDS, profile.BETWEEN, profile.REST]
        assert f["regions"] == REGIONS_PER_LAYER + 1
        by = {p["kind"]: p for p in f["pieces"]}
        assert by["qkv"]["bytes"] > 0 and by["qkv"]["macs"] == f["tokens"] * 256 * 512
        assert all(p["ms"] >= 0 for p in f["pieces"] if p["kind"] != profile.REST)
        # per repeat the pieces add up to the wall time; medians of 2 are means: so do they
        assert sum(p["ms"] for p in f["pieces"]) == pytest.approx(f["ms"], rel=1e-6)
    table = runner.invoke(app, ["bench", "--model", tiny_gguf_model, "--profile", "--repeats",
                                "1", "--threads", "1"])
    assert table.exit_code == 0, table.output
    assert "between regions" in table.stdout and "parallel regions" in table.stdout
    assert "c(T)" in table.stdout and "forward of 6 tokens" in table.stdout
    assert "forward of 7 tokens" not in table.stdout  # details for 1 and k+1 tokens only


def test_bench_profile_refuses_options_it_would_ignore(tiny_gguf_model):
    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    r = CliRunner().invoke(app, ["bench", "--model", tiny_gguf_model, "--profile", "--peer",
                                 "llama.cpp"])
    assert r.exit_code == 1 and "--profile" in r.stderr and r.stdout == ""
