"""The c(n) samples the guard timed while generating, kept in the kolibri home so the next
`kolibri generate --spec` (or chat answer) starts from them instead of calibrating again.

One JSON file, `guard-costs.json`: per kernel — (model sha256, numerics, threads) run by one
kolibri (version and commit) on one CPU — the measuring table's samples per (context octave,
rows), as `CostTable.to_dict` gives them. A sample is a ratio of two forwards timed moments
apart, so it holds for that kernel on that host and nothing else: any change in the key starts
afresh. Written whole and atomically under a lock; a file that does not parse is ignored and
replaced (it only ever holds timings the next run takes again). Non-goal: a history.
"""

import json
from pathlib import Path

from kolibri_cli.home import cache_root
from kolibri_cli.store.atomic import write_text_atomic
from kolibri_cli.store.benchcosts import cpu_model, source_commit

FILE = "guard-costs.json"
FORMAT = 1
KEEP_KERNELS = 16  # entries kept: the most recently saved


def path() -> Path:
    return cache_root() / FILE


def kernel_key(model_sha256: str, numerics: str, threads: int) -> str:
    """What a timing holds for: the model, its numerics and threads, this kolibri, this CPU."""
    from kolibri_cli import __version__

    return "|".join((model_sha256, numerics, str(threads), __version__, source_commit(),
                     cpu_model()))


def load(key: str) -> list | None:
    """The cells kept for `key` ([[octave, rows, [c, ...]], ...]), None when none are."""
    entry = _entries().get(key)
    return None if entry is None else entry.get("cells")


def save(key: str, cells: list) -> None:
    """Keep `cells` for `key` (replacing what it had), and the other most recent kernels'."""
    from filelock import FileLock

    (cache_root() / "locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_root() / "locks" / f"{FILE}.lock")):
        entries = _entries()
        entries.pop(key, None)
        entries[key] = {"cells": cells}
        kept = dict(list(entries.items())[-KEEP_KERNELS:])
        doc = {"format": FORMAT, "kernels": kept}
        write_text_atomic(path(), json.dumps(doc) + "\n")


def _entries() -> dict:
    """key -> entry, oldest first; {} when the file is missing or not ours."""
    try:
        doc = json.loads(path().read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    kernels = doc.get("kernels") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    return kernels if isinstance(kernels, dict) else {}
