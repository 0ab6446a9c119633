"""Cached weights that changed after kolibri wrote them: kolibri.json records every file's size
and sha256, every load compares the sizes, `kolibri model verify` the checksums; divergences
and structural damage point at verify and at the command that rewrites the model."""

import json
import shutil

import pytest
from crafted import write_gguf
from typer.testing import CliRunner

from kolibri_cli.cli import app
from kolibri_cli.engine import blockfile
from kolibri_cli.engine.loader import sha256_files
from kolibri_cli.store import cache as store


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def one_error_line(result) -> str:
    lines = result.stderr.strip("\n").splitlines()
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


@pytest.fixture
def tiny(kolibri_home, tmp_path):
    """A tiny GGUF imported into the cache as `tiny`: its folder."""
    name, folder = store.import_gguf(write_gguf(tmp_path / "tiny.gguf"), "tiny")
    return folder


WEIGHTS = blockfile.CONVERTED  # an imported model's weights (blocks.bin; weights.json: the index)
def flip(path, at: int, n: int = 192) -> None:
    data = bytearray(path.read_bytes())
    for i in range(at, at + n):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_conversion_records_every_file_with_size_and_sha256(tiny):
    meta = json.loads((tiny / "kolibri.json").read_text())
    files = {p.name for p in tiny.iterdir()} - {"kolibri.json"}
    assert set(meta["files"]) == files
    for name, rec in meta["files"].items():
        assert rec == {"bytes": (tiny / name).stat().st_size,
                       "sha256": sha256_files([tiny / name])}


def test_verify_intact_model(tiny):
    result = run("model", "verify", "tiny")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 6 and all(line.startswith("OK ") for line in lines)
    assert "tiny: all 6 files intact" in result.stderr
    doc = json.loads(run("model", "verify", "tiny", "--json").stdout)
    assert doc["ok"] is True and doc["unrecorded"] == []
    assert {f["file"] for f in doc["files"]} == {p.name for p in tiny.iterdir()} - {
        "kolibri.json"}  # exactly what is kept: the index, the blocks, config and tokenizer
    assert {blockfile.NAME, WEIGHTS, "config.json"} <= {f["file"] for f in doc["files"]}
    assert all(f["status"] == "ok" and f["sha256"] == f["expected_sha256"] for f in doc["files"])


def test_flipped_bytes_load_but_verify_finds_them(tiny):
    """The repro: 192 XOR-flipped bytes inside the weights keep every size, so the model still
    loads and generates (other text, exit 0); verify reads every byte and says which file."""
    weights = tiny / WEIGHTS
    before = run("generate", "--model", "tiny", "-n", "4", "--raw", "--json", "hello").stdout
    flip(weights, at=weights.stat().st_size // 2)
    after = run("generate", "--model", "tiny", "-n", "4", "--raw", "--json", "hello")
    assert after.exit_code == 0 and json.loads(after.stdout) != json.loads(before)
    result = run("model", "verify", "tiny")
    line = one_error_line(result)
    assert "1 of 6 files of tiny are damaged" in line
    assert "kolibri model import" in line and "--name tiny --force" in line
    damaged = [row for row in result.stdout.splitlines() if row.startswith("DAMAGED")]
    assert len(damaged) == 1 and WEIGHTS in damaged[0]
    doc = json.loads(run("model", "verify", "tiny", "--json").stdout)
    assert doc["ok"] is False
    assert [f["file"] for f in doc["files"] if f["status"] == "damaged"] == [WEIGHTS]


@pytest.mark.parametrize("damage", ["truncate", "grow", "delete"])
def test_a_size_change_is_caught_at_load(tiny, damage):
    weights = tiny / WEIGHTS
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-100])
    elif damage == "grow":
        weights.write_bytes(weights.read_bytes() + b"\0")
    else:
        weights.unlink()
    line = one_error_line(run("generate", "--model", "tiny", "-n", "2", "hello"))
    assert f"the cached model tiny is damaged ({WEIGHTS}" in line
    assert "--name tiny --force" in line
    status = {"truncate": "resized", "grow": "resized", "delete": "missing"}[damage]
    doc = json.loads(run("model", "verify", "tiny", "--json").stdout)
    assert [f["status"] for f in doc["files"] if f["file"] == WEIGHTS] == [status]


def test_structural_damage_suggests_verify_and_the_rewrite(tiny):
    """Same size, broken content: the config no longer parses. The error says the cached model
    may be damaged and how to rewrite it."""
    config = tiny / "config.json"
    config.write_bytes(b"{" + b" " * (config.stat().st_size - 1))
    line = one_error_line(run("generate", "--model", "tiny", "-n", "2", "hello"))
    assert "not valid JSON" in line and "may be damaged" in line
    assert "kolibri model verify tiny" in line and "--name tiny --force" in line


