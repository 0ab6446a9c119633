"""Where kolibri's compiled code is cached: a folder under the kolibri cache root, keyed by the
sources it was compiled from. Never the package folder (a read-only install must work).

Import this module before defining any `@njit(cache=True)` function of kolibri (engine/jit.py
does; other packages with compiled code import it themselves): numba picks a function's cache
folder when its decorator runs. `NUMBA_CACHE_DIR`, when set, replaces the kolibri cache root's
`numba` folder; the folders under it are keyed by the sources all the same. numba's own runtime
functions, which numba compiles afresh in every process, are cached there too. Where no keyed
folder can be made, kolibri's functions compile in memory: never numba's other folders (beside
the sources, ~/.cache/numba, NUMBA_CACHE_LOCATOR_CLASSES), which check a function against its own
file only, nor a folder in /tmp (another user could plant compiled code there).

Compiled code is pickled, and unpickling runs code: it is loaded only from a root that is ours
(`home.distrust`: our folders, 0700, no symbolic link, nothing above it another user could
replace) and only from files of ours; elsewhere kolibri's functions compile in memory
(`distrusted` says why), and a file of another user's in our root is a miss (replaced).
"""

import contextlib
import hashlib
import inspect
import io
import os
import pickle
import stat
import sys
from functools import lru_cache
from pathlib import Path

import llvmlite
import numba
from numba.core import caching, dispatcher
from numba.core.runtime import nrtdynmod

from kolibri_cli.home import cache_root, distrust, make_private

PACKAGE = Path(__file__).resolve().parents[1]  # kolibri_cli/


def cache_dir(source: Path) -> Path:
    """The folder numba caches the compiled functions of `source` in: under the kolibri cache
    root, one folder per package and version of that package's sources.

    numba checks a cached function against its own file only. A kernel inlines the functions it
    calls from sibling modules, so after an upgrade that changed only attention.py, numba would
    keep serving the old attention inside the kernel. Keying the folder by every source of the
    package (and by numba, llvmlite, bounds checking and KOLIBRI_SIMD, which numba's index
    ignores too: a portable build must not serve an AVX-512 one) makes any change a fresh
    folder. Compiled code may only call compiled code of its own package. `NUMBA_CACHE_DIR`, when
    set, holds these folders: numba's own keying there served a stale int16 tile inside matmul
    after int16.py changed, and those logits were wrong by 30."""
    package = Path(source).resolve().parent
    name = package.relative_to(PACKAGE).as_posix().replace("/", ".")
    key = _sources_key(package, numba.config.BOUNDSCHECK, os.environ.get("KOLIBRI_SIMD", ""))
    return numba_root() / f"{name}-{key}"


def numba_root() -> Path:
    """The folder kolibri's compiled code is cached under (NUMBA_CACHE_DIR when set)"""
    return Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else cache_root() / "numba"


def distrusted() -> str | None:
    """Why compiled code under `numba_root` is not loaded (another user could have written it),
    or None."""
    return distrust(numba_root(), _trusted_top())


def _read_own(path) -> bytes | None:
    """The bytes of `path` when it is a regular file of ours that only we can write (opened
    without following a symbolic link, nor waiting on a FIFO); None when absent or not ours."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        ours = st.st_uid == os.geteuid() and not st.st_mode & 0o022
        return f.read() if stat.S_ISREG(st.st_mode) and ours else None


@lru_cache
def _sources_key(package: Path, boundscheck, simd: str) -> str:
    h = hashlib.sha256(
        f"{numba.__version__} {llvmlite.__version__} {boundscheck} {simd}".encode())
    for path in sorted(package.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


class _KolibriCacheLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """numba cache locator for kolibri's own files: `cache_dir`, never the package folder (a
    read-only install must work) nor numba's user-wide folder."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = str(cache_dir(Path(py_file)))

    def get_cache_path(self):
        return self._cache_path

    def ensure_cache_path(self):
        make_private(Path(self._cache_path))
        super().ensure_cache_path()


class _OwnFiles(caching.IndexDataCacheFile):
    """numba's index and data files, unpickled only when they are files of ours (`_read_own`);
    another's is a miss, replaced by the next save."""

    def _load_index(self):
        data = _read_own(self._index_path)
        if data is None:
            return {}
        stream = io.BytesIO(data)
        if pickle.load(stream) != self._version:
            return {}
        stamp, overloads = pickle.loads(stream.read())
        return overloads if stamp == self._source_stamp else {}

    def _load_data(self, name):
        data = _read_own(self._data_path(name))
        if data is None:
            raise FileNotFoundError(name)  # a miss to `load`
        return pickle.loads(data)

    @contextlib.contextmanager
    def _open_for_write(self, filepath):
        """numba's temporary-and-rename, the file made 0600 whatever the umask (a group-writable
        file is not ours alone, and would not be loaded)."""
        tmp = f"{filepath}.tmp.{os.urandom(8).hex()}"
        try:
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                yield f
            os.replace(tmp, filepath)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class _KolibriCacheImpl(caching.CompileResultCacheImpl):
    """numba's cache of compiled functions with kolibri's locator as the only one: neither
    numba's list of locators nor NUMBA_CACHE_LOCATOR_CLASSES is consulted."""

    def __init__(self, py_func):
        source = inspect.getfile(py_func)
        self._lineno = py_func.__code__.co_firstlineno
        self._locator = _KolibriCacheLocator(py_func, source)
        fullname = f"{Path(source).stem}.{py_func.__qualname__}"
        self._filename_base = self.get_filename_base(fullname, getattr(sys, "abiflags", ""))


