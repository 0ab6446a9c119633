"""numba's on-disk cache of the kernel: where it lives, what it is keyed by, and that a kernel
compiled from cached parts runs when loaded in a later process."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kolibri_cli.engine import jitcache

PACKAGE = Path(jitcache.__file__).resolve().parents[1]

# One forward of a tiny random model. argv[1] "readonly": a read-only embedding buffer and final
# norm, which numba types differently (memory-mapped weights are read-only), while every
# parallel part of the kernel sees the same types as before.
FORWARD = """
import hashlib, sys
import numpy as np
from kolibri_cli.engine.config import ModelConfig
from kolibri_cli.engine.kernel import Transformer
from kolibri_cli.engine.weights import random_weights
c = ModelConfig(vocab_size=97, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=8)
w = random_weights(c, seed=1, scale=0.3)
if sys.argv[1] == "readonly":
    w.embed.data.flags.writeable = w.norm.flags.writeable = False
tf = Transformer(c, w)
logits = tf.forward([3, 1, 4, 1, 5], 0, tf.new_cache(8))
print(hashlib.sha256(logits.tobytes()).hexdigest())
"""


# Prepended to FORWARD: counts what the process compiles with LLVM (numba functions and numba's
# runtime finalize a code library each; loading one from a cache does not).
COUNT_COMPILES = """
from numba.core import codegen
compiled = []
_finalize = codegen.CPUCodeLibrary.finalize
codegen.CPUCodeLibrary.finalize = lambda self: compiled.append(self.name) or _finalize(self)
"""


def run_python(code: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=os.environ | env, timeout=900)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The forward in four processes sharing a fresh KOLIBRI_HOME: compile and cache; a second
    weight type, compiled around the cached parts; that second kernel loaded from the cache,
    twice (the last one counting what it compiles)."""
    home = tmp_path_factory.mktemp("home")
    env = {"KOLIBRI_HOME": str(home), "NUMBA_CACHE_DIR": ""}
    before = set(PACKAGE.rglob("*.nb[ic]"))
    runs = [run_python(FORWARD, kind, env=env) for kind in ("writable", "readonly", "readonly")]
    runs.append(run_python(COUNT_COMPILES + FORWARD + "print(compiled)", "readonly", env=env))
    return home, runs, before


def test_kernel_compiled_from_cached_parts_runs_from_the_cache(runs):
    """A second weight type compiles a new kernel around parallel parts numba loads from its
    cache; numba saves that kernel without the hook that starts its thread pool, so loading it in
    a fresh process crashed with SIGSEGV (first seen as a Qwen3 folder after the default model)."""
    _, runs, _ = runs
    assert [r.returncode for r in runs] == [0, 0, 0, 0], runs[-1].stderr[-2000:]
    assert len({r.stdout.split()[0] for r in runs}) == 1  # and the same logits, bit for bit


def test_a_warm_process_compiles_nothing(runs):
    """Every compile, even a small one, faults tens of MB of LLVM and numba's compiler into the
    process for the rest of the run: with warm caches, building the model (its typed List of
    layers) and numba's runtime (its refcount functions) load compiled code, like the kernel."""
    _, runs, _ = runs
    assert runs[-1].returncode == 0, runs[-1].stderr[-2000:]
    assert runs[-1].stdout.split()[1:] == ["[]"]


