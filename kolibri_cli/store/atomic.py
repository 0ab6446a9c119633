"""Writing the files a user names, and folders in the cache, so a reader never sees half of one.

A regular file (or a new path) is written to a temporary beside it and renamed over it: a reader
sees the old file or the whole new one. A symlink is followed: its target is replaced, the link
kept. What cannot be renamed over — a FIFO, a character device (/dev/null, a terminal), one of
our own standard streams (/dev/stdout, /dev/fd/N) — is written through; a block device, a socket
or a folder is refused. Every failure is one KolibriError line.
Temporary names start with a dot (never taken for a model or a report). Non-goal: durability
across power loss for whole folders (no fsync of every file in `atomic_dir`; files are fsynced).
"""

import errno
import os
import re
import secrets
import shutil
import stat
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from kolibri_cli.errors import KolibriError
from kolibri_cli.home import make_private

# /dev/stdout, /dev/fd/1, /proc/self/fd/1: our own open descriptors, written through as they are
_STREAMS = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}
_FD_PATH = re.compile(r"/(?:dev|proc/(?:self|thread-self|\d+))/fd/(\d+)")


def default_mode(is_dir: bool) -> int:
    """What open()/mkdir() would have given: 0o666/0o777 minus the umask (mkstemp gives 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return (0o777 if is_dir else 0o666) & ~umask


def _fail(path, e: OSError) -> KolibriError:
    return KolibriError(f"cannot write {path}: {e.strerror or e}")


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path to write; it becomes `path` only if the block succeeds (see the
    module docstring for links, devices and FIFOs). Any failure to write is a KolibriError."""
    path = Path(path)
    fd = _stream_fd(path)
    if fd is not None:
        with _through(path, lambda data: _write_fd(fd, data)) as tmp:
            yield tmp
        return
    kind = _kind(path)
    if kind == "special":
        with _through(path, lambda data: _write_special(path, data)) as tmp:
            yield tmp
        return
    with _replace(Path(os.path.realpath(path)), path) as tmp:
        yield tmp


def check_writable(path: str | os.PathLike) -> None:
    """A KolibriError now, before the long work whose result goes to `path`, if it could never be
    written there: a folder, a path under a file, a folder that refuses writes."""
    path = Path(path)
    if _stream_fd(path) is not None:
        return
    if _kind(path) == "special" and stat.S_ISFIFO(os.stat(path).st_mode):
        _hold_fifo(path, 1.0)  # a reader started just before us has a moment to open it
        return
    folder = Path(os.path.realpath(path)).parent
    while not os.path.lexists(folder):  # atomic_path makes the missing folders
        folder = folder.parent
    if not folder.is_dir():
        raise KolibriError(f"cannot write {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise KolibriError(f"cannot write {path}: the folder {folder} is not writable")


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def _stream_fd(path: Path) -> int | None:
    """The descriptor `path` names if it is one of this process's own (/dev/stdout, /dev/fd/N)."""
    text = os.path.normpath(str(path))
    if text in _STREAMS:
        return _STREAMS[text]
    m = _FD_PATH.fullmatch(text)
    if m and (not text.startswith("/proc/") or text.split("/")[2] in ("self", "thread-self",
                                                                      str(os.getpid()))):
        return int(m.group(1))
    return None


def _kind(path: Path) -> str:
    """"new", "regular" or "special" (written through); a folder, block device or socket is
    refused here."""
    try:
        st = os.stat(path)  # follows links: what a write would reach
    except FileNotFoundError:
        return "new"
    except OSError as e:
        raise _fail(path, e) from None
    if stat.S_ISREG(st.st_mode):
        return "regular"
    if stat.S_ISDIR(st.st_mode):
        raise KolibriError(f"cannot write {path}: it is a folder")
    if stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode):
        return "special"
    what = "a block device" if stat.S_ISBLK(st.st_mode) else "a socket or special file"
    raise KolibriError(f"cannot write {path}: it is {what}; name a regular file")