class _KolibriCache(caching.FunctionCache):
    _impl_class = _KolibriCacheImpl

    def __init__(self, py_func):
        super().__init__(py_func)
        plain = self._cache_file
        self._cache_file = _OwnFiles(plain._cache_path, plain._index_name[:-len(".nbi")],
                                     plain._source_stamp)

    # numba raises an unreadable or unwritable cache folder (a full disk, a path that became a
    # file, a folder another user made) on POSIX: a load that fails is a miss, and a save that
    # fails (the compiled code is in memory already) turns this function's cache off for the run.

    def load_overload(self, sig, target_context):
        try:
            return super().load_overload(sig, target_context)
        except OSError:
            return None

    def save_overload(self, sig, data):
        try:
            super().save_overload(sig, data)
        except OSError:
            self.disable()


def in_memory(function) -> bool:
    """Whether a kolibri function compiles in memory in every process: no cache folder of its
    own could be made (see `_enable_caching`)."""
    return isinstance(getattr(function, "_cache", None), caching.NullCache)


_numba_enable_caching = dispatcher.Dispatcher.enable_caching


def _enable_caching(self) -> None:
    """`cache=True` for a kolibri function: its keyed folder, without making it (numba makes it
    when it saves a compile, so importing kolibri — a read-only command — writes nothing); where
    that folder cannot be made or is not ours (`distrust`), numba's null cache (compiled in
    memory, every process)."""
    source = Path(inspect.getfile(self.py_func)).resolve()
    if not source.is_relative_to(PACKAGE):
        _numba_enable_caching(self)  # other code keeps numba's rules
    elif _could_make(folder := cache_dir(source)) and not distrust(folder, _trusted_top()):
        self._cache = _KolibriCache(self.py_func)


def _trusted_top() -> Path:
    return Path(numba.config.CACHE_DIR or cache_root())


def _could_make(folder: Path) -> bool:
    """Whether `folder` exists writable or could be made: its nearest existing ancestor is a
    writable folder."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def _use_kolibri_cache() -> None:
    dispatcher.Dispatcher.enable_caching = _enable_caching


def _nrt_file(codegen, ir_module) -> Path:
    """The cached runtime's file: keyed by its IR, numba, llvmlite and the CPU it targets."""
    h = hashlib.sha256(repr((numba.__version__, llvmlite.__version__, codegen.magic_tuple(),
                             numba.config.OPT)).encode() + str(ir_module).encode())
    return numba_root() / f"nrt-{h.hexdigest()[:16]}.pkl"


def compile_nrt_functions(ctx):
    """numba's runtime (a few refcount and atomic functions), from our cache once compiled.

    numba compiles it with LLVM in every process that runs compiled code, even when every kernel
    comes from its disk cache, and that one compile faults ~27 MB of LLVM's optimizer and code
    generator into memory for the whole run. Loading it as object code, like the kernels, does
    not. Unreadable, absent or not ours: compiled as numba does, then kept (when the folder is
    writable and ours)."""
    ir_module, library = nrtdynmod.create_nrt_module(ctx)
    path = _nrt_file(ctx.codegen(), ir_module)
    trusted = distrusted() is None
    if trusted and (data := _read_own(path)) is not None:
        try:
            return ctx.codegen().unserialize_library(pickle.loads(data))
        except Exception:  # a damaged file: compile afresh below, and replace it
            ir_module, library = nrtdynmod.create_nrt_module(ctx)
    library.enable_object_caching()
    library.add_ir_module(ir_module)
    library.finalize()
    if trusted:
        _write(path, pickle.dumps(library.serialize_using_object_code()))
    return library


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        make_private(path.parent)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(data)
        tmp.replace(path)
    except OSError:  # a read-only cache: numba's own cost each run, nothing worse
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _cache_nrt() -> None:
    if callable(getattr(nrtdynmod, "create_nrt_module", None)):  # else numba moved: its rules
        nrtdynmod.compile_nrt_functions = compile_nrt_functions


_use_kolibri_cache()
_cache_nrt()
