"""The c(n) samples the guard timed while generating, kept in the kolibri home so the next
`kolibri generate --spec` (or chat answer) starts from them instead of calibrating again.

One JSON file, `guard-costs.json`: per kernel — (model sha256, numerics, threads) run by one
compiled kernel (the engine's sources, numba, KOLIBRI_SIMD) on one CPU — the measuring table's
samples per (context octave, rows), as `CostTable.to_dict` gives them. A sample is a ratio of
two forwards timed moments apart, so it holds for that kernel on that host and nothing else: any
change in the key starts afresh. Written whole and atomically under a lock; a file that does
not parse is ignored and replaced (it only ever holds timings the next run takes again); a home
that cannot be written is one KolibriError. Non-goal: a history.
"""

import json
from pathlib import Path

from kolibri_cli.costs.store import cpu_model, kernel_id
from kolibri_cli.errors import KolibriError
from kolibri_cli.home import cache_root, make_private
from kolibri_cli.store.atomic import write_text_atomic

FILE = "guard-costs.json"
FORMAT = 1
KEEP_KERNELS = 16  # entries kept: the most recently saved


def path() -> Path:
    return cache_root() / FILE


def kernel_key(model_sha256: str, numerics: str, threads: int) -> str:
    """What a timing holds for: the model, its numerics and threads, the compiled kernel (the
    engine's sources, numba and KOLIBRI_SIMD: the key of its numba cache; the CPU numba compiles
    for) and the CPU it runs on."""
    kernel, _, target = kernel_id().partition(" ")
    return "|".join((model_sha256, numerics, str(threads), kernel, cpu_model(), target))


def load(key: str) -> list | None:
    """The cells kept for `key` ([[octave, rows, [c, ...]], ...]), None when none are."""
    entry = _entries().get(key)
    cells = entry.get("cells") if isinstance(entry, dict) else None
    return cells if isinstance(cells, list) else None


def save(key: str, cells: list) -> None:
    """Keep `cells` for `key` (replacing what it had), and the other most recent kernels'; a
    home that cannot be written is a KolibriError."""
    from filelock import FileLock

    try:
        make_private(cache_root() / "locks")
        with FileLock(str(cache_root() / "locks" / f"{FILE}.lock")):
            entries = _entries()
            entries.pop(key, None)
            entries[key] = {"cells": cells}
            kept = dict(list(entries.items())[-KEEP_KERNELS:])
            write_text_atomic(path(), json.dumps({"format": FORMAT, "kernels": kept}) + "\n")
    except OSError as e:
        raise KolibriError(f"cannot write {path()}: {e.strerror or e}") from None


def forget(model_sha256: str) -> int:
    """Drop the timings of one model, every kernel's (`kolibri model rm`): how many."""
    from filelock import FileLock

    if not path().is_file():
        return 0
    with FileLock(str(cache_root() / "locks" / f"{FILE}.lock")):
        entries = _entries()
        kept = {k: v for k, v in entries.items() if not k.startswith(f"{model_sha256}|")}
        if len(kept) < len(entries):
            write_text_atomic(path(), json.dumps({"format": FORMAT, "kernels": kept}) + "\n")
    return len(entries) - len(kept)


def _entries() -> dict:
    """key -> entry, oldest first; {} when the file is missing or not ours."""
    try:
        doc = json.loads(path().read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return {}
    kernels = doc.get("kernels") if isinstance(doc, dict) and doc.get("format") == FORMAT else None
    return kernels if isinstance(kernels, dict) else {}