def test_damaged_kolibri_json_is_one_line(tiny):
    (tiny / "kolibri.json").write_text("{not json")
    for args in (("generate", "--model", "tiny", "hello"), ("model", "verify", "tiny")):
        assert "kolibri.json is damaged" in one_error_line(run(*args))


def test_older_cache_without_a_record_says_so(tiny):
    meta = json.loads((tiny / "kolibri.json").read_text())
    del meta["files"]
    (tiny / "kolibri.json").write_text(json.dumps(meta))
    line = one_error_line(run("model", "verify", "tiny"))
    assert "written by an older kolibri without file checksums" in line
    assert "--name tiny --force" in line
    result = run("generate", "--model", "tiny", "-n", "2", "--raw", "hello")
    assert result.exit_code == 0
    assert "older kolibri without file checksums" in result.stderr


def test_verify_lists_files_kolibri_did_not_write(tiny):
    (tiny / "notes.txt").write_text("mine")
    result = run("model", "verify", "tiny", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["unrecorded"] == ["notes.txt"]
    rows = run("model", "verify", "tiny").stdout.splitlines()
    assert rows[-1].split() == ["EXTRA", "notes.txt", "not", "written", "by", "kolibri,", "not",
                                "checked"]
    # names in one column: each padded to the longest, then two spaces, then the rest
    width = max(len(row[9:].split()[0]) for row in rows)
    for row in rows:
        name = row[9:].split()[0]
        assert row[9:9 + width] == name.ljust(width) and row[9 + width:11 + width] == "  ", rows
    assert rows[-1][11 + width:].startswith("not written")


def test_verify_refuses_what_is_not_a_cached_model(kolibri_home, tiny_llama_folder):
    assert "not a model in the kolibri cache" in one_error_line(
        run("model", "verify", str(tiny_llama_folder())))
    assert "not in the cache" in one_error_line(run("model", "verify"))


def goldens_then_damage(tiny, tmp_path, prompts_text: str):
    """Goldens recorded from the intact weights of `tiny`, then every weight byte flipped."""
    prompts = tmp_path / "p.txt"
    prompts.write_text(prompts_text)
    out = tmp_path / "g.jsonl"
    assert run("goldens", "record", "--prompts", str(prompts), "-o", str(out), "--engine",
               "kolibri", "--model", "tiny", "-n", "8", "--raw").exit_code == 0
    weights = tiny / WEIGHTS
    flip(weights, at=0, n=weights.stat().st_size)
    return out


def test_goldens_check_divergence_points_at_verify(tiny, tmp_path):
    """Goldens recorded from the intact weights, checked against damaged ones: the check fails
    and says where to look."""
    out = goldens_then_damage(tiny, tmp_path, "hello there\nthe cat sat\n")
    line = one_error_line(run("goldens", "check", str(out), "--model", "tiny"))
    assert "diverge" in line and "kolibri model verify tiny" in line


def test_probe_measure_divergence_points_at_verify(tiny, tmp_path):
    out = goldens_then_damage(tiny, tmp_path, "hello there\n")
    result = run("probe", "--goldens", str(out), "--measure", "--model", "tiny", "--k", "2",
                 "--json")
    assert result.exit_code == 0, result.output
    assert "differs from 1 of 1 goldens" in result.stderr
    assert "kolibri model verify tiny" in result.stderr


@pytest.mark.model
def test_the_default_pull_records_its_files(pulled_default, monkeypatch):
    monkeypatch.setenv("KOLIBRI_HOME", str(pulled_default.home))
    meta = json.loads((pulled_default.path / "kolibri.json").read_text())
    assert meta["files"][blockfile.NAME]["bytes"] == (
        pulled_default.path / blockfile.NAME).stat().st_size
    gguf = store.gguf_file(pulled_default.path).name  # the weights: hashed by verify as kept
    assert meta["files"][gguf]["sha256"] == store.REGISTRY[store.DEFAULT_MODEL].sha256
    copy = pulled_default.home / "models" / "copy-for-verify"
    shutil.copytree(pulled_default.path, copy)
    try:
        result = run("model", "verify", "copy-for-verify", "--json")
        assert result.exit_code == 0, result.output
        assert "kolibri model pull smollm2-135m-instruct --force" in json.loads(
            result.stdout)["repair"]
    finally:
        shutil.rmtree(copy)
