"""The sha256 of a model folder's weight files, remembered in the kolibri home by each file's
(path, size, mtime_ns, inode): a user's folder is identified (goldens' model_sha256, the key of
its stored bench costs) without reading every weight byte on every run (minutes for 30 GB).

A file whose stamp changed is hashed again; a stamp that changed while hashing is not kept. One
small JSON file, `digests.json`, written atomically: the latest digest per list of files. Best
effort: an unreadable or unwritable record costs the hash, never an error.
"""

import json
import os
from pathlib import Path

from kolibri_cli.engine import loader
from kolibri_cli.errors import KolibriError
from kolibri_cli.home import cache_root, make_private
from kolibri_cli.store.atomic import write_text_atomic

FILE = "digests.json"
FORMAT = 1
KEEP = 64  # folders remembered; the oldest are dropped


def files_sha256(paths: list[Path]) -> str:
    """loader.sha256_files(paths), read from the record when no file changed since."""
    key, before = _key(paths), _stamps(paths)
    records = _load()
    if records.get(key, {}).get("stamps") == before:
        return records[key]["sha256"]
    digest = loader.sha256_files(paths)
    if _stamps(paths) == before:  # unchanged while hashing: the digest is of these stamps
        records.pop(key, None)
        records[key] = {"stamps": before, "sha256": digest}
        _save(dict(list(records.items())[-KEEP:]))
    return digest


def forget(folder: Path) -> int:
    """Drop the digests of files under `folder` (`kolibri model rm`): how many."""
    records, under = _load(), str(Path(folder).resolve()) + os.sep
    kept = {k: v for k, v in records.items()
            if not any(line.startswith(under) for line in k.split("\n"))}
    if len(kept) < len(records):
        _save(kept)
    return len(records) - len(kept)


def _key(paths: list[Path]) -> str:
    return "\n".join(str(Path(p).resolve()) for p in paths)


def _stamps(paths: list[Path]) -> list[list[int]]:
    stats = [os.stat(p) for p in paths]
    return [[s.st_size, s.st_mtime_ns, s.st_ino, s.st_dev] for s in stats]


def _load() -> dict:
    try:
        doc = json.loads((cache_root() / FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    records = doc.get("records") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    if not isinstance(records, dict):
        return {}
    return {k: v for k, v in records.items() if isinstance(v, dict)
            and isinstance(v.get("sha256"), str) and isinstance(v.get("stamps"), list)}


def _save(records: dict) -> None:
    try:
        make_private(cache_root())
        write_text_atomic(cache_root() / FILE,
                          json.dumps({"format": FORMAT, "records": records}, indent=1) + "\n")
    except (OSError, KolibriError):
        pass  # a read-only home: the next run hashes again