@contextmanager
def _replace(target: Path, shown: Path):
    """Temp file beside `target` (the link's target when `shown` is a symlink), renamed over it."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as e:
        raise _fail(shown, e) from None
    os.close(fd)
    try:
        yield Path(tmp)
        mode = target.stat().st_mode & 0o7777 if target.exists() else default_mode(is_dir=False)
        os.chmod(tmp, mode)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _fail(shown, e) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def _through(shown: Path, write):
    """A private temporary file; when the block succeeds its bytes go to `write` (a FIFO, a
    device or a stream sees only the finished content)."""
    folder = tempfile.mkdtemp(prefix=".kolibri-write-")
    tmp = Path(folder) / shown.name
    try:
        yield tmp
        write(tmp.read_bytes() if tmp.exists() else b"")
    except BrokenPipeError:
        raise  # the reader went away (`| head`): a quiet exit 0, as on stdout itself
    except OSError as e:
        raise _fail(shown, e) from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# FIFO (its real path) -> the write end opened when it was checked, held until the result goes
_HELD_FIFOS: dict[str, int] = {}


FIFO_WAIT_S = 10.0  # how long a write not checked before waits for a FIFO's reader to open it


def _hold_fifo(path: Path, wait: float = 0.0) -> None:
    """A FIFO must have a reader before the work, not after it (with none, the write blocked for
    ever): its write end is opened without blocking (no reader: ENXIO; retried for `wait`
    seconds) and held until the result is written, so the reader waits for it instead of seeing
    the end of the stream."""
    real = os.path.realpath(path)
    if real in _HELD_FIFOS:
        return
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(real, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise _fail(path, e) from None
            if time.monotonic() >= deadline:
                raise KolibriError(f"cannot write {path}: it is a FIFO that no process reads; "
                                   "start its reader first, or name a file") from None
            time.sleep(0.05)
    os.set_blocking(fd, True)
    _HELD_FIFOS[real] = fd


def _write_special(path: Path, data: bytes) -> None:
    real = os.path.realpath(path)
    if stat.S_ISFIFO(os.stat(real).st_mode):
        _hold_fifo(path, FIFO_WAIT_S)  # unless checked before: a reader has a while to come
        fd = _HELD_FIFOS.pop(real)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        return
    with open(path, "wb") as f:  # O_TRUNC is ignored by devices
        f.write(data)


def _write_fd(fd: int, data: bytes) -> None:
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()  # what was printed before comes first
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# ---------------------------------------------------------------- folders in the cache


def temp_name(name: str, kind: str) -> str:
    """`.NAME.<16 hex>.KIND`: a temporary of `name` that no other name's pattern matches."""
    return f".{name}.{secrets.token_hex(8)}.{kind}"


def is_temp_of(entry: str, name: str, kinds: tuple[str, ...]) -> bool:
    """Whether `entry` is exactly a `temp_name(name, kind)` for one of `kinds` (no prefix
    match: `.qwen.` must not claim `.qwen.q4.…`)."""
    kind = "|".join(map(re.escape, kinds))
    return re.fullmatch(rf"\.{re.escape(name)}\.[0-9a-f]{{16}}\.(?:{kind})", entry) is not None


def make_temp_dir(parent: Path, name: str, kind: str) -> Path:
    make_private(parent)  # the cache root or a folder in it
    while True:
        path = parent / temp_name(name, kind)
        try:
            path.mkdir(mode=0o700)
            return path
        except FileExistsError:
            continue


@contextmanager
def atomic_dir(path: str | os.PathLike):
    """Yield a temporary folder beside `path`; rename it to `path` only if the block succeeds.

    An existing `path` is moved aside first and deleted after the rename, so a reader never
    finds `path` missing or half-replaced.
    """
    path = Path(path)
    tmp = make_temp_dir(path.parent, path.name, "partial")
    try:
        yield tmp
        tmp.chmod(default_mode(is_dir=True))
        old = None
        if path.is_symlink() or path.exists():
            old = path.parent / temp_name(path.name, "old")
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
