"""What a cache folder held when kolibri wrote it, and whether it still does.

At conversion every file of the folder (whatever the cache format: safetensors, quantized blocks,
tokenizer, config) is recorded in kolibri.json with its size and sha256. Every load compares the
sizes (cheap: a truncated or grown file is caught at once); `kolibri model verify` compares the
full sha256 (a flipped byte is caught there). Folders cached before the record existed carry no
`files` key: they can be neither checked nor verified until re-pulled.
"""

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from kolibri_cli.callbacks import Ticks
from kolibri_cli.engine.loader import sha256_files
from kolibri_cli.errors import KolibriError

META = "kolibri.json"  # the provenance file; written last, never recorded in itself


def folder_files(folder: Path) -> list[str]:
    """Every regular file under `folder` but kolibri.json, as sorted POSIX relative paths."""
    found = []
    for root, _, names in os.walk(folder):
        for name in names:
            rel = (Path(root) / name).relative_to(folder).as_posix()
            if rel != META and (Path(root) / name).is_file():
                found.append(rel)
    return sorted(found)


def record_files(folder: Path, progress: Ticks | None = None,
                 known: dict[str, str] | None = None) -> dict[str, dict]:
    """{relative path: {"bytes", "sha256"}} for every file `folder_files` lists; a file in
    `known` takes the sha256 given there (its bytes were just hashed as they were written)."""
    names = folder_files(folder)
    record = {}
    for i, rel in enumerate(names):
        path = folder / rel
        digest = (known or {}).get(rel) or sha256_files([path])
        record[rel] = {"bytes": path.stat().st_size, "sha256": digest}
        if progress:
            progress(i + 1, len(names))
    return record


def recorded(meta: dict, name: str) -> dict[str, dict] | None:
    """The `files` record of a kolibri.json dict; None when the folder predates it. A record
    naming a path outside the folder (/etc/x, ../x) or with a malformed entry is damage."""
    files = meta.get("files")
    if files is None:
        return None
    if not isinstance(files, dict) or not all(_inside(k) and _entry(v) for k, v in files.items()):
        raise KolibriError(f"the kolibri.json of {name} is damaged (a malformed files record); "
                           f"rewrite the model with: {repair_hint(name, meta)}")
    return files


def _inside(rel) -> bool:
    parts = rel.split("/") if isinstance(rel, str) else [""]
    return not rel.startswith("/") and all(p not in ("", ".", "..") for p in parts) and (
        "\\" not in rel and "\0" not in rel)


def _entry(v) -> bool:
    return (isinstance(v, dict) and isinstance(v.get("bytes"), int)
            and not isinstance(v.get("bytes"), bool) and isinstance(v.get("sha256"), str))


def size_damage(folder: Path, files: dict[str, dict]) -> str | None:
    """The first recorded file that is missing or has another size, described; None if all fit."""
    for rel, want in files.items():
        path = folder / rel
        try:
            size = path.stat().st_size
        except OSError:
            return f"{rel} is missing"
        if size != want["bytes"]:
            return f"{rel} has {size} bytes, {want['bytes']} when it was written"
    return None


@dataclass
class FileCheck:
    file: str  # relative to the model folder
    status: str  # "ok", "damaged" (sha256 differs), "resized", "missing"
    bytes: int | None  # on disk now (None when missing)
    expected_bytes: int
    sha256: str | None  # on disk now (None when missing or the size already differs)
    expected_sha256: str

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_dict(self) -> dict:
        return asdict(self)


def verify_files(folder: Path, files: dict[str, dict],
                 progress: Ticks | None = None) -> list[FileCheck]:
    """Every recorded file checked: size first, then the full sha256 (bytes read in order)."""
    total = sum(want["bytes"] for want in files.values()) or 1
    done, checks = 0, []
    for rel, want in files.items():
        checks.append(_check_one(folder / rel, rel, want))
        done += want["bytes"]
        if progress:
            progress(done, total)
    return checks


def _check_one(path: Path, rel: str, want: dict) -> FileCheck:
    expect = dict(expected_bytes=want["bytes"], expected_sha256=want["sha256"])
    try:
        size = path.stat().st_size
        if size != want["bytes"]:
            return FileCheck(rel, "resized", size, sha256=None, **expect)
        digest = sha256_files([path])
    except OSError:
        return FileCheck(rel, "missing", None, sha256=None, **expect)
    status = "ok" if digest == want["sha256"] else "damaged"
    return FileCheck(rel, status, size, sha256=digest, **expect)


def repair_hint(name: str, meta: dict) -> str:
    """The command that rewrites a cached model from its source."""
    if meta.get("source") == "import" and meta.get("gguf"):
        return f"kolibri model import {meta['gguf']} --name {name} --force"
    return f"kolibri model pull {name} --force"


def check_sizes(folder: Path, name: str, meta: dict) -> None:
    """Refuse a cached model whose files changed size since they were written."""
    files = recorded(meta, name)
    if files is None:
        return
    damage = size_damage(folder, files)
    if damage:
        raise KolibriError(f"the cached model {name} is damaged ({damage}); "
                           f"rewrite it with: {repair_hint(name, meta)}")


def unrecorded_note(name: str, meta: dict) -> str | None:
    """A note for a folder cached before sizes and checksums were recorded."""
    if not meta or recorded(meta, name) is not None:
        return None
    return (f"note: the cached model {name} was written by an older kolibri without file "
            f"checksums, so damage cannot be detected; rewrite it with: "
            f"{repair_hint(name, meta)}")
