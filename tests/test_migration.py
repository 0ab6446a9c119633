"""Caches written by an earlier kolibri (the blocks copied into one `model.kolibri` with float32
scales, beside the pulled GGUF) are rewritten with the blocks once, on first use: atomically,
offline, bit for bit the same weights; a migration cut short leaves the old folder usable."""

import dataclasses
import hashlib
import json
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
from test_block_models import tiny_gguf

from kolibri_cli.engine import blockfile, blocks
from kolibri_cli.engine.weights import Matrix
from kolibri_cli.errors import KolibriError
from kolibri_cli.store import cache, integrity
from kolibri_cli.store.atomic import temp_name
from kolibri_cli.store.models import verify

pytest.importorskip("gguf")
NAME = cache.DEFAULT_MODEL


def write_legacy_block_file(folder: Path) -> None:
    """What kolibri wrote before weights.json: every tensor in Hugging Face row order in one
    safetensors-like file, the 32-weight types' scales widened to float32 (kolibri-blocks-1)."""
    index = blockfile.read_index(folder / blockfile.NAME)
    mapped = blockfile._Mapped(folder)
    header, arrays, offset = {}, [], 0
    for name, e in index.items():
        if e.code is None:
            raw = blockfile._vector(mapped, e).view(np.uint8)
            header[name] = {"dtype": "F32", "shape": [e.shape[0]]}
        else:
            rows = blockfile._copy_rows(mapped, e)
            raw = blocks.widen_scales(e.code, rows) if e.code in blocks._HALVES else rows
            header[name] = {"dtype": "U8", "shape": [e.shape[0], raw.shape[1]]}
        header[name]["data_offsets"] = [offset, offset + raw.nbytes]
        offset += raw.nbytes
        arrays.append(np.ascontiguousarray(raw).reshape(-1))
    matrices = {n: e for n, e in index.items() if e.code is not None}
    meta = {"format": blockfile.LEGACY_FORMAT,
            "types": json.dumps({n: blocks.TYPES[e.code].name for n, e in matrices.items()}),
            "shapes": json.dumps({n: list(e.shape) for n, e in matrices.items()})}
    text = json.dumps({"__metadata__": meta, **header}).encode()
    text += b" " * (-len(text) % 8)
    with open(folder / blockfile.LEGACY, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for a in arrays:
            a.tofile(f)


def make_legacy(folder: Path) -> dict[str, np.ndarray]:
    """Turn a cached model into the single-file layout (its weights.json and blocks.bin gone,
    kolibri.json re-recorded); returns its weights decoded, to compare after migration."""
    before = blockfile.float_tensors(folder / blockfile.NAME)
    write_legacy_block_file(folder)
    (folder / blockfile.NAME).unlink()
    (folder / blockfile.CONVERTED).unlink(missing_ok=True)
    meta = json.loads((folder / integrity.META).read_text())
    cache.write_meta(folder, {k: v for k, v in meta.items() if k != "files"})
    assert cache.is_single_file_cache(folder)
    return before


def assert_same_weights(folder: Path, before: dict[str, np.ndarray]) -> None:
    after = blockfile.float_tensors(folder / blockfile.NAME)
    assert set(after) == set(before)
    for name, a in before.items():
        assert np.array_equal(after[name].view(np.uint32), a.view(np.uint32)), name


@pytest.fixture
def imported(kolibri_home, tmp_path):
    """A tiny Q4_1 model imported into the cache (its tensors in blocks.bin), made legacy."""
    path = tmp_path / "tiny.gguf"
    tiny_gguf(path, "Q4_1")
    name, folder = cache.import_gguf(path)
    return name, folder, make_legacy(folder)


def test_legacy_block_file_reads_back_as_the_gguf_blocks(kolibri_home, tmp_path):
    """The narrowing is exact for every type with float16 block scales."""
    for t in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "F16"):
        path = tmp_path / f"{t}.gguf"
        tiny_gguf(path, t)
        _, folder = cache.import_gguf(path, f"tiny-{t}")
        want = blockfile.float_tensors(folder / blockfile.NAME)
        write_legacy_block_file(folder)
        entries, arrays = blockfile.legacy_tensors(folder / blockfile.LEGACY)
        index = blockfile.read_index(folder / blockfile.NAME)
        mapped = blockfile._Mapped(folder)
        for e, a in zip(entries, arrays, strict=True):
            if e.code is not None:
                assert np.array_equal(a, blockfile._copy_rows(mapped, index[e.name])), e.name
        assert set(want) == {e.name for e in entries}


def test_imported_legacy_cache_migrates_offline_to_blocks_once(imported, monkeypatch):
    name, folder, before = imported
    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    notes = []
    assert cache.resolve(name, notify=notes.append) == folder
    assert len(notes) == 1 and "keeping its blocks once" in notes[0]
    assert not (folder / blockfile.LEGACY).exists() and (folder / blockfile.CONVERTED).is_file()
    assert_same_weights(folder, before)
    assert cache.resolve(name, notify=notes.append) == folder and len(notes) == 1
    found = verify(name)
    assert not found.damaged and not found.unrecorded
    kept = {p.name for p in folder.iterdir()} - {integrity.META}
    assert {f.file for f in found.files} == kept  # verify hashes exactly what is kept
    assert [p.name for p in folder.parent.iterdir()] == [name]  # no temporaries left


