"""Atomic file writes: a reader sees the old file or the whole new one, never half of it.

Temporary names start with a dot and live beside the target (same filesystem, so the final
`os.replace` is atomic). Non-goal: durability across power loss for whole folders (no fsync of
every file in `atomic_dir`; single files are fsynced).
"""

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from kolibri_cli.errors import KolibriError


def default_mode(is_dir: bool) -> int:
    """What open()/mkdir() would have given: 0o666/0o777 minus the umask (mkstemp gives 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if is_dir else 0o666) & ~umask


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside `path`; rename it over `path` only if the block succeeds.

    A path that cannot be written (a folder, no permission, disk full) is a KolibriError."""
    path = Path(path)
    if path.is_dir():
        raise KolibriError(f"cannot write {path}: it is a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise KolibriError(f"cannot write {path}: {e.strerror}") from None
    os.close(fd)
    try:
        yield Path(tmp)
        mode = path.stat().st_mode & 0o7777 if path.exists() else default_mode(is_dir=False)
        os.chmod(tmp, mode)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise KolibriError(f"cannot write {path}: {e.strerror}") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


@contextmanager
def atomic_dir(path: str | os.PathLike):
    """Yield a temporary folder beside `path`; rename it to `path` only if the block succeeds.

    An existing `path` is moved aside first and deleted after the rename, so a reader never
    finds `path` missing or half-replaced.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        yield tmp
        tmp.chmod(default_mode(is_dir=True))
        old = None
        if path.is_symlink() or path.exists():
            old = path.parent / f"{tmp.name[:-len('.partial')]}.old"
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