def test_damaged_runtime_cache_is_compiled_again_and_replaced(runs):
    home, done, _ = runs
    [nrt] = (home / "numba").glob("nrt-*.pkl")
    nrt.write_bytes(b"not a pickle")
    out = run_python(COUNT_COMPILES + FORWARD + "print(compiled)", "readonly",
                     env={"KOLIBRI_HOME": str(home), "NUMBA_CACHE_DIR": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == done[0].stdout.split()[0]
    assert out.stdout.split()[1:] == ["['nrt']"] and nrt.read_bytes() != b"not a pickle"


def test_cache_lives_under_kolibri_home_not_the_package(tmp_path):
    code = ("from kolibri_cli.engine import kernel; "
            "print(kernel._forward._cache.cache_path)")
    out = run_python(code, env={"KOLIBRI_HOME": str(tmp_path), "NUMBA_CACHE_DIR": ""})
    path = Path(out.stdout.strip())
    assert path.parent == tmp_path / "numba" and path.name.startswith("engine-")
    proposers = run_python("from kolibri_cli.decode.proposers import ngram; "
                           "print(ngram.longest_match._cache.cache_path)",
                           env={"KOLIBRI_HOME": str(tmp_path), "NUMBA_CACHE_DIR": ""})
    assert Path(proposers.stdout.strip()).parent == tmp_path / "numba"


# The cache folders of a module's own compiled functions, the module imported first thing.
CACHE_PATHS = """
import importlib, sys
module = importlib.import_module(sys.argv[1])
for obj in vars(module).values():
    if getattr(obj, "__module__", None) == module.__name__ and hasattr(obj, "_cache"):
        print(obj._cache.cache_path)
"""
COMPILING = sorted(".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts)
                   for p in PACKAGE.rglob("*.py")
                   if re.search(r"^@njit\(.*cache=True", p.read_text(), re.MULTILINE))


@pytest.mark.parametrize("module", COMPILING)
def test_every_compiled_function_caches_under_kolibri_home(tmp_path, module):
    """numba picks a function's cache folder when its decorator runs: a module that defines
    compiled code before jitcache is imported caches beside its sources, whichever module a
    process happens to import first."""
    out = run_python(CACHE_PATHS, module,
                     env={"KOLIBRI_HOME": str(tmp_path), "NUMBA_CACHE_DIR": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    paths = [Path(line) for line in out.stdout.splitlines()]
    assert paths and all(p.parent == tmp_path / "numba" for p in paths), out.stdout


def test_numba_cache_dir_set_by_the_user_wins_and_is_keyed_by_the_sources(tmp_path):
    """NUMBA_CACHE_DIR moves the cache, not its keying: numba's own index there checks a function
    against its own file only, and served matmul with the int16 tiles inlined from an older
    int16.py (logits off by 30)."""
    code = "from kolibri_cli.engine import kernel; print(kernel._forward._cache.cache_path)"
    out = run_python(code, env={"KOLIBRI_HOME": str(tmp_path / "home"),
                                "NUMBA_CACHE_DIR": str(tmp_path / "numba")})
    home = run_python(code, env={"KOLIBRI_HOME": str(tmp_path / "home"), "NUMBA_CACHE_DIR": ""})
    moved, native = Path(out.stdout.strip()), Path(home.stdout.strip())
    assert moved.parent == tmp_path / "numba" and native.parent == tmp_path / "home" / "numba"
    assert moved.name == native.name and moved.name.startswith("engine-")


def test_bounds_checked_builds_get_their_own_folder(tmp_path):
    """numba's index ignores NUMBA_BOUNDSCHECK: without its own folder, a checked run would be
    served the unchecked build."""
    code = "from kolibri_cli.engine import kernel; print(kernel._forward._cache.cache_path)"
    env = {"KOLIBRI_HOME": str(tmp_path), "NUMBA_CACHE_DIR": ""}
    plain = run_python(code, env=env | {"NUMBA_BOUNDSCHECK": ""}).stdout
    checked = run_python(code, env=env | {"NUMBA_BOUNDSCHECK": "1"}).stdout
    assert plain.strip() and checked.strip() and plain != checked


def test_folder_changes_with_any_source_of_the_package(tmp_path, monkeypatch):
    """A kernel inlines its callees from sibling modules: editing only attention.py must not let
    numba serve the kernel compiled against the old one."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "kernel.py").write_text("def forward(): pass\n")
    (package / "attention.py").write_text("def attend(): pass\n")
    before = jitcache._sources_key(package, None, "")
    (package / "attention.py").write_text("def attend(): return 1\n")
    jitcache._sources_key.cache_clear()
    assert jitcache._sources_key(package, None, "") != before
    assert jitcache._sources_key(package, 1, "") != jitcache._sources_key(package, None, "")


def test_portable_simd_gets_its_own_folder(monkeypatch):
    """KOLIBRI_SIMD=portable compiles other code (no table lookups): never the AVX-512 build's
    cached kernels (numba's index keys the CPU, not our environment variable)."""
    source = jitcache.PACKAGE / "engine" / "blocks.py"
    monkeypatch.delenv("KOLIBRI_SIMD", raising=False)
    native = jitcache.cache_dir(source)
    monkeypatch.setenv("KOLIBRI_SIMD", "portable")
    assert jitcache.cache_dir(source) != native
    assert jitcache.cache_dir(source).parent == native.parent


def test_package_folder_gets_no_cache_files(runs):
    """A read-only install must work: nothing is written beside the sources."""
    home, _, before = runs
    assert set(PACKAGE.rglob("*.nb[ic]")) == before
    assert list((home / "numba").glob("engine-*/kernel._forward-*.nbi"))
    assert list((home / "numba").glob("nrt-*.pkl"))


def test_a_read_only_command_writes_nothing_in_a_new_home(tmp_path):
    """Importing compiled code does not make its cache folder (numba makes it when it saves a
    compile): `kolibri model list` on a new KOLIBRI_HOME leaves no folder behind, and the first
    compile still caches under the home."""
    home = tmp_path / "home"
    env = {"KOLIBRI_HOME": str(home), "NUMBA_CACHE_DIR": ""}
    out = run_python("from kolibri_cli.cli import app; app(['model', 'list'])", env=env)
    assert "no models in" in out.stdout + out.stderr, out.stderr[-2000:]
    assert not home.exists(), sorted(home.rglob("*"))
    saved = run_python("from kolibri_cli.decode.proposers import ngram; ngram.warm_up(); "
                       "print(ngram.longest_match._cache.cache_path)", env=env)
    assert saved.returncode == 0, saved.stderr[-2000:]
    assert list(Path(saved.stdout.strip()).glob("*.nbi"))


# A small compiled function of kolibri compiled and run, then the kind of cache it got.
PROPOSER = ("from kolibri_cli.decode.proposers import ngram; ngram.warm_up(); "
            "print(type(ngram.longest_match._cache).__name__)")


def _new_cache_files(tmp_path, before) -> set[Path]:
    """Cache files numba wrote beside the sources (removed again) or anywhere under tmp_path."""
    beside = set(PACKAGE.rglob("*.nb[ic]")) - before
    for path in beside:
        path.unlink()
    return beside | set(tmp_path.rglob("*.nb[ic]"))


def test_no_keyed_folder_compiles_in_memory(tmp_path):
    """Where the cache root cannot be made (below a file here; read-only alike), kolibri's
    functions compile in memory: numba's own folders (beside the sources, ~/.cache/numba) check a
    function against its own file only, and served matmul with stale int16 tiles after an
    upgrade; no folder in /tmp either (another user could plant compiled code there)."""
    (tmp_path / "file").write_text("")
    before = set(PACKAGE.rglob("*.nb[ic]"))
    out = run_python(PROPOSER, env={"KOLIBRI_HOME": str(tmp_path / "file" / "home"),
                                    "NUMBA_CACHE_DIR": "", "HOME": str(tmp_path / "user"),
                                    "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    written = _new_cache_files(tmp_path, before)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["NullCache"] and not written, written


def test_numba_cache_locator_classes_do_not_move_kolibris_cache(tmp_path):
    """NUMBA_CACHE_LOCATOR_CLASSES set by a user picks numba's locators for other code; kolibri's
    functions still cache in their keyed folder only."""
    before = set(PACKAGE.rglob("*.nb[ic]"))
    out = run_python(PROPOSER, env={"KOLIBRI_HOME": str(tmp_path / "home"), "NUMBA_CACHE_DIR": "",
                                    "NUMBA_CACHE_LOCATOR_CLASSES": "InTreeCacheLocator"})
    written = _new_cache_files(tmp_path, before)
    assert out.returncode == 0, out.stderr[-2000:]
    assert written and all(p.parent.parent == tmp_path / "home" / "numba" for p in written)


# The cache root turns into a file after import (a full disk or another user's folder alike):
# numba raises the failed save after its compile; the run goes on, compiled in memory.
SAVE_FAILS = ("import os; from pathlib import Path; "
              "from kolibri_cli.decode.proposers import ngram; "
              "Path(os.environ['KOLIBRI_HOME']).write_text(''); ngram.warm_up(); "
              "c = ngram.longest_match._cache; print(type(c).__name__, c._enabled)")


def test_a_failed_cache_write_is_not_a_crash(tmp_path):
    out = run_python(SAVE_FAILS, env={"KOLIBRI_HOME": str(tmp_path / "home"),
                                      "NUMBA_CACHE_DIR": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["_KolibriCache", "False"]


def test_a_kernel_compiled_in_memory_is_not_called_compiled(tmp_path):
    """Where no cache folder can be made the kernel compiles on every run: load_model says so
    instead of staying silent as if it were cached."""
    (tmp_path / "file").write_text("")
    code = ("from kolibri_cli.engine import kernel; "
            "print(kernel.compiles_in_memory(), kernel.is_compiled())")
    for home, says in ((tmp_path / "file" / "home", ["True", "False"]),
                       (tmp_path / "home", ["False", "False"])):
        out = run_python(code, env={"KOLIBRI_HOME": str(home), "NUMBA_CACHE_DIR": ""})
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == says


# ---------------------------------------------------------------- roots trusted only when ours

# A pickle that makes the folder named by argv[1] when unpickled: planted code that ran.
PLANT = ("import os, pickle, sys\n"
         "class Run:\n"
         "    def __reduce__(self): return (os.mkdir, (sys.argv[1],))\n"
         "sys.stdout.buffer.write(pickle.dumps(Run()))\n")
OTHER_UID = 65534  # nobody: a file another user planted


def _planted(tmp_path) -> bytes:
    return subprocess.run([sys.executable, "-c", PLANT, str(tmp_path / "ran")],
                          capture_output=True, check=True).stdout


def _cached_home(tmp_path) -> tuple[Path, dict]:
    """A home whose numba folder holds the proposer's compiled code and numba's runtime."""
    home = tmp_path / "home"
    env = {"KOLIBRI_HOME": str(home), "NUMBA_CACHE_DIR": ""}
    out = run_python(PROPOSER, env=env)
    assert out.returncode == 0 and out.stdout.split() == ["_KolibriCache"], out.stderr[-2000:]
    assert list((home / "numba").glob("nrt-*.pkl")) and list((home / "numba").rglob("*.nbi"))
    return home, env


def _plant(home: Path, payload: bytes, uid: int, runtime: bool = True) -> list[Path]:
    files = [*(home / "numba").glob("nrt-*.pkl")] if runtime else []
    files += (home / "numba").rglob("*.nb[ic]")
    for path in files:
        path.write_bytes(payload)
        os.chown(path, uid, -1)
    return files


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@needs_root
def test_a_file_another_user_planted_in_our_root_is_not_loaded(tmp_path):
    """numba unpickles its index and data files and kolibri its runtime's file: a pickle of
    another user's under the keyed names (the same in every root, so computable) ran as us."""
    home, env = _cached_home(tmp_path)
    files = _plant(home, _planted(tmp_path), OTHER_UID)
    out = run_python(PROPOSER, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not (tmp_path / "ran").exists()
    assert out.stdout.split() == ["_KolibriCache"]  # the root is ours: compiled, then replaced
    assert all(p.stat().st_uid == os.geteuid() for p in files if p.exists())


@needs_root
@pytest.mark.parametrize("case", ["root of another user", "keyed folder of another user",
                                  "root writable by others", "root a symbolic link",
                                  "parent writable by others"])
def test_compiled_code_is_not_loaded_from_a_root_that_is_not_ours(tmp_path, case):
    """Where another user could have written the cache (their folder, a folder anyone may write,
    a link they may point elsewhere), kolibri's functions compile in memory: even our own files
    there are not loaded, and `distrusted` says why."""
    home, env = _cached_home(tmp_path)
    # numba's runtime lives in the root: ours there, and loaded, when only a keyed folder is not
    _plant(home, _planted(tmp_path), os.geteuid(), runtime=case != "keyed folder of another user")
    numba_dir = home / "numba"
    if case == "root of another user":
        os.chown(numba_dir, OTHER_UID, -1)
    elif case == "keyed folder of another user":
        for folder in numba_dir.iterdir():
            os.chown(folder, OTHER_UID, -1) if folder.is_dir() else None
    elif case == "root writable by others":
        numba_dir.chmod(0o777)
    elif case == "root a symbolic link":
        numba_dir.rename(tmp_path / "elsewhere")
        numba_dir.symlink_to(tmp_path / "elsewhere")
    else:
        home.chmod(0o777)
    code = ("from kolibri_cli.engine import jitcache\n" + PROPOSER.replace("; ", "\n")
            + "\nprint(jitcache.distrusted() is not None)")
    out = run_python(code, str(tmp_path / "ran"), env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert not (tmp_path / "ran").exists()
    assert out.stdout.split()[0] == "NullCache"
    if case != "keyed folder of another user":  # the root itself is fine there
        assert out.stdout.split()[1] == "True"


def test_a_private_temporary_root_is_trusted(tmp_path):
    """CI's NUMBA_CACHE_DIR is `mktemp -d` (0700, ours, in the sticky /tmp): compiled code is
    cached and loaded there."""
    import tempfile
    root = Path(tempfile.mkdtemp(dir=tmp_path))
    out = run_python(PROPOSER, env={"KOLIBRI_HOME": str(tmp_path / "home"),
                                    "NUMBA_CACHE_DIR": str(root)})
    assert out.returncode == 0 and out.stdout.split() == ["_KolibriCache"], out.stderr[-2000:]
    assert list(root.rglob("*.nbi"))


def test_folders_kolibri_makes_are_private(tmp_path):
    home, _ = _cached_home(tmp_path)
    folders = [home, home / "numba", *(p for p in (home / "numba").iterdir() if p.is_dir())]
    assert len(folders) > 2 and {p.stat().st_mode & 0o777 for p in folders} == {0o700}
    files = [*(home / "numba").glob("nrt-*.pkl"), *(home / "numba").rglob("*.nb[ic]")]
    assert {p.stat().st_mode & 0o777 for p in files} == {0o600}


def test_a_cache_its_group_may_write_is_one_warning_with_the_fix(tmp_path, monkeypatch):
    """~/.cache of mode 775 (a umask of 002) makes every run compile in memory: the run says so
    once, naming the folder and the chmod that ends it, and says nothing once it is fixed."""
    from typer.testing import CliRunner

    from kolibri_cli.cli import app
    from kolibri_cli.home import compiled_cache

    home = tmp_path / "user"
    (home / ".cache").mkdir(parents=True)
    (home / ".cache").chmod(0o775)
    for name in ("KOLIBRI_HOME", "XDG_CACHE_HOME", "NUMBA_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
    assert compiled_cache() == (home / ".cache" / "kolibri" / "numba", home / ".cache" / "kolibri")
    r = CliRunner().invoke(app, ["model", "list", "--json"])
    assert r.exit_code == 0, r.output
    warnings = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [line for line in r.stderr.splitlines() if str(home) in line]
    assert len(warnings) == 1 and warnings[0].startswith(f"warning: {home / '.cache'} can be "
                                                         "written by other users")
    assert warnings[0].endswith(f"compiles its kernels in memory on every run (slow); fix: "
                                f"chmod g-w {home / '.cache'}")
    (home / ".cache").chmod(0o755)
    r = CliRunner().invoke(app, ["model", "list", "--json"])
    assert r.exit_code == 0 and "warning:" not in r.stderr, r.output


def test_the_warnings_cache_is_the_one_numba_uses():
    """home.compiled_cache says, without numba, what jitcache gives numba (this process's
    NUMBA_CACHE_DIR: the test session's)."""
    from kolibri_cli.engine import jitcache
    from kolibri_cli.home import compiled_cache

    assert compiled_cache() == (jitcache.numba_root(), jitcache._trusted_top())