def test_pulled_legacy_cache_keeps_the_gguf_and_drops_the_copy(kolibri_home, tmp_path,
                                                                monkeypatch):
    """The pulled layout: the GGUF beside model.kolibri. After: the GGUF indexed in place, the
    folder <= 1.05x the GGUF on disk, the same weights bit for bit."""
    gguf = tmp_path / "tiny.gguf"
    tiny_gguf(gguf, lambda kind, layer, n: "Q8_0" if kind == "token_embd" else "Q4_1")
    digest = hashlib.sha256(gguf.read_bytes()).hexdigest()
    source = dataclasses.replace(cache.REGISTRY[NAME], member="pkg/tiny.gguf", sha256=digest)
    monkeypatch.setitem(cache.REGISTRY, NAME, source)
    folder = cache.model_dir(NAME)
    _, imported_folder = cache.import_gguf(gguf, "scratch")
    shutil.copytree(imported_folder, folder)
    shutil.copy(gguf, folder / "tiny.gguf")
    meta = {"name": NAME, "source": source.requirement, "gguf": source.member,
            "gguf_sha256": digest}
    (folder / integrity.META).write_text(json.dumps(meta))
    before = make_legacy(folder)
    monkeypatch.setenv("KOLIBRI_OFFLINE", "1")
    assert cache.resolve(None) == folder
    assert {e.file for e in blockfile.read_index(folder / blockfile.NAME).values()} == {
        "tiny.gguf"}
    assert not (folder / blockfile.LEGACY).exists()
    assert not (folder / blockfile.CONVERTED).exists()
    assert cache.disk_use(folder)[1] <= 1.05 * gguf.stat().st_size + 64 * 1024  # + small files
    assert_same_weights(folder, before)
    assert json.loads((folder / integrity.META).read_text())["gguf_sha256"] == digest


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError])
def test_migration_cut_short_leaves_the_old_cache_usable(imported, monkeypatch, stop):
    name, folder, before = imported
    files = sorted(p.name for p in folder.iterdir())
    record = (folder / integrity.META).read_text()
    real_write = blockfile.write

    def write_half(out, entries, arrays):
        next(iter(arrays))
        (out / blockfile.CONVERTED).write_bytes(b"half")
        raise stop("cut short")

    monkeypatch.setattr(blockfile, "write", write_half)
    with pytest.raises((stop, KolibriError)):
        cache.resolve(name)
    assert sorted(p.name for p in folder.iterdir()) == files
    assert (folder / integrity.META).read_text() == record
    assert cache.is_single_file_cache(folder)
    assert [p.name for p in folder.parent.iterdir()] == [name]
    entries, arrays = blockfile.legacy_tensors(folder / blockfile.LEGACY)
    assert len(list(arrays)) == len(entries) == len(before)  # still whole and readable
    monkeypatch.setattr(blockfile, "write", real_write)
    assert cache.resolve(name) == folder
    assert_same_weights(folder, before)


def test_a_damaged_legacy_cache_is_not_migrated(imported):
    name, folder, _ = imported
    legacy = folder / blockfile.LEGACY
    data = bytearray(legacy.read_bytes())
    data[-5] ^= 0xFF
    legacy.write_bytes(bytes(data))
    with pytest.raises(KolibriError, match=f"the cached model {name} is damaged"):
        cache.resolve(name)
    assert cache.is_single_file_cache(folder)


def test_a_folder_moved_aside_by_a_killed_replacement_is_put_back(imported):
    """atomic_dir renames the old folder aside, then the new one in: killed in between, the
    next run under the lock puts the old (complete) folder back instead of deleting it."""
    name, folder, _ = imported
    aside = folder.parent / temp_name(name, "old")
    folder.rename(aside)
    cache._remove_leftovers(name)
    assert folder.is_dir() and not aside.exists() and cache.is_complete(folder)


def test_index_outside_its_data_file_is_refused(kolibri_home, tmp_path):
    """The kernel reads without bounds checks: an entry running past its file is one error."""
    path = tmp_path / "tiny.gguf"
    tiny_gguf(path, "Q4_1")
    _, folder = cache.import_gguf(path)
    index = folder / blockfile.NAME
    doc = json.loads(index.read_text())
    entry = doc["tensors"]["model.embed_tokens.weight"]
    entry["offset"] = (folder / blockfile.CONVERTED).stat().st_size - 10
    index.write_text(json.dumps(doc))
    with pytest.raises(KolibriError, match="runs past the end of blocks.bin"):
        blockfile.read_index(index)
    entry["file"] = "../elsewhere"
    index.write_text(json.dumps(doc))
    with pytest.raises(KolibriError, match="malformed entry"):
        blockfile.read_index(index)


def test_model_list_shows_each_models_size_on_disk(imported):
    from typer.testing import CliRunner

    from kolibri_cli.cli import app

    name, folder, _ = imported
    result = CliRunner().invoke(app, ["model", "list", "--json"])
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)["models"]
    assert row["name"] == name and row["bytes"] == cache.disk_use(folder)[1] > 0
    assert row["bytes"] >= sum(p.stat().st_size for p in folder.iterdir())
    result = CliRunner().invoke(app, ["model", "list"])
    assert f"{row['bytes'] / 1e6:,.1f} MB" in result.stdout


def test_blocks_are_read_where_they_lie_in_the_file(imported):
    """Matrices address the mapped data file: no copy of the weights at load."""
    name, folder, _ = imported
    cache.resolve(name)
    w = blockfile.load_weights(folder / blockfile.NAME, _config(folder))
    m: Matrix = w.layers[0].wqkv
    assert isinstance(m.data, np.memmap)
    assert Path(m.data.filename).resolve() == (folder / blockfile.CONVERTED).resolve()


def _config(folder: Path):
    from kolibri_cli.engine.config import ModelConfig

    return ModelConfig.from_file(folder / "config.json")
