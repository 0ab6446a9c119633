"""Where kolibri keeps what it writes: models, locks and compiled kernels, all under one root.

A bottom module (like errors.py): the store puts models there, the engine its numba cache, and
neither layer has to import the other for the path.
"""

import os
import stat
from pathlib import Path

YES_WORDS = ("1", "true", "yes", "on")  # what KOLIBRI_OFFLINE and KOLIBRI_DEBUG read as set


def cache_root() -> Path:
    """`KOLIBRI_HOME`, else `$XDG_CACHE_HOME/kolibri`, else `~/.cache/kolibri`."""
    if home := os.environ.get("KOLIBRI_HOME"):
        return Path(home)
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(xdg) / "kolibri"


def make_private(folder: Path) -> Path:
    """`folder` and each missing parent made 0700 (os.makedirs gives the mode to the last one
    only): what kolibri keeps under its cache root is no other user's to read or replace."""
    folder = Path(folder)
    if not folder.is_dir():
        if folder.parent != folder:
            make_private(folder.parent)
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:  # made meanwhile by another process, or a file (caller's error)
            pass
    return folder


def compiled_cache() -> tuple[Path, Path]:
    """(the folder numba caches kolibri's compiled code in, the root trusted for it):
    NUMBA_CACHE_DIR for both when set, else the cache root's `numba` folder and the root —
    what engine/jitcache.py's numba_root and trusted top are, said without importing numba."""
    if given := os.environ.get("NUMBA_CACHE_DIR"):
        return Path(given), Path(given)
    return cache_root() / "numba", cache_root()


def cache_warning() -> str | None:
    """One line for a run whose compiled code cannot be cached (`distrust`): the folder, why,
    what it costs and the fix; None when the cache is trusted."""
    folder, root = compiled_cache()
    found = _distrust(folder, root)
    if found is None:
        return None
    why, fix = found
    return (f"warning: {why}, so kolibri loads no compiled code from {folder} and compiles its "
            f"kernels in memory on every run (slow); {fix}")


def distrust(folder: Path, root: Path) -> str | None:
    """Why files in `folder` (the cache root `root` or a folder in it) may have been written by
    another user, or None when only we (and the superuser) can have: `folder` and every folder up
    to `root` are ours, real folders (no symbolic link) and not writable by group or others; each
    folder above `root` (as named and as resolved) belongs to us or the superuser and is writable
    by others only when sticky (`/tmp`: there nobody else can rename our folder away). Folders not
    made yet are skipped: kolibri makes them 0700. Compiled code is loaded only from a root we
    trust (another user's pickle would run as us)."""
    found = _distrust(folder, root)
    return None if found is None else found[0]


def _distrust(folder: Path, root: Path) -> tuple[str, str] | None:
    """`distrust`'s reason and the fix for it, or None."""
    folder, root = Path(os.path.abspath(folder)), Path(os.path.abspath(root))
    ours = [folder, *(p for p in folder.parents if p.is_relative_to(root))]
    real = Path(os.path.realpath(root.parent))
    above = sorted({*root.parents, real, *real.parents})
    for path in ours:
        if why := _not_ours(path):
            return why, _fix(path)
    for path in above:
        if why := _replaceable(path, root):
            return why, _fix(path)
    return None


def _fix(path: Path) -> str:
    """What makes `path` trusted: its write bits for group and others off, when it is ours;
    else a root of one's own."""
    try:
        st = os.lstat(path)
    except OSError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        who = ("g" if st.st_mode & 0o020 else "") + ("o" if st.st_mode & 0o002 else "")
        return f"fix: chmod {who}-w {path}"
    return "fix: set KOLIBRI_HOME (or NUMBA_CACHE_DIR) to a folder of your own (mkdir -m 700)"


def _not_ours(path: Path) -> str | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{path} cannot be read ({e.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a folder"
    if st.st_uid != os.geteuid():
        return f"{path} belongs to another user (uid {st.st_uid})"
    if st.st_mode & 0o022:
        return f"{path} can be written by other users (mode {st.st_mode & 0o777:o})"
    return None


def _replaceable(path: Path, root: Path) -> str | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"{path} cannot be read ({e.strerror})"
    if st.st_uid not in (0, os.geteuid()):
        return f"{path} belongs to another user (uid {st.st_uid}), who could replace {root}"
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        return f"{path} can be written by other users, who could replace {root}"
    return None
